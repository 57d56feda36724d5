"""PromQL builders that join the platform's series to the models: kube-state-metrics' and
cAdvisor's through the pod they describe, node-exporter's through its host, kube-state-metrics'
node conditions through the pods on the node (docs/platform.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from diagnoser.metrics import engines
from diagnoser.metrics.platform import POD_INFO, WITNESS
from diagnoser.metrics.promql import (
    GPU_HOST_LABEL,
    GPU_JOIN_LABELS,
    HAS_POD,
    Expr,
    Scope,
    _labels,
    agg,
    host_of,
    selector,
)
from diagnoser.metrics.promql import up as scraped

# A per-series vector over platform families, each selected with these matchers (a tuple, to
# which the builder adds its own).
PlatformExpr = Callable[[tuple[str, ...]], str]
# How long a pod or host is remembered as serving its model: the servers' own series stop with
# them, and the platform says why for a while after (a crash loop, an eviction).
PLATFORM_MEMORY = "1h"


def pod_model_map(scope: Scope, memory: str = PLATFORM_MEMORY) -> str:
    """(namespace, pod) -> model_name of the servers with a pod that served within ``memory``
    (``last_over_time``: a pod whose server is down or restarting still maps to its model)."""
    series = " or ".join(
        f"last_over_time({selector(m, scope.matchers, HAS_POD)}[{memory}])"
        for m in engines.running_gauges()
    )
    labels = _labels(*GPU_JOIN_LABELS, *scope.group_labels(), "model_name")
    return f"group by ({labels}) ({series})"


def on_pods(inner: PlatformExpr, fn: str = "max") -> Expr:
    """A series about a pod or its containers (kube-state-metrics, cAdvisor) joined to the
    model its pod served, ``fn`` by the scope; series of pods that served no model of the
    scope find no match."""

    def build(scope: Scope) -> str:
        pods = _labels(*GPU_JOIN_LABELS, *scope.group_labels())
        joined = f"({inner((HAS_POD,))}) * on ({pods}) group_left (model_name) "
        return agg(fn, scope, joined + pod_model_map(scope))

    return build


def host_model_map(scope: Scope, memory: str = PLATFORM_MEMORY) -> str:
    """host -> model_name: in Kubernetes through the pod's node address (kube-state-metrics'
    ``host_ip``, which is node-exporter's host), elsewhere through the host part of the vLLM
    server's instance. A host serving several models is left out (which model a host's memory
    belongs to cannot be told)."""
    hosts = _labels(GPU_HOST_LABEL, *scope.group_labels())
    pods = _labels(*GPU_JOIN_LABELS, *scope.group_labels())
    info = f'label_replace({POD_INFO.name}{{{HAS_POD}}}, "host", "$1", "host_ip", "(.+)")'
    in_pods = f"{info} * on ({pods}) group_left (model_name) {pod_model_map(scope, memory)}"
    bare = " or ".join(
        host_of(f"last_over_time({selector(m, scope.matchers)}[{memory}])")
        for m in engines.running_gauges()
    )
    models = f"group by ({hosts}, model_name) ({in_pods} or {bare})"
    return f"({models} unless on ({hosts}) (count by ({hosts}) ({models}) > 1))"


def on_hosts(inner: PlatformExpr, fn: str = "max") -> Expr:
    """A node-exporter series (labelled by its ``instance``, host:port) joined to the model
    served on its host, ``fn`` by the scope."""

    def build(scope: Scope) -> str:
        hosts = _labels(GPU_HOST_LABEL, *scope.group_labels())
        joined = f"{host_of(f'({inner(())})')} * on ({hosts}) group_left (model_name) "
        return agg(fn, scope, joined + host_model_map(scope))

    return build


def on_nodes(inner: PlatformExpr, fn: str = "max") -> Expr:
    """A kube-state-metrics node series (labelled ``node``) joined to the pods on that node
    (``kube_pod_info``) and through them to their models, ``fn`` by the scope."""

    def pods_on(matchers: tuple[str, ...]) -> str:
        return f"{selector(POD_INFO.name, matchers)} * on (node) group_left () ({inner(())})"

    return on_pods(pods_on, fn)


def on_targets(inner: PlatformExpr) -> Expr:
    """A series about a pod's containers (kube-state-metrics) read on each scrape target of
    that pod (service discovery's ``namespace`` and ``pod`` on ``up``), by target: 1 where the
    target is down and ``inner`` has a series for its pod, 0 where kube-state-metrics knows
    the pod otherwise (a sidecar that waits beside a server that answers is not the server's).
    A target that never served (a rollout's new pod) has no model to be joined through, only
    its ``up``."""

    def build(scope: Scope) -> str:
        pods = _labels(*GPU_JOIN_LABELS)
        up = scraped(replace(scope, matchers=(*scope.matchers, HAS_POD)))
        known = f"max by ({pods}) ({selector(POD_INFO.name, (HAS_POD,))}) * 0"
        per_pod = f"sgn(max by ({pods}) ({inner((HAS_POD,))})) or {known}"
        down = f"({up} == bool 0)"
        return f"max by (job, instance) ({down} * on ({pods}) group_left () ({per_pod}))"

    return build


def exporters_scraped(span: str) -> str:
    """One series for each of the platform's exporters (label ``exporter``) that served its
    witness family (``platform.WITNESS``) anywhere within ``span`` before the query's time:
    an instant query that reads only those few series."""
    return " or ".join(
        f'label_replace(group(last_over_time({family}[{span}])), "exporter", "{exporter}", "", "")'
        for exporter, family in WITNESS.items()
    )


def by_target(inner: PlatformExpr, fn: str = "max", keep: str = "") -> Expr:
    """A series about a pod or its containers read on each scrape target of that pod, ``fn``
    by target (and by the label ``keep``, such as a waiting ``reason``): the pod's own series
    through service discovery's ``namespace`` and ``pod`` on ``up``, so a pod that never
    served (no model to be joined through) is read too. With ``keep``, a pod's value is the
    one of its series that reads highest (``topk``: two containers with two reasons would
    otherwise match a target twice)."""

    def build(scope: Scope) -> str:
        pods = _labels(*GPU_JOIN_LABELS)
        up = scraped(replace(scope, matchers=(*scope.matchers, HAS_POD)))
        targets = f"group by (job, instance, {pods}) ({up})"
        per_pod = (
            f"{fn} by ({_labels(*GPU_JOIN_LABELS, *filter(None, (keep,)))}) ({inner((HAS_POD,))})"
        )
        if keep:
            per_pod = f"topk by ({pods}) (1, {per_pod})"
        by = _labels("job", "instance", *filter(None, (keep,)))
        return f"{fn} by ({by}) ({targets} * on ({pods}) group_left ({keep}) {per_pod})"

    return build
