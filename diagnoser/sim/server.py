"""One vLLM or SGLang server as Prometheus sees it: API server, engines, GPUs, its /metrics.

The API server tokenizes on a CPU budget (one process saturates near one core), rejects
prompts longer than ``max_model_len`` with HTTP 400, and hands the rest to the least busy
data-parallel engine. What the engines do becomes vLLM's metrics, named per version profile
(:mod:`diagnoser.sim.vllm_metrics`); the API server adds prometheus-fastapi-instrumentator's
HTTP families and, with one API-server process only, prometheus_client's ``process_*``. An
SGLang server (``runtime: sglang``) runs the same mechanics and exposes what SGLang 0.5 does
instead (:mod:`diagnoser.sim.sglang_metrics`).

A real server's ``/metrics`` carries no target labels: Prometheus adds ``job`` and
``instance`` (and service discovery ``namespace`` and ``pod``). The batch simulation writes
them itself, as Prometheus would have stored them; the live server leaves them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diagnoser.hardware.presets import GB, GpuSpec, ModelSpec
from diagnoser.metrics import exporters as X
from diagnoser.metrics import families as F
from diagnoser.metrics.exposition import Histogram, Recorder, labels_of
from diagnoser.sim import dcgm, nodes
from diagnoser.sim import sglang_metrics as sgm
from diagnoser.sim.engine import Engine, EngineConfig, Request
from diagnoser.sim.fault import Fault
from diagnoser.sim.kv_transfer import POST_SECONDS
from diagnoser.sim.platform import Container, record_pod
from diagnoser.sim.profiles import RenamingRecorder, Runtimes, profile
from diagnoser.sim.vllm_metrics import PROFILES, EngineMetrics, record_api_server, record_engine

__all__ = ["PROFILES", "RUNTIMES", "ApiServerConfig", "Fault", "Server", "ServerSpec"]
# Each registered engine's version profiles: the release each is held to.
RUNTIMES = Runtimes()
DETOKENIZE_CPU = 1e-5  # SGLang's detokenizer process, seconds per output token
REQUEST_BYTES = 200  # JSON around the prompt: model, parameters, message framing
BYTES_PER_TOKEN = 4
GPU_FAULT_AFTER = 180.0  # seconds a server on a failing GPU runs before it dies again


@dataclass
class ApiServerConfig:
    processes: int = 1  # --api-server-count; process_* metrics vanish above 1
    cpu_per_request: float = 0.002  # seconds of CPU per request (parsing, template)
    cpu_per_prompt_token: float = 1.5e-6  # tokenization, per prompt token
    cpu_per_output_token: float = 2.5e-5  # detokenization and streaming, per output token
    idle_cpu: float = 0.03  # cores used when idle


@dataclass
class ServerSpec:
    model_name: str
    spec: ModelSpec
    gpu: GpuSpec
    engine: EngineConfig
    api: ApiServerConfig
    engines: int = 1
    version: str = "0.33"
    runtime: str = "vllm"  # a registered engine's name (diagnoser.metrics.engines)
    job: str = "vllm"
    instance: str = "vllm-0:8000"
    ordinal: int = 0  # the server's place among the model's instances
    namespace: str = "llm"
    pod: str = "vllm-0"
    node: str = "gpu-node-0"
    dcgm: bool = True
    # Kubernetes: service discovery labels the server's series with its namespace and pod, and
    # dcgm-exporter maps each GPU to its pod. Bare metal: neither, the server is reached on
    # its node (``instance`` is NODE:8000) and the GPUs meet it by host.
    kubernetes: bool = True
    # A deploy's rollout: "in-place" (a StatefulSet, a systemd unit, a compose service: the
    # same target restarts) or "new-pods" (a Deployment: the server comes back as a new pod
    # and a new scrape target, and the old pod's target leaves service discovery).
    rollout: str = "in-place"
    revision: int = 0
    # kube-state-metrics and cAdvisor are scraped too (kubernetes only).
    kube_exporters: bool = False


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
        self.held: list[Request] = []  # sent to a hung engine: they wait in its input queue
        self.frozen = False  # the engines stood still at the last step
        self.cpu_seconds = 0.0
        self.cpu_free_at = self.start  # when the tokenizer queue drains
        self.http: dict[tuple[str, str], float] = {}
        self.http_pending: dict[tuple[str, str], list[tuple[float, int]]] = {}
        self.busy: list[float] = []
        self.pod_root = self.s.pod
        self.kv_rng = np.random.default_rng(7919 + self.s.ordinal)  # KV transfers only
        self.profile = profile(self.s.runtime)
        self.container = Container(started=self.start)
        self.placement = nodes.Placement(nodes.Node(self.s.node), self.s.node)
        self.gpu_errors = 0  # uncorrectable errors on its first GPU
        self._boot(self.start)

    # --- lifecycle ------------------------------------------------------------------------

    def _boot(self, t: float) -> None:
        self.engines: list[Engine] = []
        if self.container.cannot_start(t, self.fault.start_failure):
            self.up, self.down_until = False, t + self.fault.restart_seconds
            return
        probe = Engine(self.s.spec, self.s.gpu, self.s.engine, start=t)
        self.never_fits = not probe.fits_max_model_len() or probe.num_blocks <= 0
        if self.never_fits or self._oom():
            self.up = False
            self.down_until = t + self.fault.restart_seconds
            self.container.ended(t, "Error", 1)  # the engine raised at start: exit status 1
            return
        self.up = True
        self.started_at = t
        self.container.started = t
        self.engines = [
            Engine(self.s.spec, self.s.gpu, self.s.engine, start=t, seed=self._seed(t, i))
            for i in range(self.s.engines)
        ]
        if self.profile.mechanics == "sglang":
            self.sched = [sgm.SchedulerMetrics() for _ in self.engines]
            self.tok = sgm.TokenizerMetrics(self.s.engine.collect_tokens_histogram)
            self.scrapes = 0
            self.last_scrape = t
            self.detok_cpu = 0.0
        else:
            self.em = [
                EngineMetrics(
                    self.s.engine.max_model_len, self.s.version, self.s.engine.histogram_buckets
                )
                for _ in self.engines
            ]
        self.cpu_seconds = 0.0
        self.cpu_free_at = t
        self.http = {}
        self.http_highr = Histogram(X.HTTP_DURATION_HIGHR.bucket_bounds(0))
        self.http_duration: dict[str, Histogram] = {}
        self.http_size: dict[str, list[float]] = {}  # handler -> [count, request bytes]
        self.http_pending = {}
        self.busy = [0.0] * len(self.engines)
        self.lora_states: dict[str, float] = {}  # adapters in use -> when last current
        self.served_any = False  # vLLM logs lora_requests_info from its first request on

    def _seed(self, t: float, engine: int) -> int:
        """Each engine's own draws, the same on every run of the scenario."""
        return (int(t) * 1_000_003 + self.s.ordinal * 1009 + engine) % (1 << 63)

    def _oom(self) -> bool:
        slack = self.s.gpu.memory_bytes * (1 - self.s.engine.gpu_memory_utilization)
        return self.fault.other_process_gb * GB > slack

    def _gpu_fails(self, t: float) -> bool:
        """Its GPU raises one more uncorrectable error at ``t``, ``GPU_FAULT_AFTER`` into a run."""
        failed = self.s.ordinal < self.fault.gpu_faulty_instances
        failed = failed and t - self.started_at >= GPU_FAULT_AFTER
        self.gpu_errors += failed
        return failed

    @property
    def hung(self) -> bool:
        return self.up and self.s.ordinal < self.fault.hung_instances

    def crash(self, t: float) -> list[Request]:
        self.collect()  # what finished before the crash was served
        lost = [r for e in self.engines for r in e.abort_all()] if self.up else []
        lost += self.held
        self.held = []
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
            lost = self.crash(t)
            if self.s.rollout == "new-pods":
                self._new_pod()
            return lost
        if self.s.kube_exporters and (gone := nodes.events(self, t)) is not None:
            return gone
        if self.up and (self._oom() or self._gpu_fails(t)):
            return self.crash(t)
        if self.up and self._over_memory_limit(t):
            lost = self.crash(t)
            self.container.oom_killed(t)
            return lost
        budget = self.fault.liveness_kill_seconds  # how long a hung engine fails its probe
        if self.up and self.container.liveness_fails(t, self.hung, budget):
            lost = self.crash(t)
            self.container.killed_by_kubelet(t)
            self.down_until += self.container.backoff  # its back-off, then the model's load
            return lost
        if not self.up and t >= self.down_until:
            self._boot(t)
        return []

    def _new_pod(self) -> None:
        """The server comes back as the next revision's pod, a target never seen before."""
        s = self.s
        s.revision += 1
        port = s.instance.rsplit(":", 1)[1]
        s.pod = f"{self.pod_root}-r{s.revision}"
        s.instance = f"{s.pod}:{port}"
        self.container = Container(started=float("inf"))  # a new pod: no restarts, no past

    def _working_set(self, t: float) -> float | None:
        """The container's host memory at ``t`` (cAdvisor), None while none runs."""
        if not self.up:
            return None
        f = self.fault
        return self.container.working_set(t, f.host_memory_gb, f.host_memory_growth_gb_per_min)

    def _over_memory_limit(self, t: float) -> bool:
        limit = self.fault.memory_limit_gb * GB
        used = self._working_set(t)
        return self.s.kube_exporters and limit > 0 and used is not None and used >= limit

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
                self._http(req, "4xx", self.cpu_free_at - req.arrival)
                continue
            req.ready = self.cpu_free_at
            self.served_any = True
            if self.s.engine.kv_consumer:
                self._fetch_kv(req)
            if self.hung:  # the engine reads nothing from its input queue
                self.held.append(req)
                continue
            self._least_busy().submit(req)

    def _fetch_kv(self, req: Request) -> None:
        """The decode side pulls the prompt's KV from the prefill instance once the request
        is tokenized; the engine takes it when the KV has arrived (or the transfer failed)."""
        f = self.fault
        req.fetch_start = req.ready
        req.fetch_bytes = (
            req.prompt * self.engines[0].costs.kv_bytes_per_token if self.engines else 0.0
        )
        seconds = POST_SECONDS + req.fetch_bytes / (max(f.kv_transfer_gbps, 1e-3) * 1e9)
        req.ready += seconds
        req.kv_failed = bool(self.kv_rng.random() < f.kv_transfer_failure)

    def _least_busy(self) -> Engine:
        """The data-parallel engine a new request goes to: the fewest running and waiting."""
        if len(self.engines) == 1:
            return self.engines[0]
        return min(self.engines, key=lambda e: e.num_running() + len(e.waiting))

    def _http(self, req: Request, status: str, seconds: float) -> None:
        """The instrumentator's middleware, when the response (a whole stream) is done."""
        self.http_pending.setdefault((req.handler, status), []).append((seconds, req.prompt))

    def _flush_http(self) -> None:
        for (handler, status), done in self.http_pending.items():
            seconds, prompts = np.array(done).T
            key = (handler, status)
            self.http[key] = self.http.get(key, 0.0) + len(done)
            self.http_highr.observe(seconds)
            hist = self.http_duration.get(handler)
            if hist is None:
                hist = self.http_duration[handler] = Histogram(X.HTTP_DURATION.bucket_bounds(0))
            hist.observe(seconds)
            size = self.http_size.setdefault(handler, [0.0, 0.0])
            size[0] += len(done)
            size[1] += float((REQUEST_BYTES + BYTES_PER_TOKEN * prompts).sum())
        self.http_pending = {}

    def advance(self, t_end: float, dt: float) -> None:
        """Run the engines to ``t_end`` (observations wait in them until ``collect``)."""
        if not self.up:
            return
        self.cpu_seconds += self.s.api.idle_cpu * dt
        if self.hung:
            self.frozen = True
            return  # no step runs; the engines' clocks stop with them
        if self.frozen:  # back from a hang: the engines resume now, with what waited
            self.frozen = False
            for engine in self.engines:
                engine.clock = max(engine.clock, t_end - dt)
            for req in self.held:
                self._least_busy().submit(req)
            self.held = []
        for engine in self.engines:
            engine.run_until(t_end)

    def collect(self) -> list[Request]:
        """Fold the engines' observations into the metrics; returns the finished requests."""
        done: list[Request] = []
        if not self.up:
            return done
        api = self.s.api
        for i, engine in enumerate(self.engines):
            st = engine.drain()
            self.busy[i] += st.busy_seconds
            self.cpu_seconds += st.generation_tokens * api.cpu_per_output_token
            if self.profile.mechanics == "sglang":
                self.sched[i].absorb(st)
                self.tok.absorb(st)
                self.detok_cpu += st.generation_tokens * DETOKENIZE_CPU
                done += st.finished
            else:
                kv = engine.costs.kv_bytes_per_token
                done += self.em[i].absorb(st, engine.cfg.block_size, kv)
        for req in done:
            self._http(
                req, "5xx" if req.outcome == "error" else "2xx", req.last_token - req.arrival
            )
        self._flush_http()
        return done

    # --- exposition -----------------------------------------------------------------------

    def target_labels(self) -> dict[str, str]:
        s = self.s
        if not s.kubernetes:
            return {"job": s.job, "instance": s.instance}
        return {"job": s.job, "instance": s.instance, "namespace": s.namespace, "pod": s.pod}

    def record(self, rec: Recorder, t: float, interval: float) -> None:
        """One scrape at ``t`` as Prometheus stores it: ``up`` and the target's labels on
        every series; the server's own series only while it answers."""
        target = self.target_labels()
        if not self.placement.pending(t):  # a pod waiting for a node has no target yet
            rec.sample(X.UP.name, X.UP.type, X.UP.help, labels_of(**target), t, float(self.up))
        if self.s.dcgm and not self.placement.dark(t):
            self.record_dcgm(rec, t, interval)
        if self.s.kube_exporters and self.s.kubernetes:
            self.record_platform(rec, t)
        self.record_metrics(rec, t, target)

    def record_platform(self, rec: Recorder, t: float) -> None:
        """kube-state-metrics' and cAdvisor's series about the server's pod."""
        s, c = self.s, self.container
        pod = {"namespace": s.namespace, "pod": s.pod, "container": s.runtime}
        limit = self.fault.memory_limit_gb
        waiting = c.waiting(t, self.up, self.fault.start_failure)
        node = "" if self.placement.pending(t) else s.node
        record_pod(rec, t, c, pod, node, limit, self._working_set(t), waiting)
        nodes.record(rec, t, self.placement, limit, self._working_set(t))

    def record_metrics(self, rec: Recorder, t: float, target: dict[str, str]) -> None:
        """The server's ``/metrics`` at ``t`` (nothing while it is down), each series with
        ``target``'s labels added (none for a live exposition)."""
        if not self.up:
            return
        if self.profile.rename:
            rec = RenamingRecorder(rec, self.profile.rename)
        model = labels_of(model_name=self.s.model_name, **target)
        if self.profile.mechanics == "sglang":
            self._record_sglang(rec, t, model, target)
            return
        for i, (engine, em) in enumerate(zip(self.engines, self.em, strict=True)):
            record_engine(rec, t, model, i, engine, em, len(self.engines))
        record_api_server(rec, t, model, self.s.version)
        lb = labels_of(**target)
        if self.engines and self.engines[0].cfg.max_loras and self.served_any:
            self._record_lora(rec, t, lb)
        if self.s.api.processes == 1:  # prometheus_client's default registry
            for fam, value in (
                (X.PROCESS_CPU, self.cpu_seconds),
                (X.PROCESS_START, self.started_at),
            ):
                rec.sample(fam.name, fam.type, fam.help, lb, t, value)
        self._record_http(rec, t, target)

    def _record_lora(self, rec: Recorder, t: float, target: tuple[tuple[str, str], ...]) -> None:
        """``vllm:lora_requests_info``: one series per list of adapters in use, set to the
        time it was last the current list (vLLM keeps every list it has seen for the life of
        the process; the simulator drops one 10 minutes after it was last current, which
        changes no query that takes the latest). Both adapter labels carry the same list, as
        vLLM's ``LoRARequestStates`` fills them; names in order (vLLM's is the order the
        adapters got their first live request, which only multiplies the series)."""
        fam = F.LORA_INFO
        in_use = sorted(set().union(*(e.adapters_in_use() for e in self.engines)))
        names = ",".join(f"lora-{a:02d}" for a in in_use)
        self.lora_states[names] = t
        max_lora = str(self.engines[0].cfg.max_loras)
        for listed, last in list(self.lora_states.items()):
            if last < t - 600:
                del self.lora_states[listed]
                continue
            labels = (
                *target,
                ("max_lora", max_lora),
                ("running_lora_adapters", listed),
                ("waiting_lora_adapters", listed),
            )
            rec.sample(fam.name, fam.type, fam.help, tuple(sorted(labels)), t, last)

    def _record_sglang(
        self, rec: Recorder, t: float, model: tuple[tuple[str, str], ...], target: dict[str, str]
    ) -> None:
        """SGLang's exposition: each scheduler (data-parallel rank), the tokenizer, the HTTP
        middleware and the CPU monitors."""
        interval = max(1.0, t - self.last_scrape)
        self.last_scrape = t
        self.scrapes += 1
        dp = len(self.engines) > 1
        for i, (engine, sm) in enumerate(zip(self.engines, self.sched, strict=True)):
            pid = str(1000 + int(self.started_at) % 50000 + i)  # a process per scheduler
            rank = str(i) if dp else None
            sgm.record_scheduler(rec, t, model, engine, sm, interval, pid, rank)
        sgm.record_tokenizer(rec, t, model, self.tok)
        cpu = (self.cpu_seconds, self.detok_cpu)
        sgm.record_http(rec, t, labels_of(**target), self.http, self.scrapes, cpu)

    def _record_http(self, rec: Recorder, t: float, target: dict[str, str]) -> None:
        # prometheus-fastapi-instrumentator creates a (handler, status) series at its first
        # answer of that status: a server that never refused anything has no 4xx series.
        fam = X.HTTP_REQUESTS
        for (handler, status), count in sorted(self.http.items()):
            lb = labels_of(handler=handler, method="POST", status=status, **target)
            rec.sample(fam.name, fam.type, fam.help, lb, t, count)
        for handler in sorted(self.http_duration):
            lb = labels_of(handler=handler, **target)
            count, size = self.http_size[handler]
            rec.sample_summary(
                X.HTTP_REQUEST_SIZE.name, X.HTTP_REQUEST_SIZE.help, lb, t, count, size
            )
            # Streamed responses have no Content-Length; the instrumentator observes 0.
            rec.sample_summary(
                X.HTTP_RESPONSE_SIZE.name, X.HTTP_RESPONSE_SIZE.help, lb, t, count, 0.0
            )
            lb = labels_of(handler=handler, method="POST", **target)
            rec.sample_histogram(
                X.HTTP_DURATION.name, X.HTTP_DURATION.help, lb, t, self.http_duration[handler]
            )
        if self.http_duration:
            rec.sample_histogram(
                X.HTTP_DURATION_HIGHR.name,
                X.HTTP_DURATION_HIGHR.help,
                labels_of(**target),
                t,
                self.http_highr,
            )

    def dcgm_target(self) -> dict[str, str]:
        return {"job": "dcgm", "instance": f"{self.s.node}:9400"}

    def record_dcgm(self, rec: Recorder, t: float, interval: float, target: bool = True) -> None:
        """dcgm-exporter on the server's node, with its Kubernetes pod mapping where there is
        one (its own labels); ``target`` adds the scrape's ``job`` and ``instance``."""
        s = self.s
        vllm_mib = (s.gpu.memory_bytes * s.engine.gpu_memory_utilization / 2**20) if self.up else 0
        used_mib = vllm_mib + self.fault.other_process_gb * GB / 2**20
        util = []
        for i in range(max(1, s.engines) * s.engine.tensor_parallel):
            engine_idx = min(i // s.engine.tensor_parallel, len(self.busy) - 1)
            up = self.up and self.busy
            util.append(min(100.0, 100.0 * self.busy[engine_idx] / interval) if up else 0.0)
        pods = {"namespace": s.namespace, "pod": s.pod, "container": s.runtime}
        labels = {"Hostname": s.node, **(pods if s.kubernetes else {})}
        labels |= self.dcgm_target() if target else {}
        errors = self.gpu_errors if self.fault.gpu_faulty_instances > 0 else None
        dcgm.record(rec, t, s.gpu, util, used_mib, s.pod, labels, errors)
        self.busy = [0.0] * len(self.busy)
