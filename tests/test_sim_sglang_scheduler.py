"""The simulated SGLang scheduler: each prefill batch runs alone, before the decode step, so a
long prompt stalls every running stream for all of its chunks; admission keeps room for the
running requests' output (new_token_ratio). And vLLM's, whose chunks share steps with the
decodes, the last one costing only the tokens it carries."""

from __future__ import annotations

import dataclasses

import pytest

from diagnoser.hardware.presets import gpu, model
from diagnoser.sim.engine import Engine, EngineConfig, Request
from diagnoser.sim.scenario import load_scenario

H100 = gpu("H100-80GB")
LLAMA3 = model("llama-3.1-8b")
CHUNK = 8192


def _streams_then_a_long_prompt(cfg: EngineConfig, prompt: int = 24_000) -> tuple[Engine, float]:
    """Eight streams decoding, then a long prompt (24,000 tokens); returns the engine and when
    the long prompt's prefill ended (its first token)."""
    engine = Engine(LLAMA3, H100, cfg)
    for i in range(8):
        engine.submit(Request(i, 0.0, 200, 2000, 4096, False, ready=0.0))
    engine.run_until(2.0)
    engine.drain()
    long = Request(99, 2.0, prompt, 10, 4096, False, ready=2.0)
    engine.submit(long)
    engine.run_until(6.0)
    return engine, long.first_token


def test_sglang_runs_the_chunks_alone_and_every_stream_waits_for_all_of_them():
    cfg = EngineConfig(max_num_batched_tokens=CHUNK, mixed_chunk=False)
    engine, first = _streams_then_a_long_prompt(cfg)
    st = engine.drain()
    prefill = first - 2.0
    assert prefill > 0.3  # three chunks of a 24,000-token prompt on one H100
    gaps = sorted((gap, n) for gap, n in st.itl if gap > 0.2)
    # One gap per stream, the whole prefill and a decode step, not a chunk's share of it.
    assert len(gaps) == 1 and gaps[0][1] == 8, gaps
    assert prefill < gaps[0][0] < prefill + 0.1


def test_vllm_decodes_in_the_steps_that_carry_the_chunks():
    cfg = EngineConfig(max_num_batched_tokens=CHUNK)
    engine, first = _streams_then_a_long_prompt(cfg)
    st = engine.drain()
    assert first > 2.0
    # Each step that carries a chunk also gives each stream a token: no gap is the prefill.
    assert max(gap for gap, _ in st.itl) < (first - 2.0) / 2


def test_vllm_prices_a_prompt_just_over_the_budget_as_a_full_chunk_and_a_short_one():
    """vLLM fills each step to --max-num-batched-tokens and gives the last chunk what is left:
    2,100 prompt tokens on a 2,048 budget are one full step and one of 52 tokens, not two full
    steps; each stream decoding beside them sees one long gap and one short one."""
    engine, first = _streams_then_a_long_prompt(EngineConfig(max_num_batched_tokens=2048), 2100)
    itl = engine.drain().itl
    n = 8
    full = engine.mixed_step_time(n, engine.running.context(), 2048 - n, 0.0)
    assert max(gap for gap, _ in itl) == pytest.approx(full, rel=0.05)
    # One long gap per stream; the short chunk's step costs about what a decode step does.
    assert sum(k for gap, k in itl if gap > 0.5 * full) == n, itl
    assert first - 2.0 < 1.5 * full


def test_admission_keeps_room_for_the_running_requests_output():
    """Long answers on a small KV pool: admitting on the prompt alone fills the pool and then
    retracts; keeping a tenth of each request's remaining max_tokens admits fewer at first and
    retracts none in the first six seconds while they grow (by about 500 tokens each; later,
    as what is kept shrinks with what is left to generate, it retracts too)."""
    base = EngineConfig(max_num_batched_tokens=CHUNK, gpu_memory_utilization=0.3)
    peak, retracted = {}, {}
    for ratio in (0.0, 0.1):
        engine = Engine(LLAMA3, H100, dataclasses.replace(base, new_token_ratio=ratio))
        for i in range(400):
            engine.submit(Request(i, 0.0, 3000, 3000, 4096, False, ready=0.0))
        peak[ratio] = 0
        for k in range(1, 13):
            engine.run_until(k / 2)
            peak[ratio] = max(peak[ratio], engine.num_running())
        retracted[ratio] = len(engine.stats.retractions)
    assert peak[0.0] > peak[0.1], peak
    assert retracted[0.0] > 0 and retracted[0.1] == 0, retracted


SCENARIO = """\
description: One SGLang server.
duration: 10m
scrape_interval: 15s
seed: 1
labels: {window: 5m, expect: [], absent: []}
models:
  - name: m
    preset: llama-3.1-8b
    runtime: RUNTIME
    gpu: H100-80GB
    ENGINE
    workload:
      rate: {mean: 2}
      prompt: {median: 500}
      output: {median: 100}
"""


@pytest.mark.parametrize(
    ("runtime", "engine", "mixed", "ratio"),
    [
        ("sglang", "", False, 0.7 * 0.14),
        ("sglang", "engine: {mixed_chunk: true, new_token_ratio: 0.3}", True, 0.3),
        ("vllm", "", True, 0.0),
    ],
)
def test_an_sglang_server_runs_sglangs_scheduler_unless_told_otherwise(
    tmp_path, runtime, engine, mixed, ratio
):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace("RUNTIME", runtime).replace("ENGINE", engine))
    (m,) = load_scenario(path).models
    assert m.engine.mixed_chunk is mixed
    assert m.engine.new_token_ratio == pytest.approx(ratio)
