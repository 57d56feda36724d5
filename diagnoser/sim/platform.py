"""What the platform's exporters say about a simulated server's pod: kube-state-metrics (the
container's restarts, why it last ended, why it waits, its memory limit, the pod's phase and
node) and cAdvisor (the container's working set, its OOM events), as each exporter exposes
them and Prometheus stores them (each exporter a scrape target of its own).

A pod's series are born with the pod: a new pod (a Deployment's rollout) starts again from no
restarts and no last state. A container's working set climbs from ``fault.host_memory_gb`` at
``fault.host_memory_growth_gb_per_min`` from its start (host memory outside the GPU: swap space
for offloaded KV, CPU-offloaded weights, tokenizer and multimodal workers); at
``fault.memory_limit_gb`` the kernel kills it (OOMKilled, exit 137) and the kubelet restarts
it after its crash-loop back-off. A container that cannot start (``fault.start_failure``,
one of kube-state-metrics' waiting reasons) waits with that reason for as long as it lasts.
A container whose engine hangs for ``fault.liveness_kill_seconds`` fails its liveness probe
and the kubelet kills it (reason Error, exit 137) and starts it again after its back-off; a
server that cannot fit its KV cache exits with an error (reason Error, exit 1) at each start.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.hardware.presets import GB
from diagnoser.metrics import platform as P
from diagnoser.metrics.exposition import Recorder, labels_of
from diagnoser.metrics.family import Family

KSM_TARGET = {"job": "kube-state-metrics", "instance": "kube-state-metrics:8080"}
OOM_EXIT = 137
# How long the first failed pull of an image reads ErrImagePull before the kubelet backs off.
IMAGE_PULL_FIRST = 30.0
# The kubelet's crash-loop back-off: 10 s after the first crash, doubling, at most 5 minutes.
BACKOFF_FIRST, BACKOFF_MAX = 10.0, 300.0
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


@dataclass
class Container:
    """One pod's serving container as the kubelet reports it."""

    started: float  # when the current container started: its working set climbs from here
    restarts: int = 0
    last_reason: str = ""  # the last termination's reason ("" before the first)
    exit_code: int = 0
    oom_events: int = 0
    crashed_at: float = float("-inf")
    hung_since: float | None = None  # since when its liveness probe has failed
    start_failed_since: float | None = None  # since when it cannot start

    def working_set(self, t: float, base_gb: float, growth_gb_per_min: float) -> float:
        """Bytes the container holds in host memory at ``t``."""
        return (base_gb + growth_gb_per_min * max(0.0, t - self.started) / 60.0) * GB

    def oom_killed(self, t: float) -> None:
        self.ended(t, "OOMKilled", OOM_EXIT)
        self.oom_events += 1

    def ended(self, t: float, reason: str, exit_code: int) -> None:
        """The container ended at ``t`` (kube-state-metrics' last terminated reason and exit
        code): the kubelet counts a restart and backs off before the next start."""
        self.restarts += 1
        self.last_reason, self.exit_code = reason, exit_code
        self.crashed_at = t

    @property
    def backoff(self) -> float:
        """The kubelet's wait after the last crash before it starts the container again."""
        return min(BACKOFF_MAX, BACKOFF_FIRST * 2.0 ** max(0, self.restarts - 1))

    def backing_off(self, t: float) -> bool:
        """In CrashLoopBackOff at ``t``: waiting out the back-off after its last crash."""
        return bool(self.crashed_at <= t < self.crashed_at + self.backoff)

    def cannot_start(self, t: float, failure: str) -> bool:
        """Whether it cannot start at ``t`` (``failure``: a waiting reason, "" if it can)."""
        if not failure:
            self.start_failed_since = None
            return False
        if self.start_failed_since is None:
            self.start_failed_since = t
        return True

    def liveness_fails(self, t: float, hung: bool, budget: float) -> bool:
        """Whether its liveness probe has failed for ``budget`` seconds at ``t`` (0: no probe
        that a hung engine fails): then the kubelet kills it (``killed_by_kubelet``)."""
        if not (hung and budget > 0):
            self.hung_since = None
            return False
        if self.hung_since is None:
            self.hung_since = t
        return t - self.hung_since >= budget

    def killed_by_kubelet(self, t: float) -> None:
        """SIGKILL after the grace period: reason Error, exit code 137."""
        self.hung_since = None
        self.ended(t, "Error", 137)

    def waiting(self, t: float, running: bool, failure: str) -> str:
        """kube-state-metrics' waiting reason at ``t`` ("" while it runs or is being created)."""
        if running:
            return ""
        if self.start_failed_since is not None:
            return start_waiting(failure, self.start_failed_since, t)
        return "CrashLoopBackOff" if self.backing_off(t) else ""


def start_waiting(failure: str, since: float, t: float) -> str:
    """kube-state-metrics' waiting reason at ``t`` of a container that cannot start since
    ``since`` (``failure``, one of ``START_FAILURES``): an image that cannot be pulled reads
    ErrImagePull at the first attempt, then ImagePullBackOff while the kubelet backs off;
    a configuration error reads the same at every attempt."""
    if failure == "ImagePullBackOff" and t - since < IMAGE_PULL_FIRST:
        return "ErrImagePull"
    return failure


def record_pod(
    rec: Recorder,
    t: float,
    c: Container,
    pod: dict[str, str],
    node: str,
    limit_gb: float,
    working_set: float | None,
    waiting: str,
    phase: str = "",
    reason: str = "",
) -> None:
    """One scrape of kube-state-metrics' and cAdvisor's series about a pod (``pod``: its
    namespace, name and container); ``working_set`` is None while no container runs;
    ``phase`` and ``reason`` the pod's own where it has ended (an eviction: Failed, Evicted);
    ``node`` is empty while the pod waits unscheduled."""
    ns, name, container = pod["namespace"], pod["pod"], pod["container"]
    uid = f"uid-{name}"
    ksm = {"namespace": ns, "pod": name, "uid": uid, **KSM_TARGET}

    def put(fam: Family, value: float, **labels: str) -> None:
        rec.sample(fam.name, fam.type, fam.help, labels_of(**ksm, **labels), t, value)

    put(
        P.POD_INFO,
        1.0,
        node=node,
        host_ip=node,
        pod_ip="10.0.0.1" if node else "",
        created_by_kind="ReplicaSet",
        created_by_name=name.rsplit("-", 1)[0],
    )
    # Running once its container has started, crash loop or not; Pending until then.
    phase_now = phase or ("Running" if working_set is not None or c.restarts else "Pending")
    for each in PHASES:
        put(P.POD_PHASE, float(each == phase_now), phase=each)
    for each in P.POD_REASONS:
        put(P.POD_REASON, float(each == reason), reason=each)
    put(P.RESTARTS, float(c.restarts), container=container)
    if c.last_reason:
        put(P.LAST_TERMINATED_REASON, 1.0, container=container, reason=c.last_reason)
        put(P.LAST_TERMINATED_EXITCODE, float(c.exit_code), container=container)
    if waiting:
        put(P.WAITING_REASON, 1.0, container=container, reason=waiting)
    if limit_gb > 0:
        put(
            P.CONTAINER_LIMITS,
            limit_gb * GB,
            container=container,
            node=node,
            resource="memory",
            unit="byte",
        )
    if working_set is None:
        return
    # cAdvisor on the node's kubelet: the container's cgroup, while it exists.
    cadvisor = labels_of(
        namespace=ns,
        pod=name,
        container=container,
        id=f"/kubepods/pod{uid}/{container}",
        image="vllm/vllm-openai",
        name=f"k8s_{container}_{name}",
        job="kubelet",
        instance=f"{node}:10250",
    )
    fam = P.CONTAINER_WORKING_SET
    rec.sample(fam.name, fam.type, fam.help, cadvisor, t, working_set)
    fam = P.CONTAINER_OOM_EVENTS
    rec.sample(fam.name, fam.type, fam.help, cadvisor, t, float(c.oom_events))
