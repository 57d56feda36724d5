"""One vLLM server as Prometheus sees it: API server, engines, GPUs, and its /metrics.

The API server tokenizes on a CPU budget (one process saturates near one core), rejects
prompts longer than ``max_model_len`` with HTTP 400, and hands the rest to the least busy
data-parallel engine. What the engines do becomes vLLM's metrics, named per version profile.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diagnoser.core import families as M
from diagnoser.core.exposition import Histogram, Labels, Recorder, labels_of
from diagnoser.hardware.presets import GB, GpuSpec, ModelSpec
from diagnoser.sim.engine import Engine, EngineConfig, EngineStats, Request

PROFILES = ("0.33", "0.8")
CHAT = "/v1/chat/completions"


@dataclass
class ApiServerConfig:
    processes: int = 1  # --api-server-count; process_* metrics vanish above 1
    cpu_per_request: float = 0.002  # seconds of CPU per request (parsing, template)
    cpu_per_prompt_token: float = 1.5e-6  # tokenization, per prompt token
    cpu_per_output_token: float = 2.5e-5  # detokenization and streaming, per output token
    idle_cpu: float = 0.03  # cores used when idle


@dataclass
class Fault:
    other_process_gb: float = 0.0  # GPU memory taken by another process
    restart_seconds: float = 60.0  # time to come back after a crash or deploy


class EngineMetrics:
    """vLLM's per-engine histograms and counters, reset when the server restarts."""

    def __init__(self, max_model_len: int):
        tok = M.request_token_buckets(max_model_len)
        self.h = {
            "ttft": Histogram(M.TTFT_BUCKETS),
            "itl": Histogram(M.ITL_BUCKETS),
            "tpot": Histogram(M.ITL_BUCKETS),
            "e2e": Histogram(M.REQUEST_LATENCY_BUCKETS),
            "queue": Histogram(M.REQUEST_LATENCY_BUCKETS),
            "inference": Histogram(M.REQUEST_LATENCY_BUCKETS),
            "prefill": Histogram(M.REQUEST_LATENCY_BUCKETS),
            "decode": Histogram(M.REQUEST_LATENCY_BUCKETS),
            "prompt": Histogram(tok),
            "generation": Histogram(tok),
            "max_tokens": Histogram(tok),
            "params_n": Histogram((1.0, 2.0, 5.0, 10.0, 20.0)),
            "steps": Histogram(M.ITERATION_TOKENS_BUCKETS),
            "preemptions": Histogram(M.PREEMPTIONS_BUCKETS),
        }
        self.finished = {r: 0.0 for r in ("stop", "length", "abort", "error", "repetition")}
        self.prompt_tokens = 0.0
        self.generation_tokens = 0.0
        self.preemptions = 0.0
        self.prefix_queries = 0.0
        self.prefix_hits = 0.0

    def absorb(self, st: EngineStats) -> list[Request]:
        """Fold an engine's observations in; returns the finished requests."""
        h = self.h
        fin = st.finished
        if fin:
            arrival = np.array([r.arrival for r in fin])
            ready = np.array([r.ready for r in fin])
            sched = np.array([r.scheduled for r in fin])
            first = np.array([r.first_token for r in fin])
            last = np.array([r.last_token for r in fin])
            gen = np.array([r.generated for r in fin], dtype=np.float64)
            h["ttft"].observe(first - arrival)
            h["e2e"].observe(last - arrival)
            h["queue"].observe(sched - ready)
            h["inference"].observe(last - sched)
            h["prefill"].observe(first - sched)
            h["decode"].observe(last - first)
            multi = gen > 1
            h["tpot"].observe(((last - first)[multi]) / (gen[multi] - 1))
            h["prompt"].observe([r.prompt for r in fin])
            h["generation"].observe(gen)
            h["max_tokens"].observe([r.max_tokens for r in fin])
            h["params_n"].observe(np.ones(len(fin)))
            h["preemptions"].observe([r.preemptions for r in fin if r.preemptions])
            for r in fin:
                self.finished["length" if r.length_stop else "stop"] += 1
        if st.itl:
            v, w = zip(*st.itl, strict=True)
            h["itl"].observe(np.array(v), np.array(w, dtype=np.float64))
        if st.steps:
            v, w = zip(*st.steps, strict=True)
            h["steps"].observe(np.array(v), np.array(w, dtype=np.float64))
        self.prompt_tokens += st.prompt_tokens
        self.generation_tokens += st.generation_tokens
        self.preemptions += st.preemptions
        self.prefix_queries += st.prompt_tokens
        self.prefix_hits += st.cached_tokens
        return fin


@dataclass
class ServerSpec:
    model_name: str
    spec: ModelSpec
    gpu: GpuSpec
    engine: EngineConfig
    api: ApiServerConfig
    engines: int = 1
    version: str = "0.33"
    job: str = "vllm"
    instance: str = "vllm-0:8000"
    namespace: str = "llm"
    pod: str = "vllm-0"
    node: str = "gpu-node-0"
    dcgm: bool = True


@dataclass
class Server:
    s: ServerSpec
    start: float
    fault: Fault = field(default_factory=Fault)
    up: bool = False
    started_at: float = 0.0
    down_until: float = 0.0
    never_fits: bool = False

    def __post_init__(self) -> None:
        self.pending: tuple[float, EngineConfig] | None = None
        self.cpu_seconds = 0.0
        self.cpu_free_at = self.start  # when the tokenizer queue drains
        self.http: dict[tuple[str, str], float] = {}
        self.busy: list[float] = []
        self._boot(self.start)

    # --- lifecycle ------------------------------------------------------------------------

    def _boot(self, t: float) -> None:
        probe = Engine(self.s.spec, self.s.gpu, self.s.engine, start=t)
        self.never_fits = not probe.fits_max_model_len() or probe.num_blocks <= 0
        if self.never_fits or self._oom():
            self.up = False
            self.engines: list[Engine] = []
            self.down_until = t + self.fault.restart_seconds
            return
        self.up = True
        self.started_at = t
        self.engines = [
            Engine(self.s.spec, self.s.gpu, self.s.engine, start=t) for _ in range(self.s.engines)
        ]
        self.em = [EngineMetrics(self.s.engine.max_model_len) for _ in self.engines]
        self.cpu_seconds = 0.0
        self.cpu_free_at = t
        self.http = {}
        self.busy = [0.0] * len(self.engines)

    def _oom(self) -> bool:
        slack = self.s.gpu.memory_bytes * (1 - self.s.engine.gpu_memory_utilization)
        return self.fault.other_process_gb * GB > slack

    def crash(self, t: float) -> list[Request]:
        self.collect()  # what finished before the crash was served
        lost = [r for e in self.engines for r in e.abort_all()] if self.up else []
        self.up = False
        self.engines = []
        self.down_until = t + self.fault.restart_seconds
        return lost

    def schedule_restart(self, t: float, engine: EngineConfig) -> None:
        """A deploy at ``t``: stop, then start after ``restart_seconds`` with ``engine``."""
        self.pending = (t, engine)

    def maintain(self, t: float) -> list[Request]:
        """Deploys, crashes on OOM, and coming back once the restart delay has passed."""
        if self.pending is not None and t >= self.pending[0]:
            self.s.engine = self.pending[1]
            self.pending = None
            return self.crash(t)
        if self.up and self._oom():
            return self.crash(t)
        if not self.up and t >= self.down_until:
            self._boot(t)
        return []

    # --- traffic --------------------------------------------------------------------------

    def accept(self, reqs: list[Request], overlong: np.ndarray) -> None:
        """Tokenize (CPU-queued), reject the too-long with 400, hand the rest to an engine."""
        api = self.s.api
        for req, too_long in zip(reqs, overlong, strict=True):
            cost = api.cpu_per_request + req.prompt * api.cpu_per_prompt_token
            begin = max(self.cpu_free_at, req.arrival)
            self.cpu_free_at = begin + cost / api.processes
            self.cpu_seconds += cost
            if too_long:
                self._http("4xx")
                continue
            req.ready = self.cpu_free_at
            engine = min(self.engines, key=lambda e: e.num_running() + len(e.waiting))
            engine.submit(req)

    def _http(self, status: str, n: float = 1.0) -> None:
        key = (CHAT, status)
        self.http[key] = self.http.get(key, 0.0) + n

    def advance(self, t_end: float, dt: float) -> None:
        """Run the engines to ``t_end`` (observations wait in them until ``collect``)."""
        if not self.up:
            return
        for engine in self.engines:
            engine.run_until(t_end)
        self.cpu_seconds += self.s.api.idle_cpu * dt

    def collect(self) -> list[Request]:
        """Fold the engines' observations into the metrics; returns the finished requests."""
        done: list[Request] = []
        if not self.up:
            return done
        api = self.s.api
        for i, (engine, em) in enumerate(zip(self.engines, self.em, strict=True)):
            st = engine.drain()
            self.busy[i] += st.busy_seconds
            self.cpu_seconds += st.generation_tokens * api.cpu_per_output_token
            done += em.absorb(st)
        self._http("2xx", float(len(done)))
        return done

    # --- exposition -----------------------------------------------------------------------

    def target_labels(self) -> dict[str, str]:
        s = self.s
        return {"job": s.job, "instance": s.instance, "namespace": s.namespace, "pod": s.pod}

    def record(self, rec: Recorder, t: float, interval: float) -> None:
        """One scrape at ``t``: ``up`` always, everything else only when the server answers."""
        target = self.target_labels()
        rec.sample("up", "gauge", "Scrape health.", labels_of(**target), t, 1.0 if self.up else 0.0)
        if self.s.dcgm:
            self._record_dcgm(rec, t, interval)
        if not self.up:
            return
        v033 = self.s.version == "0.33"
        for i, (engine, em) in enumerate(zip(self.engines, self.em, strict=True)):
            lb = labels_of(model_name=self.s.model_name, engine=str(i), **target)
            self._record_engine(rec, t, lb, engine, em, v033)
        if self.s.api.processes == 1:
            lb = labels_of(**target)
            rec.sample(
                "process_cpu_seconds_total",
                "counter",
                "Total user and system CPU time spent in seconds.",
                lb,
                t,
                self.cpu_seconds,
            )
            rec.sample(
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                lb,
                t,
                self.started_at,
            )
        for status in ("2xx", "4xx", "5xx"):
            lb = labels_of(handler=CHAT, method="POST", status=status, **target)
            rec.sample(
                "http_requests_total",
                "counter",
                "Total number of requests by method, status and handler.",
                lb,
                t,
                self.http.get((CHAT, status), 0.0),
            )

    def _record_engine(
        self, rec: Recorder, t: float, lb: Labels, engine: Engine, em: EngineMetrics, v033: bool
    ) -> None:
        g = "gauge"
        rec.sample(
            "vllm:num_requests_running",
            g,
            "Number of requests in model execution batches.",
            lb,
            t,
            engine.num_running(),
        )
        # Requests still being tokenized are the API server's, not the engine's queue.
        waiting = float(sum(1 for r in engine.waiting if r.ready <= t))
        rec.sample(
            "vllm:num_requests_waiting",
            g,
            "Number of requests waiting to be processed.",
            lb,
            t,
            waiting,
        )
        kv_name = "vllm:kv_cache_usage_perc" if v033 else "vllm:gpu_cache_usage_perc"
        rec.sample(
            kv_name, g, "KV-cache usage. 1 means 100 percent usage.", lb, t, engine.kv_usage()
        )
        if v033:
            for reason, value in (("capacity", waiting), ("deferred", 0.0)):
                rec.sample(
                    "vllm:num_requests_waiting_by_reason",
                    g,
                    "Waiting requests by reason.",
                    (*lb, ("reason", reason)),
                    t,
                    value,
                )
        cfg = engine.cfg
        info = (
            *lb,
            ("block_size", str(cfg.block_size)),
            ("cache_dtype", "auto" if cfg.kv_cache_dtype_bytes == 2 else "fp8"),
            ("enable_prefix_caching", str(cfg.enable_prefix_caching)),
            ("gpu_memory_utilization", str(cfg.gpu_memory_utilization)),
            ("num_gpu_blocks", str(engine.num_blocks)),
        )
        rec.sample(
            "vllm:cache_config_info",
            g,
            "Information of the LLMEngine CacheConfig.",
            tuple(sorted(info)),
            t,
            1.0,
        )
        c = "counter"
        reasons = (
            ("stop", "length", "abort", "error", "repetition")
            if v033
            else ("stop", "length", "abort")
        )
        for reason in reasons:
            rec.sample(
                "vllm:request_success_total",
                c,
                "Count of successfully processed requests.",
                tuple(sorted((*lb, ("finished_reason", reason)))),
                t,
                em.finished[reason],
            )
        rec.sample(
            "vllm:prompt_tokens_total",
            c,
            "Number of prefill tokens processed.",
            lb,
            t,
            em.prompt_tokens,
        )
        rec.sample(
            "vllm:generation_tokens_total",
            c,
            "Number of generation tokens processed.",
            lb,
            t,
            em.generation_tokens,
        )
        rec.sample(
            "vllm:num_preemptions_total",
            c,
            "Cumulative number of preemption from the engine.",
            lb,
            t,
            em.preemptions,
        )
        prefix = "vllm:prefix_cache_" if v033 else "vllm:gpu_prefix_cache_"
        rec.sample(
            prefix + "queries_total",
            c,
            "Prefix cache queries, in tokens.",
            lb,
            t,
            em.prefix_queries,
        )
        rec.sample(prefix + "hits_total", c, "Prefix cache hits, in tokens.", lb, t, em.prefix_hits)
        h = em.h
        hist = [
            ("vllm:time_to_first_token_seconds", "ttft", "Histogram of time to first token."),
            ("vllm:e2e_request_latency_seconds", "e2e", "Histogram of e2e request latency."),
            ("vllm:request_queue_time_seconds", "queue", "Time spent in WAITING phase."),
            ("vllm:request_inference_time_seconds", "inference", "Time spent in RUNNING phase."),
            ("vllm:request_prefill_time_seconds", "prefill", "Time spent in PREFILL phase."),
            ("vllm:request_decode_time_seconds", "decode", "Time spent in DECODE phase."),
            ("vllm:request_prompt_tokens", "prompt", "Number of prefill tokens processed."),
            ("vllm:request_generation_tokens", "generation", "Number of generation tokens."),
            ("vllm:request_params_max_tokens", "max_tokens", "The max_tokens request parameter."),
            ("vllm:request_params_n", "params_n", "The n request parameter."),
            ("vllm:iteration_tokens_total", "steps", "Number of tokens per engine_step."),
        ]
        if v033:
            hist += [
                ("vllm:inter_token_latency_seconds", "itl", "Histogram of inter-token latency."),
                (
                    "vllm:request_time_per_output_token_seconds",
                    "tpot",
                    "Time per output token per request.",
                ),
                ("vllm:request_num_preemptions", "preemptions", "Preemptions per request."),
            ]
        else:
            hist.append(
                (
                    "vllm:time_per_output_token_seconds",
                    "itl",
                    "Histogram of time per output token in seconds. DEPRECATED.",
                )
            )
        for name, key, help_ in hist:
            rec.sample_histogram(name, help_, lb, t, h[key])

    def _record_dcgm(self, rec: Recorder, t: float, interval: float) -> None:
        s = self.s
        total_mib = s.gpu.memory_bytes / 2**20
        vllm_mib = (s.gpu.memory_bytes * s.engine.gpu_memory_utilization / 2**20) if self.up else 0
        other_mib = self.fault.other_process_gb * GB / 2**20
        gpus = max(1, s.engines) * s.engine.tensor_parallel
        for i in range(gpus):
            engine_idx = min(i // s.engine.tensor_parallel, len(self.busy) - 1)
            util = 0.0
            if self.up and self.busy:
                util = min(100.0, 100.0 * self.busy[engine_idx] / interval)
            used = min(total_mib, vllm_mib + other_mib)
            lb = labels_of(
                gpu=str(i),
                UUID=f"GPU-{s.pod}-{i}",
                Hostname=s.node,
                modelName=s.gpu.name,
                namespace=s.namespace,
                pod=s.pod,
                container="vllm",
                job="dcgm",
                instance=f"{s.node}:9400",
            )
            rec.sample(
                "DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", lb, t, round(util)
            )
            rec.sample(
                "DCGM_FI_DEV_FB_USED",
                "gauge",
                "Framebuffer memory used (in MiB).",
                lb,
                t,
                round(used),
            )
            rec.sample(
                "DCGM_FI_DEV_FB_FREE",
                "gauge",
                "Framebuffer memory free (in MiB).",
                lb,
                t,
                round(total_mib - used),
            )
        self.busy = [0.0] * len(self.busy)
