"""The families of the platform a vLLM server runs on, as their exporters declare them:
kube-state-metrics (the Kubernetes objects: containers' restarts and reasons, pods' phase and
reason, nodes' conditions, containers' limits), cAdvisor (the kubelet's container usage) and
node-exporter (the host's memory and its OOM killer). They are rows of the one table too:
:mod:`diagnoser.metrics.families` registers and re-exports them.

Names, types, help texts and labels are each exporter's own (the versions read are in
``PLATFORM_SOURCES`` and in docs/platform.md). A platform series is joined to the vLLM
servers through the pod it describes (``namespace``, ``pod``), or through its host; where none
of these exporters is scraped, nothing reads differently.
"""

from __future__ import annotations

from diagnoser.metrics.family import PROVIDERS, Family, register

__all__ = [
    "CONTAINER_LIMITS",
    "CONTAINER_OOM_EVENTS",
    "CONTAINER_WORKING_SET",
    "KILL_EXITS",
    "KSM_POD_LABELS",
    "LAST_TERMINATED_EXITCODE",
    "LAST_TERMINATED_REASON",
    "NODE_CONDITION",
    "NODE_INFO",
    "NODE_MEM_AVAILABLE",
    "NODE_MEM_TOTAL",
    "NODE_OOM_KILLS",
    "PLATFORM_SOURCES",
    "POD_INFO",
    "POD_PHASE",
    "POD_REASON",
    "POD_REASONS",
    "RESTARTS",
    "START_FAILURES",
    "WAITING_REASON",
    "WITNESS",
]

_C, _G = "counter", "gauge"
KSM, CADVISOR, NODE_EXPORTER = "kube-state-metrics", "cadvisor", "node-exporter"

# Where each exporter's names were read, and which version: the reference the table is held to.
PLATFORM_SOURCES = {
    KSM: "kube-state-metrics v2 (docs/metrics/workload/pod-metrics.md and "
    "docs/metrics/cluster/node-metrics.md at commit 04ee634c; kube_node_info's labels from "
    "node-metrics.md at commit 08c753e5, the pod status reasons from internal/store/pod.go)",
    CADVISOR: "cAdvisor as the kubelet serves it on /metrics/cadvisor "
    "(metrics/prometheus.go: container_memory_working_set_bytes, container_oom_events_total)",
    NODE_EXPORTER: "prometheus/node_exporter 1.x (meminfo and vmstat collectors; Debian's "
    "prometheus-node-exporter); oom_kill is in vmstat's default --collector.vmstat.fields",
}
PROVIDERS.update(
    {
        KSM: "kube-state-metrics (joined by namespace and pod)",
        CADVISOR: "cAdvisor, the kubelet's /metrics/cadvisor (joined by namespace and pod)",
        NODE_EXPORTER: "node-exporter (joined by host)",
    }
)


def _o(name: str, type_: str, provider: str, help_: str, labels: tuple[str, ...]) -> Family:
    return register(Family(name, type_, provider, help_, labels=labels))


# --- kube-state-metrics --------------------------------------------------------------------
# Every pod series carries the pod's namespace, name and uid; a container's adds its name.
KSM_POD_LABELS = ("namespace", "pod", "uid")
_CONTAINER = ("container", *KSM_POD_LABELS)
RESTARTS = _o(
    "kube_pod_container_status_restarts_total",
    _C,
    KSM,
    "The number of container restarts per container.",
    _CONTAINER,
)
LAST_TERMINATED_REASON = _o(
    "kube_pod_container_status_last_terminated_reason",
    _G,
    KSM,
    "Describes the last reason the container was in terminated state.",
    (*_CONTAINER, "reason"),
)
LAST_TERMINATED_EXITCODE = _o(
    "kube_pod_container_status_last_terminated_exitcode",
    _G,
    KSM,
    "Describes the exit code for the last container in terminated state.",
    _CONTAINER,
)
WAITING_REASON = _o(
    "kube_pod_container_status_waiting_reason",
    _G,
    KSM,
    "Describes the reason the container is currently in waiting state.",
    (*_CONTAINER, "reason"),
)
POD_PHASE = _o(
    "kube_pod_status_phase",
    _G,
    KSM,
    "The pods current phase.",
    (*KSM_POD_LABELS, "phase"),
)
POD_REASON = _o(
    "kube_pod_status_reason",
    _G,
    KSM,
    "The pod status reasons",
    (*KSM_POD_LABELS, "reason"),
)
POD_INFO = _o(
    "kube_pod_info",
    _G,
    KSM,
    "Information about pod.",
    (*KSM_POD_LABELS, "host_ip", "pod_ip", "node", "created_by_kind", "created_by_name"),
)
# kube-state-metrics writes every pod a series for each of these reasons (internal/store/pod.go),
# 1 for the pod's own status reason and 0 for the others.
POD_REASONS = ("Evicted", "NodeAffinity", "NodeLost", "Shutdown", "UnexpectedAdmissionError")
NODE_INFO = _o(
    "kube_node_info",
    _G,
    KSM,
    "Information about a cluster node.",
    ("node", "internal_ip", "provider_id"),
)
NODE_CONDITION = _o(
    "kube_node_status_condition",
    _G,
    KSM,
    "The condition of a cluster node.",
    ("node", "condition", "status"),
)
CONTAINER_LIMITS = _o(
    "kube_pod_container_resource_limits",
    _G,
    KSM,
    "The number of requested limit resource by a container.",
    ("resource", "unit", *_CONTAINER, "node"),
)
# The waiting reasons of a container that cannot start at all (as against CrashLoopBackOff,
# one that starts and dies): its image, or its configuration.
START_FAILURES = (
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
)
# The exit codes of a container killed from outside by a signal (128 + the signal): SIGKILL
# once the grace period ran out, SIGTERM where the process exits on it. With the reason Error
# (not OOMKilled) they are the kubelet's kill after a failed liveness probe.
KILL_EXITS = (137, 143)

# --- cAdvisor (the kubelet) ------------------------------------------------------------------
_CADVISOR = ("container", "pod", "namespace", "id", "image", "name")
CONTAINER_WORKING_SET = _o(
    "container_memory_working_set_bytes",
    _G,
    CADVISOR,
    "Current working set in bytes.",
    _CADVISOR,
)
CONTAINER_OOM_EVENTS = _o(
    "container_oom_events_total",
    _C,
    CADVISOR,
    "Count of out of memory events observed for the container",
    _CADVISOR,
)

# --- node-exporter ---------------------------------------------------------------------------
NODE_MEM_AVAILABLE = _o(
    "node_memory_MemAvailable_bytes",
    _G,
    NODE_EXPORTER,
    "Memory information field MemAvailable_bytes.",
    (),
)
NODE_MEM_TOTAL = _o(
    "node_memory_MemTotal_bytes",
    _G,
    NODE_EXPORTER,
    "Memory information field MemTotal_bytes.",
    (),
)
# node-exporter exposes /proc/vmstat's fields untyped; oom_kill only ever counts up.
NODE_OOM_KILLS = _o(
    "node_vmstat_oom_kill",
    "untyped",
    NODE_EXPORTER,
    "/proc/vmstat information field oom_kill.",
    (),
)


# One family each exporter serves whenever it is scraped: where none of its series is in the
# store over a diagnosis's span, the exporter is not scraped there, and nothing of it is asked.
WITNESS = {
    KSM: POD_INFO.name,
    CADVISOR: CONTAINER_WORKING_SET.name,
    NODE_EXPORTER: NODE_MEM_TOTAL.name,
}
