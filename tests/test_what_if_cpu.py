"""What-if's pieces for a real server in the lab: the CPU device's step costs against the
steps measured on vLLM's CPU build (tests/data/cpu-step-costs.json), the KV-blocks lever,
the fit that keeps stepping when one ratio overshoots, and the experiment files."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from diagnoser.catalog.levers import LeverError, parse_lever
from diagnoser.hardware import presets
from diagnoser.whatif.calibrate import CLOSE_ENOUGH, MAX_REPLAYS, Fitting
from diagnoser.whatif.fit import EngineCache, Fit
from diagnoser.whatif.levers import turn
from diagnoser.whatif.replay import Config, baseline, kv_dtype_bytes
from diagnoser.whatif.setup import vllm_defaults
from diagnoser.whatif.stats import LogNormal
from lab.real import stepcosts
from lab.real import whatif as lab
from lab.real.incident import IncidentError

HERE = Path(__file__).resolve().parent
# Every measured step priced within this ratio of its measurement: a CPU's steps vary with
# what else the cores run, and one device's preset serves two models 160 times apart.
LOW, HIGH = 0.6, 1.5


def test_the_cpu_device_prices_the_measured_steps_of_both_models():
    priced = stepcosts.price()
    assert {p.model for p in priced} == {"tiny (1.8 M)", "296 M"}
    assert {p.kind for p in priced} == {"prefill", "decode"}
    out = [p for p in priced if not LOW <= p.ratio <= HIGH]
    assert not out, "priced / measured out of bounds:\n" + "\n".join(stepcosts.table(priced))


def test_a_gpus_costs_would_not_price_the_cpu_steps():
    """The check can fail: an L40S's speeds and overheads price these steps far off."""
    priced = stepcosts.price(device="L40S")
    assert sum(not LOW <= p.ratio <= HIGH for p in priced) > len(priced) // 2


def test_the_table_on_disk_is_what_the_lab_measures():
    doc = json.loads((HERE / "data" / "cpu-step-costs.json").read_text())
    for m in doc["models"]:
        assert all(t > 0 for _, t in m["prefill"]) and all(t > 0 for *_, t in m["decode"])
        # More tokens, more time: the table is not noise.
        assert m["prefill"][-1][1] > 2 * m["prefill"][0][1]
        assert m["decode"][-1][2] > m["decode"][0][2]


def test_vllms_cpu_build_has_scheduler_defaults_of_its_own():
    assert vllm_defaults(presets.gpu("CPU")) == (128, 2048)
    big = dataclasses.replace(presets.gpu("H200"), memory_bytes=180 * presets.GIB)
    assert vllm_defaults(big) == (1024, 16384)


def test_an_auto_kv_cache_takes_the_models_type():
    tiny = _setup().spec
    assert kv_dtype_bytes("auto", tiny) == 4
    assert kv_dtype_bytes("auto", presets.model("llama-2-7b")) == 2
    assert kv_dtype_bytes("fp8_e4m3", tiny) == 1


def _setup():
    return lab.setup(lab.find("kv-room"))


def _fit(blocks: int = 100, block: int = 32) -> Fit:
    return Fit(
        model="tiny-llama", start=0.0, end=600.0, rate_step=60.0, rates=np.full(10, 1.0),
        prompt=LogNormal(32, 0.3), output=LogNormal(150, 0.3), length_share=0.0,
        prefix_hit=None, instances=1, engines=1,
        cache=EngineCache(blocks, block, 0.1, "auto", True), measured=None,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize(("change", "blocks"), [("x2", 200), ("x0.8", 80), ("77", 77), ("+5", 105)])
def test_the_kv_blocks_lever_gives_exactly_the_blocks_asked(change, blocks):
    setup, fit = _setup(), _fit()
    today, _ = baseline(fit, setup)
    assert today.engine.num_gpu_blocks(setup.spec, setup.gpu) == 100
    turned, said = turn(parse_lever(f"num_gpu_blocks:{change}"), today, fit, setup)
    assert turned.engine.num_gpu_blocks(setup.spec, setup.gpu) == blocks
    assert said == f"100 -> {blocks}"


def test_too_few_blocks_for_one_sequence_is_refused():
    setup, fit = _setup(), _fit()
    today, _ = baseline(fit, setup)
    with pytest.raises(LeverError, match="would not start"):
        turn(parse_lever("num_gpu_blocks:20"), today, fit, setup)  # 640 tokens < 1,024


def _queue_like(factor: float) -> float:
    """A median that answers the speed more than in proportion: a queue that grows without
    bound as the speed falls to 0.3x."""
    return 0.05 / factor + 0.02 / max(factor - 0.3, 0.01)


@pytest.mark.parametrize("truth", [0.6, 0.8, 1.6])
def test_the_fit_keeps_stepping_where_the_first_ratio_overshoots(truth):
    setup = _setup()
    today = Config(baseline(_fit(), setup)[0].engine, 1, 512)
    want = {"ttft_p50": _queue_like(truth), "itl_mean": 0.03 / truth}
    fitting = Fitting(today, setup.gpu, want)
    at: tuple[float, float] = (1.0, 1.0)
    firsts = []
    while True:
        got = {"ttft_p50": _queue_like(at[0]), "itl_mean": 0.03 / at[1]}
        step = fitting.next(at, got)
        firsts.append(at)
        if step is None:
            break
        at = step
    assert fitting.replays <= MAX_REPLAYS
    assert abs(_queue_like(at[0]) / want["ttft_p50"] - 1) <= CLOSE_ENOUGH
    assert at[1] == pytest.approx(truth, rel=0.02)
    if truth < 0.7:  # the ratio alone (the first step) would have missed by more than that
        first = firsts[1][0]
        assert abs(_queue_like(first) / want["ttft_p50"] - 1) > CLOSE_ENOUGH


def test_a_fit_held_at_its_bound_stops():
    setup = _setup()
    today = Config(baseline(_fit(), setup)[0].engine, 1, 512)
    fitting = Fitting(today, setup.gpu, {"ttft_p50": 10.0, "itl_mean": 0.03})
    step = fitting.next((1.0, 1.0), {"ttft_p50": 0.1, "itl_mean": 0.03})
    assert step == (0.25, 1.0)
    assert fitting.next(step, {"ttft_p50": 0.4, "itl_mean": 0.03}) is None
    assert fitting.replays == 2


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


BASE = """\
server: [--max-model-len, "1024"]
load: {rate: 1.0}
levers:
"""


@pytest.mark.parametrize(
    ("levers", "says"),
    [
        ("  - lever: warp:+1\n", "unknown lever 'warp'"),
        ("  - lever: max_num_seqs:8\n", "needs flags to restart with"),
        ("  - lever: max_tokens:100\n    args: [--x]\n", "needs a load, not flags"),
        ("  - 3\n", "must be a mapping with a lever"),
        (
            "  - lever: max_tokens:9\n    load: {max_tokens: 9}\n" * 2,
            "max_tokens:9 is listed twice",
        ),
    ],
)
def test_a_bad_experiment_file_says_which_field(tmp_path, levers, says):
    with pytest.raises(IncidentError, match=says):
        lab.load(_write(tmp_path, BASE + levers))


def test_a_flag_what_if_reads_must_be_a_number(tmp_path):
    text = (
        BASE.replace('"1024"', '"lots"')
        + "  - lever: max_tokens:100\n    load: {max_tokens: 100}\n"
    )
    with pytest.raises(IncidentError, match="--max-model-len must be a whole number"):
        lab.load(_write(tmp_path, text))


def test_an_experiment_needs_levers_and_a_model_of_whole_sizes(tmp_path):
    with pytest.raises(IncidentError, match="levers"):
        lab.load(_write(tmp_path, BASE))
    text = (
        BASE + "  - lever: max_tokens:100\n    load: {max_tokens: 100}\nmodel: {hidden_size: 1.5}\n"
    )
    with pytest.raises(IncidentError, match="model"):
        lab.load(_write(tmp_path, text))


def test_each_experiments_flags_are_its_levers_applied_to_today():
    """A lever's flags in the file are what what-if's change says: the run tests the lever it
    names."""
    for name in lab.names():
        e = lab.find(name)
        setup = lab.setup(e)
        blocks = e.flag("--num-gpu-blocks-override", None)
        assert blocks is not None
        fit = _fit(blocks, e.flag("--block-size", 16) or 16)
        today, _ = baseline(fit, setup)
        today = dataclasses.replace(today, max_tokens=e.load.max_tokens)
        for t in e.trials:
            _, said = turn(t.lever, today, fit, setup)
            new = said.split(" -> ")[1].replace(",", "")
            if t.args:
                assert t.args[-1] == new, (t.lever.text, t.args, said)
            else:
                assert t.load is not None and str(t.load.max_tokens) == new
        assert not math.isnan(e.window) and e.window >= 240


def test_dtype_sets_the_weights_width_except_where_they_are_quantized():
    bf16 = presets.model("llama-2-7b")
    assert bf16.served_as("float32").dtype_bytes == 4
    assert bf16.served_as("float32").served_as("bfloat16").dtype_bytes == 2
    assert bf16.served_as("auto") is bf16
    fp8 = dataclasses.replace(bf16, dtype_bytes=1)  # an fp8 checkpoint
    four_bit = dataclasses.replace(bf16, dtype_bytes=0.5)
    for quantized in (fp8, four_bit):
        for dtype in ("bfloat16", "float16", "float32"):
            served = quantized.served_as(dtype)
            assert served.dtype_bytes == quantized.dtype_bytes  # the weights as quantized
            assert served.dtype == dtype  # the compute type, and an auto KV cache's
