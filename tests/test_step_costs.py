"""The simulator's step costs track step times measured on an H200 (tests/data/gpu-step-costs.json):
every prefill and decode step is priced at 1.0x-1.5x its measurement (those are lower bounds
for a serving engine), every mixed step at 1/1.5x-1.5x."""

from __future__ import annotations

import pytest

from diagnoser.sim.engine import EngineConfig
from lab import calibration


@pytest.fixture(scope="module")
def rows() -> list[calibration.Row]:
    return calibration.load()


def test_the_table_has_every_kind_of_step(rows):
    kinds = {r.kind for r in rows}
    assert kinds == {"prefill", "decode", "mixed"}
    assert len(rows) == 31


def test_every_measured_step_is_priced_within_its_bounds(rows):
    priced = calibration.price(rows)
    out = [p for p in priced if not p.within]
    assert not out, "simulated / measured out of bounds:\n" + "\n".join(calibration.table(priced))


def test_the_bounds_reject_the_uncalibrated_model(rows):
    """The check can fail: the previous defaults (MFU 0.4, MBU 0.7, 3 ms a step) priced
    these steps up to 2x their measurement."""
    old = EngineConfig(mfu=0.4, mbu=0.7, step_overhead=0.003, step_overhead_per_seq=0.0)
    priced = calibration.price(rows, calibration.reference_engine(old))
    assert sum(not p.within for p in priced) > len(rows) // 2


def test_a_chunk_adds_its_compute_to_the_decodes_kv_reads():
    engine = calibration.reference_engine()
    n, ctx, chunk = 32, 2048, 2048
    attn = engine.attention_flops(0, chunk)
    decodes = engine.decode_step_time(n, n * ctx)
    prefill = engine.mixed_step_time(0, 0, chunk, attn)
    mixed = engine.mixed_step_time(n, n * ctx, chunk, attn)
    kv_read = n * ctx * engine.costs.kv_bytes_per_token / engine.costs.bandwidth
    assert mixed > prefill + 0.9 * kv_read
    assert mixed > decodes
