"""The node under a simulated server's pod, as kube-state-metrics and node-exporter see it, and
the two ways a node takes a server down with it.

**Eviction under node pressure** (``fault.evicted_instances``: the model's first N servers): a
neighbour on the node (a batch job, a pod with no memory limit) takes its memory, and the
node's available memory falls past the kubelet's hard eviction threshold over
``PRESSURE_RAMP``. The node reports MemoryPressure and the kubelet evicts the pod that uses the
most memory over its request: the server's (Burstable, its request below what it holds). The
pod ends in phase Failed with reason Evicted (kube-state-metrics keeps reporting it, a Failed
pod is not deleted), its target leaves service discovery, and its Deployment's replacement
pod starts on another node, a target never seen before. The condition stays true for the
kubelet's pressure transition period after the memory came back.

**A lost node** (``fault.lost_instances``: a spot reclaim, a node that fails): the node stops at
once with everything on it. Every target on it - the server's and node-exporter's - fails its
scrapes; the node controller marks the node's Ready condition Unknown after its grace period;
the cloud's node controller deletes the node (its kube-state-metrics series end) and the pod
garbage collector its pods (their series and targets end). The replacement pod waits, Pending
and unscheduled, for a new node from the autoscaler, then loads the model.

Each happens once per server. A server's node and pods are written only with
``kube_exporters``; node-exporter is scraped on every node there (a DaemonSet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diagnoser.hardware.presets import GB
from diagnoser.metrics import exporters as X
from diagnoser.metrics import platform as P
from diagnoser.metrics.exposition import Recorder, labels_of
from diagnoser.sim.platform import Container, record_pod

if TYPE_CHECKING:
    from diagnoser.sim.engine import Request

INF = float("inf")
NODE_EXPORTER_PORT = 9100
NODE_MEMORY_GB = 256.0  # the host's memory (MemTotal)
OTHER_GB = 40.0  # the system, the kubelet and the other pods on the node, normally
# The kubelet's hard eviction threshold on memory.available, as a share of the node's memory.
EVICTION_SHARE = 0.05
PRESSURE_RAMP = 150.0  # seconds for the neighbour to take the node's memory to the threshold
# The kubelet's --eviction-pressure-transition-period: the condition stays that long after.
PRESSURE_TRANSITION = 300.0
READY_UNKNOWN_AFTER = 40.0  # the node controller's node-monitor-grace-period
NODE_DELETED_AFTER = 100.0  # the cloud's node controller deletes a node whose instance is gone
PODS_DELETED_AFTER = 150.0  # the pod garbage collector deletes the pods of a deleted node
NEW_NODE_AFTER = 360.0  # the autoscaler's new node (a GPU node: minutes) is ready
RESCHEDULE_SECONDS = 30.0  # an evicted pod's replacement scheduled and its image pulled
KSM_TARGET = {"job": "kube-state-metrics", "instance": "kube-state-metrics:8080"}
CONDITIONS = ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")


@dataclass
class Node:
    """One node: when a neighbour began taking its memory, when the kubelet evicted the
    server's pod, when the node was lost (``INF``: never)."""

    name: str
    pressure_from: float = INF
    pressure_at: float = INF  # when available memory fell past the threshold
    evicted_at: float = INF
    lost_at: float = INF
    taken: float = 0.0  # bytes the neighbour takes, at most

    def squeeze(self, t: float, server_bytes: float) -> None:
        """A neighbour begins taking the node's memory at ``t``: over ``PRESSURE_RAMP`` it
        leaves 80% of the threshold available."""
        total, threshold = NODE_MEMORY_GB * GB, EVICTION_SHARE * NODE_MEMORY_GB * GB
        normal = total - OTHER_GB * GB - server_bytes
        self.pressure_from = t
        self.taken = max(0.0, normal - 0.8 * threshold)
        self.pressure_at = t + PRESSURE_RAMP * (normal - threshold) / max(self.taken, 1.0)

    def available(self, t: float, server_bytes: float) -> float:
        """node-exporter's MemAvailable at ``t`` with the server holding ``server_bytes``."""
        normal = (NODE_MEMORY_GB - OTHER_GB) * GB - server_bytes
        if t < self.pressure_from:
            return normal
        return normal - self.taken * min(1.0, (t - self.pressure_from) / PRESSURE_RAMP)

    def evicts(self, t: float) -> bool:
        """The kubelet evicts the server's pod at ``t``: available memory is past the
        threshold."""
        return self.evicted_at == INF and t >= self.pressure_at

    def memory_pressure(self, t: float) -> bool:
        """The MemoryPressure condition: from when available memory fell past the threshold
        until the transition period after the eviction gave it back."""
        return self.pressure_at <= t < self.evicted_at + PRESSURE_TRANSITION

    def reported(self, t: float) -> bool:
        """kube-state-metrics still has the node (not deleted)."""
        return t < self.lost_at + NODE_DELETED_AFTER

    def scraped(self, t: float) -> bool:
        """node-exporter's target is still discovered (its pod not yet garbage-collected)."""
        return t < self.lost_at + PODS_DELETED_AFTER


@dataclass
class GonePod:
    """An evicted pod that kube-state-metrics still reports (Failed, Evicted): its labels, its
    node and its container's restarts when it ended."""

    pod: dict[str, str]
    node: str
    restarts: int


@dataclass
class Placement:
    """Where a server's pod runs: its node, the nodes and evicted pods still reported, and
    until when its current pod waits unscheduled for a node."""

    node: Node
    root: str
    old_nodes: list[Node] = field(default_factory=list)
    gone_pods: list[GonePod] = field(default_factory=list)
    pending_until: float = -INF
    moves: int = 0

    def pending(self, t: float) -> bool:
        """The current pod waits for a node: no IP, no target, no node."""
        return t < self.pending_until

    def dark(self, t: float) -> bool:
        """Nothing on the server's node answers: lost and not yet replaced, or pending."""
        return self.node.lost_at <= t or self.pending(t)

    def move(self, until: float) -> str:
        """The next pod goes to a new node, ready at ``until``; returns the node's name."""
        self.moves += 1
        if self.node.lost_at == INF:
            self.old_nodes.append(self.node)
        self.node = Node(f"{self.root}-n{self.moves}")
        self.pending_until = until
        return self.node.name


def record_node(rec: Recorder, t: float, node: Node, server_bytes: float) -> None:
    """One scrape of a node: kube-state-metrics' node series while the node exists, and
    node-exporter's on it (its ``up``, and its memory while it answers) while its target is
    discovered."""
    if node.reported(t):
        ksm = {"node": node.name, **KSM_TARGET}
        fam = P.NODE_INFO
        info = labels_of(**ksm, internal_ip=node.name, provider_id=f"cloud:///{node.name}")
        rec.sample(fam.name, fam.type, fam.help, info, t, 1.0)
        ready = "unknown" if t >= node.lost_at + READY_UNKNOWN_AFTER else "true"
        pressure = node.memory_pressure(t) and ready != "unknown"
        states = {"Ready": ready, "MemoryPressure": "true" if pressure else "false"}
        fam = P.NODE_CONDITION
        for condition in CONDITIONS:
            # Once the kubelet stops reporting, every condition reads Unknown.
            now = states.get(condition, "false") if ready != "unknown" else "unknown"
            for status in ("true", "false", "unknown"):
                lb = labels_of(**ksm, condition=condition, status=status)
                rec.sample(fam.name, fam.type, fam.help, lb, t, float(status == now))
    if not node.scraped(t):
        return
    target = labels_of(job="node-exporter", instance=f"{node.name}:{NODE_EXPORTER_PORT}")
    answers = t < node.lost_at
    rec.sample(X.UP.name, X.UP.type, X.UP.help, target, t, float(answers))
    if not answers:
        return
    for fam, value in (
        (P.NODE_MEM_TOTAL, NODE_MEMORY_GB * GB),
        (P.NODE_MEM_AVAILABLE, node.available(t, server_bytes)),
    ):
        rec.sample(fam.name, fam.type, fam.help, target, t, value)


# ``server`` below is a ``sim.server.Server`` (which imports this module, so it is not named).
def events(server: Any, t: float) -> list[Request] | None:
    """The server's node evicts its pod under memory pressure, or is lost with it, at ``t``:
    the requests the server held; None where nothing happened. Once per server: its first
    node only (``fault.evicted_instances``, ``fault.lost_instances``)."""
    f, place, s = server.fault, server.placement, server.s
    node, first = place.node, place.moves == 0
    if first and s.ordinal < f.evicted_instances and node.pressure_from == INF and server.up:
        node.squeeze(t, server._working_set(t) or 0.0)
    if first and s.ordinal < f.lost_instances and node.lost_at == INF:
        node.lost_at = t
        lost: list[Request] = server.crash(t)
        server.down_until = INF  # until the pod is deleted and replaced
        return lost
    if server.up and node.evicts(t):
        node.evicted_at = t
        lost = server.crash(t)
        pod = {"namespace": s.namespace, "pod": s.pod, "container": s.runtime}
        place.gone_pods.append(GonePod(pod, node.name, server.container.restarts))
        _replace(server, t + RESCHEDULE_SECONDS)
        return lost
    if t >= node.lost_at + PODS_DELETED_AFTER:
        _replace(server, t + NEW_NODE_AFTER)
    return None


def _replace(server: Any, scheduled: float) -> None:
    """The Deployment's replacement pod, on a new node from ``scheduled`` on."""
    server.s.node = server.placement.move(scheduled)
    server._new_pod()
    server.down_until = scheduled + server.fault.restart_seconds


def record(rec: Recorder, t: float, place: Placement, limit_gb: float, used: float | None) -> None:
    """kube-state-metrics' evicted pods (a Failed pod is kept, and reported, until deleted)
    and every node the server ran on that still exists, with node-exporter on it; ``used``
    is the server's working set on its current node."""
    for gone in place.gone_pods:
        ended = Container(started=INF, restarts=gone.restarts)
        record_pod(rec, t, ended, gone.pod, gone.node, limit_gb, None, "", "Failed", "Evicted")
    for old in place.old_nodes:
        record_node(rec, t, old, 0.0)
    if not place.pending(t):
        record_node(rec, t, place.node, used or 0.0)
