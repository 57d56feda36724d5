"""What one SGLang 0.5 server started with ``--enable-metrics`` exposes: the ``sglang:*``
families of :mod:`diagnoser.metrics.families_sglang`, as a unified engine (``engine_type=
"unified"``) whose statistics come from TP rank 0 (SGLang's default), with CUDA graphs and
the radix cache on and no optional feature. The token-length histograms (prompt, uncached
prompt, generation) only with ``--collect-tokens-histogram`` (the scenario's engine flag
``collect_tokens_histogram``), off by default as in SGLang's ServerArgs.

``tests/test_conformance.py`` holds the exposition to ``tests/data/sglang-0.5.23.json``.
Observations follow ``sglang/srt/observability/metrics_collector.py`` and the code that calls
it (``tokenizer_manager.collect_metrics``, ``req_time_stats``, ``metrics_reporter``):

- the tokenizer observes TTFT at a request's first output and ITL for each later output
  (its gap divided over the tokens it carries); at the finish, e2e, the per-request TPOT
  (when more than one token came), prompt, uncached-prompt and generation lengths, the token
  counters and ``num_requests_total``; cached tokens only when there were some;
- the scheduler observes the queue time at a request's first forward and its prefill
  (``per_stage_req_latency_seconds{stage="prefill_forward"}``, a ``chunked_prefill`` per
  chunk of a prompt split over steps) as its last chunk runs, counts retractions as they
  happen, and publishes its gauges with every batch;
- counters and histograms appear once something was written to them (prometheus_client's
  multiprocess mode), gauges without a ``multiprocess_mode`` carry the writing process's
  ``pid``, and there is no ``process_*`` family (the multiprocess registry has none; the
  tokenizer's and detokenizer's CPU are ``sglang:process_cpu_seconds_total{component}``).

SGLang's scheduler is simulated with the engine's mechanics (:mod:`diagnoser.sim.engine`):
``--max-running-requests`` is ``max_num_seqs``, ``--chunked-prefill-size`` is
``max_num_batched_tokens``, the page size is ``block_size``, and a retraction is a
preemption (the request's KV freed, to be recomputed).
"""

from __future__ import annotations

import numpy as np

from diagnoser.hardware.presets import GB
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics.exposition import Histogram, Labels, Recorder
from diagnoser.metrics.family import Family
from diagnoser.sim.engine import Engine, Request
from diagnoser.sim.engine_stats import EngineStats

PROFILES = {"0.5": "0.5.23"}
STREAMING = "true"  # the simulated clients stream
GRAPH_PHASES = (
    *("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend"),
)
STARTUP_PHASES = ("load_weight", "kv_cache_allocation", "scheduler_e2e", "tokenizer_e2e")
STAGES = (
    *("recv_requests", "process_input_requests", "get_next_batch_to_run", "run_batch"),
    *("process_batch_result", "other"),
)
ZERO_GAUGES = (
    SG.NUM_GRAMMAR_QUEUE_REQS,
    SG.SWA_TOKEN_USAGE,
    SG.MAMBA_USAGE,
    SG.SWA_AVAILABLE_TOKENS,
    SG.SWA_EVICTABLE_TOKENS,
    SG.SWA_USED_TOKENS,
    SG.MAMBA_AVAILABLE_TOKENS,
    SG.MAMBA_EVICTABLE_TOKENS,
    SG.MAMBA_USED_TOKENS,
    SG.SPEC_ACCEPT_LENGTH,
    SG.SPEC_ACCEPT_RATE,
    SG.SPEC_CAP_LENGTH,
    SG.SPEC_BLOCK_ACCEPT_LENGTH,
    SG.SPEC_NUM_STEPS,
    SG.SPEC_NUM_DRAFT_TOKENS,
    SG.NUM_PREFILL_BOOTSTRAP_QUEUE_REQS,
    SG.NUM_PREFILL_INFLIGHT_QUEUE_REQS,
    SG.NUM_DECODE_PREALLOC_QUEUE_REQS,
    SG.NUM_DECODE_TRANSFER_QUEUE_REQS,
    SG.NUM_DECODE_HOST_RECEIVE_QUEUE_REQS,
    SG.NUM_DECODE_DEFERRED_KV_RELEASE_REQS,
    SG.PENDING_PREALLOC_TOKEN_USAGE,
    SG.PREALLOC_FULL_TOKEN_USAGE,
    SG.PREALLOC_SWA_TOKEN_USAGE,
    SG.NUM_UNIQUE_RUNNING_ROUTING_KEYS,
)
ROUTING_BOUNDS = ("1", "2", "3", "5", "7", "10", "20", "50", "100", "200")
HTTP_STATUS = {"2xx": "200", "4xx": "400", "5xx": "500"}


class SchedulerMetrics:
    """One SGLang scheduler's (data-parallel rank's) histograms, counters and recent state;
    reset when the server restarts (its multiprocess files are new)."""

    def __init__(self) -> None:
        self.queue = Histogram(SG.QUEUE.bucket_bounds(0))
        self.stage: dict[str, Histogram] = {}
        self.counters: dict[tuple[Family, str], float] = {}
        self.retracted_now = 0  # since the latest stats log
        self.new_token_ratio = 0.7  # --init-new-token-ratio, decays between retractions
        self.hits = self.inputs = 0.0  # the latest interval's prefill, for cache_hit_rate
        self.generated = 0.0  # the latest interval's decode tokens, for gen_throughput
        self.busy = 0.0
        self.finished_tokens = 0  # what finished requests left in the radix cache
        for mode in ("input", "device_hit", "host_hit", "storage_hit"):  # pre-seeded at 0
            self.count(SG.PREFILL_EFFECTIVE_TOKENS, 0.0, mode)

    def count(self, fam: Family, value: float, label: str = "") -> None:
        key = (fam, label)
        self.counters[key] = self.counters.get(key, 0.0) + value

    def observe(self, stage: str, values: list[float] | np.ndarray) -> None:
        hist = self.stage.get(stage)
        if hist is None:
            hist = self.stage[stage] = Histogram(SG.STAGE.bucket_bounds(0))
        hist.observe(values)

    def absorb(self, st: EngineStats) -> None:
        """A drain of the engine's observations, as the scheduler logs them."""
        self.queue.observe(st.queue_times)
        if st.queue_times:
            # receiving a request to its entry in the waiting queue: well under a millisecond
            self.observe("request_process", np.full(len(st.queue_times), 0.0004))
        for seconds, steps in st.prefills:
            self.observe("prefill_forward", [seconds])
            if steps > 1:
                self.observe("chunked_prefill", np.full(steps, seconds / steps))
        # A retracted request's prompt and output are computed again when it is readmitted.
        computed = sum(r[0] + r[1] for r in st.retractions)
        fresh = st.prompt_tokens - st.cached_tokens
        self.count(SG.REALTIME_TOKENS, fresh + computed, "prefill_compute")
        if st.cached_tokens:
            self.count(SG.REALTIME_TOKENS, st.cached_tokens, "prefill_cache")
            self.count(SG.PREFILL_EFFECTIVE_TOKENS, st.cached_tokens, "device_hit")
        if st.generation_tokens:
            self.count(SG.REALTIME_TOKENS, st.generation_tokens, "decode")
        if fresh:
            self.count(SG.PREFILL_EFFECTIVE_TOKENS, fresh, "input")
        if st.ttft:
            self.count(SG.CUDA_GRAPH_PASSES, len(st.ttft), "prefill_none")
        passes = float(sum(c.sum() for _, c in st.batches))
        if passes:
            self.count(SG.CUDA_GRAPH_PASSES, passes, "decode_cuda_graph")
        if st.retractions:
            self.count(SG.RETRACTIONS, len(st.retractions))
            self.count(SG.NUM_RETRACTED_INPUT_TOKENS, sum(r[0] for r in st.retractions))
            self.count(SG.NUM_RETRACTED_OUTPUT_TOKENS, sum(r[1] for r in st.retractions))
            self.new_token_ratio = 0.7
        self.retracted_now += len(st.retractions)
        self.hits, self.inputs = float(st.cached_tokens), float(st.prompt_tokens)
        self.generated = float(st.generation_tokens)
        self.busy += st.busy_seconds
        self.finished_tokens += sum(r.prompt + r.generated for r in st.finished)

    def tick(self, interval: float) -> None:
        """The scheduler's own time accounting over one scrape interval."""
        busy, self.busy = min(self.busy, interval), 0.0
        self.count(SG.SCHEDULER_IDLE, interval - busy)
        self.count(SG.SCHEDULER_PROCESS_CPU, 0.9 * busy + 0.05 * (interval - busy))
        share = {"run_batch": 0.8, "process_batch_result": 0.1, "get_next_batch_to_run": 0.05}
        for stage in STAGES:
            self.count(SG.SCHEDULER_STAGE, busy * share.get(stage, 0.0125), stage)
        self.new_token_ratio = max(0.1, self.new_token_ratio * 0.9)


class TokenizerMetrics:
    """The tokenizer manager's histograms and counters (one per server); the token-length
    histograms only with ``--collect-tokens-histogram`` (``token_histograms``)."""

    def __init__(self, token_histograms: bool = False) -> None:
        lengths = SG.TOKEN_HISTOGRAMS if token_histograms else ()
        self.h = {
            f: Histogram(f.bucket_bounds(0)) for f in (SG.TTFT, SG.ITL, SG.TPOT, SG.E2E, *lengths)
        }
        self.counters: dict[Family, float] = {}

    def absorb(self, st: EngineStats) -> None:
        self.h[SG.TTFT].observe(st.ttft)
        if st.itl:
            gaps, tokens = (np.array(x, dtype=np.float64) for x in zip(*st.itl, strict=True))
            self.h[SG.ITL].observe(gaps, tokens)
        if st.finished:
            self._finished(st.finished)

    def _finished(self, fin: list[Request]) -> None:
        arrival = np.array([r.arrival for r in fin])
        first = np.array([r.first_token for r in fin])
        last = np.array([r.last_token for r in fin])
        gen = np.array([r.generated for r in fin], dtype=np.float64)
        prompt = np.array([r.prompt for r in fin], dtype=np.float64)
        cached = np.array([r.first_cached for r in fin], dtype=np.float64)
        self.h[SG.E2E].observe(last - arrival)
        many = gen > 1
        self.h[SG.TPOT].observe((last - first)[many] / (gen[many] - 1))
        for fam, values in (
            (SG.PROMPT, prompt),
            (SG.PROMPT_UNCACHED, prompt - cached),
            (SG.GENERATION, gen),
        ):
            if fam in self.h:
                self.h[fam].observe(values)
        c = self.counters
        for fam, value in (
            (SG.PROMPT_TOKENS, prompt.sum()),
            (SG.GENERATION_TOKENS, gen.sum()),
            (SG.REQUESTS, float(len(fin))),
            (SG.CACHED_TOKENS, cached.sum()),
        ):
            if value or fam is not SG.CACHED_TOKENS:
                c[fam] = c.get(fam, 0.0) + float(value)


def record_scheduler(
    rec: Recorder,
    t: float,
    base: Labels,
    engine: Engine,
    sm: SchedulerMetrics,
    interval: float,
    pid: str,
    dp_rank: str | None = None,
) -> None:
    """One scheduler's series at a scrape (its stats log is at most a scrape old); ``pid``
    is the scheduler process's, on the gauges that keep each process apart."""
    extra = {"engine_type": "unified", "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
    if dp_rank is not None:
        extra["dp_rank"] = dp_rank
    lb = _labels(base, **extra)
    cfg = engine.cfg
    total = engine.num_blocks * cfg.block_size
    used = min(total, engine.used_blocks() * cfg.block_size)
    evictable = min(total - used, sm.finished_tokens)
    sm.tick(interval)
    gauges: dict[Family, float] = dict.fromkeys(ZERO_GAUGES, 0.0)
    gauges |= {
        SG.RUNNING: float(engine.num_running()),
        SG.WAITING: float(sum(1 for r in engine.waiting if r.ready <= t)),
        SG.GEN_THROUGHPUT: sm.generated / interval,
        SG.CACHE_HIT_RATE: sm.hits / sm.inputs if sm.inputs else 0.0,
        SG.DECODE_SUM_SEQ_LENS: float(engine.running.context()),
        SG.TOKEN_USAGE: used / total if total else 1.0,
        SG.FULL_TOKEN_USAGE: used / total if total else 1.0,
        SG.NUM_USED_TOKENS: float(used),
        SG.KV_USED_TOKENS: float(used),
        SG.KV_EVICTABLE_TOKENS: float(evictable),
        SG.KV_AVAILABLE_TOKENS: float(total - used - evictable),
        SG.UTILIZATION: min(1.0, engine.num_running() / cfg.max_num_seqs),
        SG.FWD_OCCUPANCY: float("nan"),  # SGLANG_ENABLE_METRICS_DEVICE_TIMER is off
        SG.NEW_TOKEN_RATIO: sm.new_token_ratio,
        SG.IS_CUDA_GRAPH: 1.0 if len(engine.running) and not engine.prefilling else 0.0,
        SG.MAX_NUM_TOKENS: float(total),
        SG.WEIGHT_MEMORY_USAGE_GB: engine.costs.weight_bytes / GB,
        SG.KV_CACHE_MEMORY_USAGE_GB: total * engine.costs.kv_bytes_per_token / GB,
        SG.PAGE_SIZE: float(cfg.block_size),
        SG.NUM_PAGES: float(engine.num_blocks),
        SG.CONTEXT_LEN: float(cfg.max_model_len),
        SG.STARTUP_AVAILABLE_GPU_MEMORY_GB: (engine.gpu.memory_bytes - engine.costs.weight_bytes)
        / GB,
    }
    if cfg.max_loras:  # --enable-lora: the distinct adapters of the running batch
        used_slots = float(len(engine.adapters_in_use()))
        gauges |= {
            SG.LORA_SLOTS_TOTAL: float(cfg.max_loras),
            SG.LORA_SLOTS_USED: used_slots,
            SG.LORA_UTILIZATION: used_slots / cfg.max_loras,
        }
    for fam, value in gauges.items():
        rec.sample(fam.name, fam.type, fam.help, lb, t, value)
    per_process = _labels(lb, pid=pid)
    for fam, value in ((SG.NUM_RETRACTED_REQS, sm.retracted_now), (SG.NUM_PAUSED_REQS, 0)):
        rec.sample(fam.name, fam.type, fam.help, per_process, t, float(value))
    sm.retracted_now = 0
    for phase in GRAPH_PHASES:
        fam = SG.GRAPH_MEMORY_USAGE_GB
        value = 0.6 if phase == "decode" else 0.0
        rec.sample(fam.name, fam.type, fam.help, _labels(lb, phase=phase), t, value)
    for fam in (SG.ROUTING_KEY_RUNNING_REQ_COUNT, SG.ROUTING_KEY_ALL_REQ_COUNT):
        for gt, le in zip(("0", *ROUTING_BOUNDS), (*ROUTING_BOUNDS, "+Inf"), strict=True):
            rec.sample(fam.name, fam.type, fam.help, _labels(lb, gt=gt, le=le), t, 0.0)
    for (fam, label), value in sm.counters.items():
        labels = _labels(lb, **{fam.labels[0]: label}) if fam.labels else lb
        if fam is SG.SCHEDULER_STAGE:
            labels = _labels(labels, forward_overlap="none")
        rec.sample(fam.name, fam.type, fam.help, labels, t, value)
    if sm.queue.count:
        rec.sample_histogram(SG.QUEUE.name, SG.QUEUE.help, lb, t, sm.queue)
    for stage, hist in sm.stage.items():
        rec.sample_histogram(SG.STAGE.name, SG.STAGE.help, _labels(lb, stage=stage), t, hist)


def record_tokenizer(
    rec: Recorder,
    t: float,
    base: Labels,
    tm: TokenizerMetrics,
) -> None:
    """The tokenizer manager's series: start-up phases, request histograms and counters."""
    lb = _labels(base, engine_type="unified")
    stream = _labels(lb, is_streaming=STREAMING)
    for phase, seconds in zip(STARTUP_PHASES, (38.0, 1.5, 62.0, 75.0), strict=True):
        fam = SG.STARTUP_TIME
        rec.sample(fam.name, fam.type, fam.help, _labels(lb, phase=phase), t, seconds)
    for phase in GRAPH_PHASES:
        fam = SG.STARTUP_CUDA_GRAPH_TIME
        value = 9.0 if phase == "decode" else 0.0
        rec.sample(fam.name, fam.type, fam.help, _labels(lb, phase=phase), t, value)
    for fam, value in tm.counters.items():
        labels = _labels(lb, cache_source="device") if fam is SG.CACHED_TOKENS else stream
        rec.sample(fam.name, fam.type, fam.help, labels, t, value)
    for fam, hist in tm.h.items():
        if hist.count:
            labels = stream if "is_streaming" in fam.labels else lb
            rec.sample_histogram(fam.name, fam.help, labels, t, hist)


def record_http(
    rec: Recorder,
    t: float,
    target: Labels,
    http: dict[tuple[str, str], float],
    scrapes: int,
    cpu: tuple[float, float],
) -> None:
    """The HTTP middleware's series (no model label) and the CPU monitor threads'."""
    fam = SG.HTTP_REQUESTS
    metrics = _labels(target, endpoint="/metrics", method="GET")
    rec.sample(fam.name, fam.type, fam.help, metrics, t, float(scrapes))
    by_endpoint: dict[str, float] = {}
    for (handler, _status), n in http.items():
        by_endpoint[handler] = by_endpoint.get(handler, 0.0) + n
    for handler, n in sorted(by_endpoint.items()):
        labels = _labels(target, endpoint=handler, method="POST")
        rec.sample(fam.name, fam.type, fam.help, labels, t, n)
    fam = SG.HTTP_RESPONSES
    code = {"endpoint": "/metrics", "method": "GET", "status_code": "200"}
    rec.sample(fam.name, fam.type, fam.help, _labels(target, **code), t, float(scrapes - 1))
    for (handler, status), n in sorted(http.items()):
        code = {"endpoint": handler, "method": "POST", "status_code": HTTP_STATUS[status]}
        rec.sample(fam.name, fam.type, fam.help, _labels(target, **code), t, n)
    fam = SG.HTTP_REQUESTS_ACTIVE
    rec.sample(fam.name, fam.type, fam.help, metrics, t, 1.0)  # this scrape
    fam = SG.ROUTING_KEYS_ACTIVE
    rec.sample(fam.name, fam.type, fam.help, target, t, 0.0)
    fam = SG.PROCESS_CPU
    for component, seconds in zip(("tokenizer", "detokenizer"), cpu, strict=True):
        rec.sample(fam.name, fam.type, fam.help, _labels(target, component=component), t, seconds)


def _labels(base: Labels, **extra: str) -> Labels:
    return tuple(sorted({**dict(base), **extra}.items()))
