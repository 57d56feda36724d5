"""What the platform says about the servers: kube-state-metrics (restarts, why a container last
ended, why it waits, evictions, nodes' conditions, memory limits), cAdvisor (memory against
the limit, OOM events), node-exporter (the host's memory and OOM kills) and DCGM's
uncorrectable errors, each joined to the models through the pod it describes or its host
(``promql_platform``; DCGM's through ``promql.on_gpus``).

Each is read where its exporter is scraped; where it is not, the signal has no series and
reads as no data, never as zero."""

from __future__ import annotations

from diagnoser.metrics import exporters
from diagnoser.metrics import platform as P
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_platform as pq
from diagnoser.metrics.signals.base import TARGET, Signal, everywhere

# A count of events (restarts, OOM kills) is read over five minutes at least, as the servers'
# own restart count is, so that one event stays counted for as long as an alert counts it.
EVENT_WINDOW = 300.0
_MEMORY = 'resource="memory"'


def _ksm(family: str, *matchers: str) -> pq.PlatformExpr:
    return lambda sel: q.selector(family, (*sel, *matchers))


def _reason(family: str, reasons: tuple[str, ...]) -> pq.PlatformExpr:
    pick = f'reason="{reasons[0]}"' if len(reasons) == 1 else f'reason=~"{"|".join(reasons)}"'
    return _ksm(family, pick)


def _increase(fn: str, family: str, host: bool = False) -> q.Expr:
    """The increase of a platform counter over the scope's window, joined to the models
    through its pod (or, ``host``, its host)."""

    def build(scope: q.Scope) -> str:
        def inner(sel: tuple[str, ...]) -> str:
            return f"increase({q.selector(family, sel)}[{scope.window}])"

        join = pq.on_hosts(inner, fn) if host else pq.on_pods(inner, fn)
        return join(scope)

    return build


def _kills_at_down(scope: q.Scope) -> str:
    """Per model, the OOM kills node-exporter counted over the window on each host of its
    servers where a target of the model went down (or came back) within the same window, 0
    for every other host node-exporter is scraped on: a kill as a server on its host went
    down, joined by the host part of their instances (``on_hosts``)."""
    w = scope.window

    def inner(sel: tuple[str, ...]) -> str:
        kills = q.host_of(f"increase({q.selector(P.NODE_OOM_KILLS.name, sel)}[{w}])")
        ups = [q.selector("up", (*scope.target_matchers(), t)) for t in scope.targets]
        went = " or ".join(
            f"(min_over_time({up}[{w}]) == 0 and max_over_time({up}[{w}]) == 1)"
            for up in ups or [q.selector("up", scope.target_matchers())]
        )
        return f"(({kills} > 0) and on (host) {q.host_of(f'({went})')}) or ({kills} * 0)"

    return pq.on_hosts(inner, "sum")(scope)


def _limit_share(sel: tuple[str, ...]) -> str:
    keys = "namespace, pod, container"
    used = q.selector(P.CONTAINER_WORKING_SET.name, (*sel, 'container!=""'))
    limit = q.selector(P.CONTAINER_LIMITS.name, (*sel, _MEMORY))
    return f"{used} / on ({keys}) group_left () (max by ({keys}) ({limit}) > 0)"


def _available_share(sel: tuple[str, ...]) -> str:
    avail, total = (q.selector(f.name, sel) for f in (P.NODE_MEM_AVAILABLE, P.NODE_MEM_TOTAL))
    return f"{avail} / ({total} > 0)"


def _condition(condition: str, bad: str) -> pq.PlatformExpr:
    """1 for a node whose ``condition`` reads ``bad`` (``true`` or ``false``), 0 otherwise."""
    picked = (f'condition="{condition}"', 'status="true"')
    flag = 1 if bad == "true" else 0
    return lambda sel: f"{q.selector(P.NODE_CONDITION.name, (*sel, *picked))} == bool {flag}"


def _lost_with_node(sel: tuple[str, ...]) -> str:
    """1 for a pod (served within the platform's memory) whose node stopped reporting - its
    Ready condition Unknown, or the node gone from kube-state-metrics - and whose server's last
    scrape failed: it went down with its node. A pod drained before its node was removed (a
    scale-down) was last scraped up, so it reads 0; so does every pod while
    kube-state-metrics itself reports no node."""
    keys = "namespace, pod, uid, node"
    info = q.selector(P.POD_INFO.name, sel)
    pods = f"group by ({keys}) (last_over_time({info}[{pq.PLATFORM_MEMORY}]))"
    ready = 'condition="Ready"'
    unknown = q.selector(P.NODE_CONDITION.name, (ready, 'status="unknown"'))
    failed = f"last_over_time({q.selector(exporters.UP.name, sel)}[{pq.PLATFORM_MEMORY}]) == 0"
    reporting = f"group ({q.selector(P.NODE_CONDITION.name, (ready,))})"
    lost = (
        f"({pods} unless on (node) ({unknown} == 0)) and on (namespace, pod) ({failed}) "
        f"and on () {reporting}"
    )
    return f"({lost}) or ({pods} * 0)"


def _exporter_down(sel: tuple[str, ...]) -> str:
    """1 for a node-exporter target whose scrape fails (Prometheus' ``up``), 0 while it
    answers; a node-exporter is a target that served its memory family within the
    platform's memory, whatever its job is called."""
    seen = f"last_over_time({P.NODE_MEM_TOTAL.name}[{pq.PLATFORM_MEMORY}])"
    up = q.selector(exporters.UP.name, sel)
    return f"({up} == bool 0) * on (job, instance) group_left () group by (job, instance) ({seen})"


def _killed(sel: tuple[str, ...]) -> str:
    """1 for a container whose last end was a kill from outside: reason Error (not
    OOMKilled) with a signal's exit code (``KILL_EXITS``); 0 for every pod kube-state-metrics
    knows (so a scraped cluster reads 0, not no data)."""
    code = q.selector(P.LAST_TERMINATED_EXITCODE.name, sel)
    signalled = " or ".join(f"{code} == {c}" for c in P.KILL_EXITS)
    error = q.selector(P.LAST_TERMINATED_REASON.name, (*sel, 'reason="Error"'))
    known = q.selector(P.POD_INFO.name, sel)
    return f"(sgn({signalled}) and on (namespace, pod, container) {error}) or {known} * 0"


def _gpu_uncorrectable(sel: str) -> str:
    either = " or ".join(
        f"increase({f.name}{sel}[5m])"
        for f in (exporters.GPU_ECC_DBE, exporters.GPU_REMAPPED_UNCORRECTABLE)
    )
    return f"({either})"


def _restarts_in(scope: q.Scope) -> pq.PlatformExpr:
    return lambda sel: f"increase({q.selector(P.RESTARTS.name, sel)}[{scope.window}])"


def target_reads() -> dict[str, q.Expr]:
    """What kube-state-metrics says of each scrape target's own pod, by target
    (``pq.by_target``), for a pod that never served (a rollout's new pod, which no model
    series joins to): why its container waits and last ended (by ``reason``), its last exit
    code, whether that end was a kill from outside, its restarts over the window and its
    memory limit."""
    return {
        "waiting_reason": pq.by_target(_ksm(P.WAITING_REASON.name), keep="reason"),
        "terminated_reason": pq.by_target(_ksm(P.LAST_TERMINATED_REASON.name), keep="reason"),
        "container_exit_code": pq.by_target(_ksm(P.LAST_TERMINATED_EXITCODE.name)),
        "container_killed": pq.by_target(_killed),
        "container_restarts": lambda scope: pq.by_target(_restarts_in(scope))(scope),
        "container_memory_limit_bytes": pq.by_target(_ksm(P.CONTAINER_LIMITS.name, _MEMORY)),
    }


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "container_restarts",
            "restarts",
            "Restarts of the model's most restarted container (kube-state-metrics) over the "
            "rate window, five minutes at least.",
            everywhere(_increase("max", P.RESTARTS.name)),
            ("kube_container_restarts", "max"),
            least_window=EVENT_WINDOW,
        ),
        s(
            "container_oom_killed",
            "containers",
            "The model's containers whose last termination was OOMKilled (kube-state-metrics): "
            "the kernel killed them at their memory limit.",
            everywhere(pq.on_pods(_reason(P.LAST_TERMINATED_REASON.name, ("OOMKilled",)), "sum")),
            ("kube_container_oom_killed", "sum"),
        ),
        s(
            "container_error_exit",
            "containers",
            "The model's containers whose last termination was an error exit "
            "(kube-state-metrics' reason Error: the process exited non-zero or was killed).",
            everywhere(pq.on_pods(_reason(P.LAST_TERMINATED_REASON.name, ("Error",)), "sum")),
            ("kube_container_error_exit", "sum"),
        ),
        s(
            "container_exit_code",
            "code",
            "The last exit code of the model's containers (kube-state-metrics), the highest: "
            "137 is a SIGKILL (the OOM killer, or a liveness probe's kill after its grace).",
            everywhere(pq.on_pods(_ksm(P.LAST_TERMINATED_EXITCODE.name), "max")),
            ("kube_container_exit_code", "max"),
        ),
        s(
            "container_crash_looping",
            "containers",
            "The model's containers waiting in CrashLoopBackOff (kube-state-metrics): they "
            "start and die, and the kubelet waits longer before each start.",
            everywhere(pq.on_pods(_reason(P.WAITING_REASON.name, ("CrashLoopBackOff",)), "sum")),
            ("kube_container_crash_looping", "sum"),
        ),
        s(
            "container_start_failing",
            "containers",
            "The model's containers that cannot start at all (kube-state-metrics' waiting "
            "reason: the image cannot be pulled, or the container's configuration is wrong).",
            everywhere(pq.on_pods(_reason(P.WAITING_REASON.name, P.START_FAILURES), "sum")),
            ("kube_container_start_failing", "sum"),
        ),
        s(
            "container_killed",
            "containers",
            "The model's containers whose last termination was a kill from outside "
            "(kube-state-metrics: reason Error with exit code 137 or 143, SIGKILL or SIGTERM): "
            "the kubelet's kill after a failed liveness probe.",
            everywhere(pq.on_pods(_killed, "sum")),
            ("kube_container_killed", "sum"),
        ),
        s(
            "target_start_failing",
            "containers",
            "1 where the target is down and its pod has a container that cannot start "
            "(kube-state-metrics' waiting reason: the image cannot be pulled, or its "
            "configuration is wrong), 0 where kube-state-metrics knows the pod otherwise; read "
            "by target, through the pod on its up, so a new pod that never served is read too.",
            everywhere(pq.on_targets(_reason(P.WAITING_REASON.name, P.START_FAILURES))),
            ("kube_start_failing", "max"),
            by=TARGET,
        ),
        s(
            "target_killed",
            "containers",
            "1 where the target is down and its pod's container last ended killed from outside "
            "(kube-state-metrics: reason Error with exit code 137 or 143, the kubelet's kill "
            "after a failed liveness probe), 0 where kube-state-metrics knows the pod otherwise; "
            "read by target, as target_start_failing is.",
            everywhere(pq.on_targets(_killed)),
            ("kube_killed", "max"),
            by=TARGET,
        ),
        s(
            "target_crash_looping",
            "containers",
            "1 where the target is down and its pod has a container in CrashLoopBackOff "
            "(kube-state-metrics): it starts and dies, and the kubelet waits longer before each "
            "start; read by target, as target_start_failing is.",
            everywhere(pq.on_targets(_reason(P.WAITING_REASON.name, ("CrashLoopBackOff",)))),
            ("kube_crash_looping", "max"),
            by=TARGET,
        ),
        s(
            "pods_evicted",
            "pods",
            "The model's pods evicted by their node (kube-state-metrics' pod reason Evicted: "
            "the node ran short of memory or disk).",
            everywhere(pq.on_pods(_reason(P.POD_REASON.name, ("Evicted",)), "sum")),
            ("kube_pods_evicted", "sum"),
        ),
        s(
            "container_memory_limit_bytes",
            "bytes",
            "The memory limit of the model's containers (kube-state-metrics), the largest.",
            everywhere(pq.on_pods(_ksm(P.CONTAINER_LIMITS.name, _MEMORY), "max")),
            ("kube_container_memory_limit_bytes", "max"),
        ),
        s(
            "container_memory_limit_share",
            "ratio",
            "Working set over the memory limit (cAdvisor over kube-state-metrics), the fullest "
            "of the model's containers: at 1 the kernel kills the container.",
            everywhere(pq.on_pods(_limit_share, "max")),
            ("cadvisor_memory_limit", "share"),
        ),
        s(
            "container_oom_events",
            "events",
            "Out-of-memory events in the model's containers (cAdvisor) over the rate window, "
            "five minutes at least.",
            everywhere(_increase("sum", P.CONTAINER_OOM_EVENTS.name)),
            ("cadvisor_oom_events", "sum"),
            least_window=EVENT_WINDOW,
        ),
        s(
            "node_memory_available_share",
            "ratio",
            "Memory available on the hosts of the model's servers over their total "
            "(node-exporter), the lowest.",
            everywhere(pq.on_hosts(_available_share, "min")),
            ("node_memory_available", "share"),
        ),
        s(
            "node_oom_kills",
            "kills",
            "Processes the kernel's OOM killer killed on the hosts of the model's servers "
            "(node-exporter) over the rate window, five minutes at least.",
            everywhere(_increase("sum", P.NODE_OOM_KILLS.name, host=True)),
            ("node_oom_kills", "sum"),
            least_window=EVENT_WINDOW,
        ),
        s(
            "host_oom_kills_at_down",
            "kills",
            "Processes the kernel's OOM killer killed on a host of the model's servers "
            "(node-exporter) over the rate window, five minutes at least, where a target of the "
            "model on that host went down or came back within it; 0 on every other host "
            "node-exporter is scraped on. A kill as a server went down: which process it was, "
            "the count does not say.",
            everywhere(_kills_at_down),
            ("node_oom_kills_at_down", "sum"),
            least_window=EVENT_WINDOW,
        ),
        s(
            "node_not_ready",
            "pods",
            "The model's pods on a node that is not Ready (kube-state-metrics' node condition).",
            everywhere(pq.on_nodes(_condition("Ready", "false"), "sum")),
            ("kube_node_not_ready", "sum"),
        ),
        s(
            "node_memory_pressure",
            "pods",
            "The model's pods on a node under memory pressure (kube-state-metrics' node "
            "condition MemoryPressure): the kubelet evicts pods to relieve it.",
            everywhere(pq.on_nodes(_condition("MemoryPressure", "true"), "sum")),
            ("kube_node_memory_pressure", "sum"),
        ),
        s(
            "node_disk_pressure",
            "pods",
            "The model's pods on a node under disk pressure (kube-state-metrics' node condition "
            "DiskPressure: its filesystem or image store is nearly full): the kubelet evicts "
            "pods to relieve it, those with the most ephemeral storage first.",
            everywhere(pq.on_nodes(_condition("DiskPressure", "true"), "sum")),
            ("kube_node_disk_pressure", "sum"),
        ),
        s(
            "pods_failed",
            "pods",
            "The model's pods in phase Failed (kube-state-metrics): every container ended and "
            "none is restarted - an evicted pod, or one its node lost.",
            everywhere(pq.on_pods(_ksm(P.POD_PHASE.name, 'phase="Failed"'), "sum")),
            ("kube_pods_failed", "sum"),
        ),
        s(
            "nodes_lost",
            "pods",
            "The model's pods that went down with their node (kube-state-metrics: the node's "
            "Ready condition Unknown, or the node gone; the pod's server last scraped down): a "
            "spot reclaim, a node that failed or was cut off.",
            everywhere(pq.on_pods(_lost_with_node, "sum")),
            ("kube_nodes_lost", "sum"),
        ),
        s(
            "node_exporter_down",
            "hosts",
            "Hosts of the model's servers whose node-exporter cannot be scraped (Prometheus' "
            "up): with the servers on it down too, the host itself is gone or cut off.",
            everywhere(pq.on_hosts(_exporter_down, "sum")),
            ("node_exporter_down", "sum"),
        ),
        s(
            "gpu_uncorrectable_errors",
            "errors",
            "Uncorrectable memory errors on the model's GPUs (DCGM: volatile double-bit ECC "
            "errors where enabled, rows remapped for uncorrectable errors) over five minutes.",
            everywhere(q.on_gpus(_gpu_uncorrectable, fn="sum")),
            ("dcgm_uncorrectable_errors", "sum"),
        ),
    ]
