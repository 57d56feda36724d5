"""The simulator's physics: memory arithmetic, queueing, preemption, latency scaling."""

from __future__ import annotations

import numpy as np
import pytest

from diagnoser.hardware.presets import GB, GIB, gpu, kv_budget_bytes, kv_capacity_tokens, model
from diagnoser.sim.engine import CHAT, Engine, EngineConfig, Request

H100 = gpu("H100-80GB")
LLAMA3 = model("llama-3.1-8b")


def test_kv_bytes_per_token_follows_the_formula():
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes = 128 KiB
    assert LLAMA3.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert LLAMA3.kv_bytes_per_token(kv_dtype_bytes=1) == 64 * 1024  # FP8 KV halves it


def test_llama2_needs_four_times_the_kv_of_llama31():
    assert model("llama-2-7b").kv_bytes_per_token() == 4 * LLAMA3.kv_bytes_per_token()


def test_the_memory_example_64_users_do_not_fit_50_do():
    need = 64 * 8192 * LLAMA3.kv_bytes_per_token()
    free = kv_budget_bytes(LLAMA3, H100, 0.9, 2.14 * GB, weight_bytes=16.0 * GB)
    assert round(need / GB, 1) == 68.7
    assert round(free / GB, 1) == 53.9
    tokens = kv_capacity_tokens(LLAMA3, H100, 0.9, 2.14 * GB, weight_bytes=16.0 * GB)
    assert tokens // 8192 == 50


def test_the_128k_upgrade_leaves_room_for_three_full_length_requests():
    assert 131072 * LLAMA3.kv_bytes_per_token() == 16 * GIB
    free = kv_budget_bytes(LLAMA3, H100)
    assert 49 < free / GIB < 51
    assert kv_capacity_tokens(LLAMA3, H100) // 131072 == 3


def _poisson_run(
    engine: Engine,
    rate: float,
    seconds: float,
    prompt: int,
    out: int,
    seed: int = 0,
    sample_every: float = 0.5,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, int(rate * seconds * 1.2) + 10))
    arrivals = arrivals[arrivals < seconds]
    running, kv, finished = [], [], []
    i = 0
    for t in np.arange(sample_every, seconds + 1e-9, sample_every):
        while i < len(arrivals) and arrivals[i] < t:
            engine.submit(Request(i, arrivals[i], prompt, out, 4096, False, ready=arrivals[i]))
            i += 1
        engine.run_until(t)
        running.append(engine.num_running())
        kv.append(engine.kv_usage())
        finished += engine.drain().finished
    return {
        "running": np.array(running),
        "kv": np.array(kv),
        "inference": np.array([r.last_token - r.scheduled for r in finished]),
        "itl": np.array(
            [
                (r.last_token - r.first_token) / (r.generated - 1)
                for r in finished
                if r.generated > 1
            ]
        ),
    }


def test_littles_law_running_equals_throughput_times_time_in_engine():
    engine = Engine(LLAMA3, H100, EngineConfig())
    rate = 8.0
    out = _poisson_run(engine, rate, 600, prompt=500, out=200)
    steady = out["running"][200:]  # skip the first 100 s of warm-up
    expected = rate * out["inference"].mean()
    assert steady.mean() == pytest.approx(expected, rel=0.15)


def test_itl_grows_with_batch_size_and_context():
    e = Engine(LLAMA3, H100, EngineConfig())
    assert e.decode_step_time(64, 64 * 1000) > e.decode_step_time(8, 8 * 1000)
    assert e.decode_step_time(8, 8 * 20000) > e.decode_step_time(8, 8 * 2000)
    light = _poisson_run(Engine(LLAMA3, H100, EngineConfig()), 2, 300, 500, 200)
    heavy = _poisson_run(Engine(LLAMA3, H100, EngineConfig()), 32, 300, 500, 200)
    long_ctx = _poisson_run(Engine(LLAMA3, H100, EngineConfig()), 2, 300, 16000, 200)
    assert np.median(heavy["itl"]) > 1.3 * np.median(light["itl"])
    assert np.median(long_ctx["itl"]) > 1.3 * np.median(light["itl"])


def _prefill_seconds(prompt: int) -> float:
    engine = Engine(LLAMA3, H100, EngineConfig(max_model_len=131072, max_num_batched_tokens=8192))
    engine.submit(Request(0, 0.0, prompt, 1, 1, True, ready=0.0))
    engine.run_until(60.0)
    (req,) = engine.drain().finished
    return req.first_token - req.scheduled


def test_ttft_is_superlinear_in_prompt_length_at_long_prompts():
    short = _prefill_seconds(1024) / _prefill_seconds(512)
    long = _prefill_seconds(65536) / _prefill_seconds(32768)
    assert short < 2.1  # short prompts: about linear (and fixed step overhead)
    assert long > 2.2  # long prompts: attention makes doubling cost more than double


def test_no_preemption_while_the_cache_has_room():
    engine = Engine(LLAMA3, H100, EngineConfig())
    _poisson_run(engine, 8, 300, 500, 200)
    assert engine.kv_usage() < 0.5
    assert engine.drain().preemptions == 0


def test_preemptions_happen_only_when_the_cache_is_full():
    cfg = EngineConfig(gpu_memory_utilization=0.25, max_num_seqs=512)
    engine = Engine(model("llama-2-7b"), H100, cfg)
    rng = np.random.default_rng(3)
    usage: list[float] = []
    t = 0.0
    for k in range(400):
        for _ in range(rng.poisson(6)):
            engine.submit(Request(k, t, 1500, 600, 4096, False, ready=t))
        t += 0.5
        engine.run_until(t)
        usage += engine.drain().usage_at_preemption
    assert len(usage) > 10
    assert min(usage) > 0.95


def test_a_config_whose_cache_cannot_hold_max_model_len_does_not_start():
    qwen = model("qwen3-8b")
    tight = EngineConfig(max_model_len=131072, gpu_memory_utilization=0.35)
    assert not Engine(qwen, H100, tight).fits_max_model_len()
    assert Engine(qwen, H100, EngineConfig(max_model_len=32768)).fits_max_model_len()


def test_a_hung_engine_stands_still_and_resumes_with_what_waited():
    from diagnoser.metrics import families as F
    from diagnoser.sim.server import ApiServerConfig, Fault, Server, ServerSpec

    fault = Fault()
    spec = ServerSpec("m", LLAMA3, H100, EngineConfig(), ApiServerConfig())
    server = Server(spec, start=0.0, fault=fault)

    def send(t: float, n: int) -> None:
        reqs = [Request(int(t * 100) + i, t, 500, 400, 4096, False) for i in range(n)]
        server.accept(reqs, np.zeros(n, dtype=bool))

    send(0.0, 8)
    server.advance(1.0, 1.0)
    server.collect()
    (engine,) = server.engines
    running, tokens = engine.num_running(), server.em[0].counters
    assert running == 8
    fault.hung_instances = 1  # the engine hangs mid-answer
    generated = tokens[F.GENERATION_TOKENS]
    for t in range(2, 60):
        send(float(t), 1)  # the API server still accepts; the engine reads nothing
        server.advance(float(t), 1.0)
        server.collect()
    assert server.hung and engine.num_running() == running and len(server.held) == 58
    assert tokens[F.GENERATION_TOKENS] == generated
    fault.hung_instances = 0
    server.advance(61.0, 1.0)
    done = server.collect()
    assert not server.held and engine.num_running() + len(engine.waiting) > 8
    assert tokens[F.GENERATION_TOKENS] > generated
    # A request held through the hang waited for it: its first token came after it ended.
    assert all(r.first_token >= 60.0 for r in done if r.arrival >= 2.0)


@pytest.mark.parametrize(("rollout", "new_target"), [("in-place", False), ("new-pods", True)])
def test_a_deploy_restarts_the_same_target_or_brings_a_new_pod(rollout, new_target):
    from diagnoser.sim.server import ApiServerConfig, Server, ServerSpec

    spec = ServerSpec(
        "m", LLAMA3, H100, EngineConfig(), ApiServerConfig(), pod="m-0", instance="m-0:8000"
    )
    spec.rollout = rollout
    server = Server(spec, start=0.0)
    before = server.target_labels()
    server.schedule_restart(10.0, EngineConfig(max_model_len=8192))
    server.maintain(10.0)
    assert not server.up and server.s.engine.max_model_len == 8192
    after = server.target_labels()
    assert (after != before) is new_target
    if new_target:  # a pod of the next revision: its name and its target are new
        assert after["pod"] == "m-0-r1" and after["instance"] == "m-0-r1:8000"
    server.maintain(10.0 + server.fault.restart_seconds)
    assert server.up and server.target_labels() == after


@pytest.mark.parametrize("alpha", [0.3, 0.75])
def test_speculation_gives_each_step_one_token_plus_the_accepted_run(alpha):
    k = 4
    eng = Engine(LLAMA3, H100, EngineConfig(num_speculative_tokens=k), seed=3)
    for i in range(32):
        req = Request(i, 0.0, 200, 100_000, 100_000, False, accept=alpha)
        eng.submit(req)
    eng.run_until(1.0)  # prefill them
    eng.drain()
    eng.run_until(31.0)
    st = eng.drain()
    steps = sum(n for _, n in st.itl)  # one ITL observation per request and step
    # E[accepted] = alpha (1 - alpha^k) / (1 - alpha): leading successes of k trials.
    expected = 1 + alpha * (1 - alpha**k) / (1 - alpha)
    assert st.generation_tokens / steps == pytest.approx(expected, rel=0.02)
    assert st.drafts == steps and st.draft_tokens == k * steps
    assert st.accepted == st.generation_tokens - steps
    # Position i is accepted when the first i + 1 drafts are: alpha^(i+1) of the drafts.
    assert st.accepted_per_pos / st.drafts == pytest.approx(alpha ** np.arange(1, k + 1), abs=0.02)
    assert st.accepted_per_pos.sum() == st.accepted


def test_a_speculative_step_costs_more_than_a_plain_one_and_yields_more():
    plain = Engine(LLAMA3, H100, EngineConfig())
    spec = Engine(LLAMA3, H100, EngineConfig(num_speculative_tokens=4))
    t_plain, t_spec = plain.decode_step_time(64, 64 * 2000), spec.decode_step_time(64, 64 * 2000)
    # Verifying 4 more tokens a sequence is cheap while decode is bandwidth-bound...
    assert t_plain < t_spec < 1.3 * t_plain
    # ...so even a low acceptance (1.4 tokens a step) beats no speculation at this batch.
    assert t_spec / 1.4 < t_plain


def test_a_request_for_an_adapter_beyond_max_loras_waits_while_the_batch_has_room():
    from diagnoser.metrics import families as F
    from diagnoser.metrics.exposition import Recorder
    from diagnoser.sim.server import ApiServerConfig, Server, ServerSpec

    spec = ServerSpec("m", LLAMA3, H100, EngineConfig(max_loras=1), ApiServerConfig())
    server = Server(spec, start=0.0)
    (engine,) = server.engines
    # Two requests for adapter 0, then one for adapter 1 and another for adapter 0.
    reqs = [
        Request(i, 0.0, 300, out, 4096, False, adapter=a)
        for i, (a, out) in enumerate([(0, 400), (0, 400), (1, 20), (0, 400)])
    ]
    server.accept(reqs, np.zeros(4, dtype=bool))
    server.advance(1.0, 1.0)
    # The one slot holds adapter 0: its later request passes the skipped one, which waits.
    assert engine.adapters_in_use() == {0}
    assert [r.rid for r in engine.waiting] == [2] and engine.waiting[0].deferred
    assert engine.num_running() == 3 < engine.cfg.max_num_seqs and engine.kv_usage() < 0.01
    rec = Recorder()
    server.record_metrics(rec, 1.0, {"job": "vllm", "instance": "m-0:8000"})
    by_reason = {
        dict(labels)["reason"]: points[-1][1]
        for labels, points in rec.families[F.WAITING_BY_REASON.name].points.items()
    }
    assert by_reason == {"capacity": 0.0, "deferred": 1.0}
    ((labels, points),) = rec.families[F.LORA_INFO.name].points.items()
    info = dict(labels)
    assert info["max_lora"] == "1" and points == [(1.0, 1.0)]
    # vLLM lists the adapters in use in both labels: the waiting adapter 1 is in neither.
    assert info["running_lora_adapters"] == info["waiting_lora_adapters"] == "lora-00"
    # Once adapter 0 has no request left, adapter 1 gets the slot.
    while any(r.adapter == 0 for r in (*engine.running.reqs, *engine.prefilling)):
        server.advance(server.engines[0].clock + 1.0, 1.0)
        server.collect()
    server.advance(engine.clock + 1.0, 1.0)
    assert not engine.waiting and reqs[2].scheduled > 0 and not reqs[2].deferred
    assert reqs[2].scheduled >= max(reqs[i].last_token for i in (0, 1, 3))


def test_a_kv_consumer_waits_for_each_prompts_kv_and_a_failed_load_is_an_error():
    from diagnoser.metrics import families as F
    from diagnoser.metrics.exposition import Recorder
    from diagnoser.sim.server import ApiServerConfig, Fault, Server, ServerSpec

    fault = Fault(kv_transfer_gbps=1.0)  # TCP: a 2,000-token prompt's KV takes a quarter second
    spec = ServerSpec("m", LLAMA3, H100, EngineConfig(kv_consumer=True), ApiServerConfig())
    server = Server(spec, start=0.0, fault=fault)
    (engine,) = server.engines
    reqs = [Request(i, 0.0, 2000, 50, 4096, False) for i in range(4)]
    server.accept(reqs, np.zeros(4, dtype=bool))
    transfer = 2000 * engine.costs.kv_bytes_per_token / 1e9
    assert all(r.ready - r.fetch_start == pytest.approx(0.002 + transfer) for r in reqs)
    fault.kv_transfer_failure = 1.0  # every later load fails
    failing = [Request(10 + i, 0.0, 2000, 50, 4096, False) for i in range(2)]
    server.accept(failing, np.zeros(2, dtype=bool))
    server.advance(10.0, 10.0)
    done = server.collect()
    ok = [r for r in done if r.outcome == "finished"]
    assert len(ok) == 4 and len(done) == 6
    # The prompt's KV came by transfer: the first token waited for it and computed one token.
    assert all(r.first_token - r.arrival > transfer for r in ok)
    em = server.em[0]
    assert em.by_source["external_kv_transfer"] == 4 * 1999
    assert em.by_source["local_compute"] == 4
    assert em.finished["error"] == 2 and em.nixl.counters[F.NIXL_FAILED] == 2
    assert em.nixl.h[F.NIXL_XFER_TIME].counts.sum() == 4
    assert server.http[(CHAT, "5xx")] == 2 and server.http[(CHAT, "2xx")] == 4
    rec = Recorder()
    server.record_metrics(rec, 10.0, {"job": "vllm", "instance": "m-0:8000"})
    for fam in (F.NIXL_FAILED, F.NIXL_BYTES, F.KV_FETCH_BY_STAGE, F.NIXL_EXPIRED):
        assert fam.name in rec.families


@pytest.mark.prometheus
def test_the_scenario_cache_key_covers_every_module_a_simulation_runs():
    """The suite's scenario cache is keyed by the code that writes a scenario's series
    (``harness.simulation_digest``): every module a simulation imports must be in it."""
    import subprocess
    import sys

    code = (
        "import sys, tempfile; from lab import harness; "
        "harness._one('healthy-quiet-night', tempfile.mkdtemp(), 1.8e9); "
        "print('\\n'.join(m.__file__ for n, m in list(sys.modules.items()) "
        "if n.startswith('diagnoser') and getattr(m, '__file__', None)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    from pathlib import Path

    import diagnoser
    from lab import harness

    package = Path(diagnoser.__file__).resolve().parent
    covered = [package / p for p in harness._SIMULATION_CODE]
    missed = []
    for line in out.stdout.split():
        f = Path(line).resolve()
        if (f.name == "__init__.py" and f.stat().st_size < 2000) or package not in f.parents:
            continue  # package markers, and the harness that runs it (not what it writes)
        rel = f.relative_to(package)
        if not any(f == c or c in f.parents for c in covered):
            missed.append(str(rel))
    assert not missed, missed
