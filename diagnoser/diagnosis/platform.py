"""Why a model's servers went down, as the platform says it: read for the models that had a
target down or a restart, from kube-state-metrics, cAdvisor, node-exporter and DCGM where they
are scraped (``metrics.signals.platform``), and said in one phrase (``OOMKilled at the 64 GiB
limit at 03:12, 3 restarts``) that the health's reason carries.

Only models that went down pay for these queries; where none of the exporters is scraped the
phrase is None and the reason says which exporter would have named the cause."""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from diagnoser.catalog.shapes.base import events
from diagnoser.diagnosis.fetch import query
from diagnoser.diagnosis.targets import Target
from diagnoser.diagnosis.window import Window, rate_text
from diagnoser.metrics import families
from diagnoser.metrics.platform import KILL_EXITS, START_FAILURES, WITNESS
from diagnoser.metrics.promql_platform import exporters_scraped
from diagnoser.metrics.signals.base import Signal
from diagnoser.metrics.signals.platform import EVENT_WINDOW, target_reads
from diagnoser.plumbing.durations import parse_seconds
from diagnoser.plumbing.source import MetricSource, OverLimit, Series
from diagnoser.site import Site

# What is read, in the order a reason is looked for.
SIGNALS = (
    "pods_evicted",
    "node_memory_pressure",
    "container_oom_killed",
    "container_oom_events",
    "container_memory_limit_bytes",
    "container_restarts",
    "node_not_ready",
    "gpu_xid_last",
    "gpu_uncorrectable_errors",
    "container_start_failing",
    "container_crash_looping",
    "container_error_exit",
    "container_exit_code",
    "node_oom_kills",
)
# Said where nothing of the platform is scraped: which exporter would name the cause.
UNREAD = (
    "where scraped, kube-state-metrics' last terminated reason and exit code, or "
    "node-exporter's OOM kills off Kubernetes, would name it"
)
# Said of a rollout's new pods that never served where kube-state-metrics is not scraped.
NEVER_UNREAD = "where scraped, kube-state-metrics' waiting reason would name why"
# What each waiting reason a container cannot start for means.
_WAITING = {
    "ErrImagePull": "its image cannot be pulled",
    "ImagePullBackOff": "its image cannot be pulled",
    "InvalidImageName": "its image's name is invalid",
    "CreateContainerConfigError": "a Secret or ConfigMap it reads is missing",
    "CreateContainerError": "the runtime cannot create it",
}
Key = tuple[str, ...]
# How near a host's OOM kill must come to a target of the model going down (or restarting) to
# be named the cause: the kill, the server's exit and the failed scrape that shows it fall a
# few seconds apart, each read on the query's step. A kill on the host at another moment was
# another process's.
COINCIDE = 90.0
# The engine's series that say when a target went down or restarted.
DOWN_SIGNALS = ("targets_down", "engine_restarts")


def read(
    source: MetricSource,
    site: Site,
    window: Window,
    keys: Iterable[Key],
    matchers: Sequence[str] = (),
    workers: int = 8,
    read_before: Mapping[Key, Mapping[str, Series]] | None = None,
    asked: AbstractSet[str] = frozenset(),
) -> dict[Key, dict[str, Series]]:
    """Each model of ``keys``' platform series over the window (a model with none absent).
    The signals of ``asked`` were read over the same window already (``read_before``, by
    model): they are taken from there, not asked again."""
    wanted, by = set(keys), site.config.by
    out: dict[Key, dict[str, Series]] = {}
    taken = asked & set(SIGNALS)
    for key in wanted:
        before = (read_before or {}).get(key, {})
        for name in taken & before.keys():
            out.setdefault(key, {})[name] = before[name]
    exprs = {n: query(site, site.vocabulary[n], window, matchers) for n in still_to_ask(asked)}
    for name, series in _ranges(source, window, exprs, workers):
        for s in series:
            key = tuple(s.labels.get(k, "") for k in by)
            if key in wanted:
                out.setdefault(key, {})[name] = s
    return out


def unscraped(source: MetricSource, window: Window) -> frozenset[str]:
    """The platform's exporters with no series anywhere in the store over the window's whole
    span (its baseline too): one instant query of their witness families (``WITNESS``)."""
    span = f"{max(1, math.ceil(window.end - window.first))}s"
    # One point of a range query (not an instant query): a recording replays it by its step.
    answer = source.query_range(exporters_scraped(span), window.end, window.end, window.step)
    present = {s.labels.get("exporter") for s in answer}
    return frozenset(e for e in WITNESS if e not in present)


def unasked(signals: Iterable[Signal], absent: AbstractSet[str]) -> frozenset[str]:
    """The signals that read the platform's exporters and only exporters of ``absent``: they
    would answer no series, and are not asked (a join's other side, the servers' series over an
    hour at every step, is what such a query costs Prometheus to read)."""
    out = set()
    for sig in signals:
        needs = {p for f in sig.families if (p := _provider(f)) in WITNESS}
        if needs and needs <= absent:
            out.add(sig.name)
    return frozenset(out)


def _provider(family: str) -> str | None:
    try:
        return families.family(family).provider
    except KeyError:
        return None


def _ranges(
    source: MetricSource, window: Window, exprs: Mapping[str, str], workers: int
) -> Iterator[tuple[str, list[Series]]]:
    """Each of ``exprs`` (by name) over the window, asked concurrently; a query past the
    source's limits is named in its error."""

    def one(name: str) -> tuple[str, list[Series]]:
        try:
            return name, source.query_range(exprs[name], window.first, window.end, window.step)
        except OverLimit as exc:
            raise exc.about(name) from None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(one, exprs)


# What a pod's own waiting and terminated reasons are read as, in ``reason``'s names.
_BY_REASON = {
    ("waiting_reason", "CrashLoopBackOff"): "container_crash_looping",
    **{("waiting_reason", r): "container_start_failing" for r in START_FAILURES},
    ("terminated_reason", "OOMKilled"): "container_oom_killed",
    ("terminated_reason", "Error"): "container_error_exit",
}


def read_targets(
    source: MetricSource, site: Site, window: Window, targets: Iterable[Target], workers: int = 8
) -> tuple[dict[str, Series], int]:
    """What kube-state-metrics says of ``targets``' own pods, through each target's ``up``
    (``signals.platform.target_reads``), in the names ``reason`` reads, the targets taken
    together: for the pods of a rollout that never served, which no model's series joins
    (``read`` joins through pods that served). The waiting reasons seen are kept, in the
    order they came, in the ``reason`` label of ``container_start_failing``. Also: the
    number of queries asked."""
    wanted = set(targets)
    rate = window.rate_window
    if parse_seconds(rate) < EVENT_WINDOW:
        rate = rate_text(int(EVENT_WINDOW))
    scope = site.scope(window=rate)
    exprs = {name: read(scope) for name, read in target_reads().items()}
    out: dict[str, Series] = {}
    waited: dict[str, float] = {}
    for name, series in _ranges(source, window, exprs, workers):
        for s in series:
            if (s.labels.get("job", ""), s.labels.get("instance", "")) not in wanted:
                continue
            said = s.labels.get("reason")
            as_ = _BY_REASON.get((name, said or "")) if said is not None else name
            if as_ is None:
                continue
            # Restarts add up over the pods; a reason, a code or a limit: the highest.
            fn = np.add if as_ == "container_restarts" else np.fmax
            out[as_] = merged(out.get(as_), s, fn)
            on = s.t[np.nan_to_num(s.v) > 0]
            if as_ == "container_start_failing" and said and on.size:
                waited[said] = min(waited.get(said, np.inf), float(on[0]))
    if "container_start_failing" in out:
        order = sorted(waited, key=lambda r: waited[r])
        s = out["container_start_failing"]
        out["container_start_failing"] = Series({"reason": " then ".join(order)}, s.t, s.v)
    return out, len(exprs)


def merged(a: Series | None, b: Series, fn: np.ufunc) -> Series:
    """``a`` and ``b`` as one series: at each time both have a value, ``fn`` of the two."""
    if a is None:
        return Series({}, b.t, b.v)
    t = np.union1d(a.t, b.t)
    v = np.full(t.size, np.nan)
    for s in (a, b):
        at = np.searchsorted(t, s.t)
        v[at] = np.where(np.isnan(v[at]), s.v, np.where(np.isnan(s.v), v[at], fn(v[at], s.v)))
    return Series({}, t, v)


def still_to_ask(asked: AbstractSet[str]) -> tuple[str, ...]:
    """The platform's signals ``read`` asks for, given those read already."""
    return tuple(name for name in SIGNALS if name not in asked)


def _inside(s: Series | None, span: tuple[float, float]) -> tuple[np.ndarray, np.ndarray]:
    if s is None:
        return np.empty(0), np.empty(0)
    keep = (s.t >= span[0]) & (s.t <= span[1]) & np.isfinite(s.v)
    return s.t[keep], s.v[keep]


def _peak(series: dict[str, Series], name: str, span: tuple[float, float]) -> float:
    _, v = _inside(series.get(name), span)
    return float(v.max()) if v.size else 0.0


def _rises(s: Series | None, span: tuple[float, float]) -> np.ndarray:
    """The times ``s`` turned from zero (or no value) to above it in the span (its first
    sample, if it was up from the start)."""
    t, v = _inside(s, span)
    on = v > 0
    return t[on & ~np.concatenate(([False], on[:-1]))]


def _first_rise(series: dict[str, Series], name: str, span: tuple[float, float]) -> float | None:
    """When ``name`` last turned from zero to above it in the span (its first sample, if it
    was up all along)."""
    rises = _rises(series.get(name), span)
    return float(rises[-1]) if rises.size else None


def _coinciding(
    kills: np.ndarray, engine: dict[str, Series], span: tuple[float, float]
) -> float | None:
    """The last of the host's OOM kills that came as a target of the model went down or
    restarted (``engine``'s ``DOWN_SIGNALS``), within ``COINCIDE`` seconds or two query
    steps; None if none did."""
    read = [s for s in (engine.get(name) for name in DOWN_SIGNALS) if s is not None]
    downs = np.concatenate([np.empty(0), *(_rises(s, span) for s in read)])
    if not kills.size or not downs.size:
        return None
    steps = [float(np.median(np.diff(s.t))) for s in read if s.t.size > 1]
    near = max(COINCIDE, 2 * max(steps, default=0.0))
    close = [k for k in kills if np.abs(downs - k).min() <= near]
    return float(close[-1]) if close else None


def _gib(n: float) -> str:
    gib = n / 2**30
    return f"{gib:.0f} GiB" if gib >= 10 else f"{gib:.3g} GiB"


def _at(t: float | None) -> str:
    return f" at {time.strftime('%H:%M', time.gmtime(t))}" if t is not None else ""


def reason(
    series: dict[str, Series],
    span: tuple[float, float],
    engine: dict[str, Series] | None = None,
) -> str | None:
    """The platform's reason the model's servers went down over ``span``, in one phrase; None
    where nothing read names one. ``engine``: the model's own series (``DOWN_SIGNALS``), which
    say when its targets went down: a host's OOM kill is named only as it coincides with one."""

    def peak(name: str) -> float:
        return _peak(series, name, span)

    restarts = events(_inside(series.get("container_restarts"), span)[1])
    counted = f", {restarts} restart{'s' if restarts != 1 else ''}" if restarts else ""
    if peak("pods_evicted"):
        pressure = " under memory pressure" if peak("node_memory_pressure") else ""
        when = _first_rise(series, "pods_evicted", span)
        return f"evicted by its node{pressure}{_at(when)} (kube-state-metrics)"
    if peak("container_oom_killed") or peak("container_oom_events"):
        limit = peak("container_memory_limit_bytes")
        at_limit = f" at the {_gib(limit)} limit" if limit else ""
        when = _first_rise(series, "container_restarts", span) or _first_rise(
            series, "container_oom_killed", span
        )
        return f"OOMKilled{at_limit}{_at(when)}{counted} (kube-state-metrics)"
    if peak("node_not_ready"):
        when = _first_rise(series, "node_not_ready", span)
        return f"its node stopped being Ready{_at(when)}: lost or reclaimed (kube-state-metrics)"
    xid, ecc = peak("gpu_xid_last"), peak("gpu_uncorrectable_errors")
    if xid or ecc:
        fault = f"XID {xid:.0f}" if xid else "uncorrectable ECC errors"
        when = _first_rise(series, "gpu_xid_last" if xid else "gpu_uncorrectable_errors", span)
        return f"its GPU raised {fault}{_at(when)}{counted} (DCGM): drain the node"
    if peak("container_start_failing"):
        waited = series["container_start_failing"].labels.get("reason", "")
        meaning = _WAITING.get(waited.rsplit(" ", 1)[-1], "")
        why = (
            f"{waited}: {meaning}"
            if meaning
            else ("the image cannot be pulled or its configuration is wrong")
        )
        return f"its container cannot start ({why}; kube-state-metrics' waiting reason)"
    code = peak("container_exit_code")
    if peak("container_error_exit") and code in KILL_EXITS:
        when = _first_rise(series, "container_restarts", span)
        return (
            f"killed by the kubelet (reason Error, exit code {code:.0f}: its liveness probe "
            f"failed){_at(when)}{counted} (kube-state-metrics)"
        )
    if peak("container_crash_looping") or peak("container_error_exit") or code:
        how = " in CrashLoopBackOff" if peak("container_crash_looping") else ""
        exit_ = f", exit code {code:.0f}" + (" (SIGKILL)" if code == 137 else "") if code else ""
        when = _first_rise(series, "container_restarts", span)
        return f"its container died{how}{exit_}{_at(when)}{counted} (kube-state-metrics)"
    kills = events(_inside(series.get("node_oom_kills"), span)[1])
    when = _coinciding(_rises(series.get("node_oom_kills"), span), engine or {}, span)
    if kills and when is not None:
        return (
            f"the kernel's OOM killer killed {kills} process{'es' if kills != 1 else ''} on "
            f"its host{_at(when)}, as its server went down (node-exporter)"
        )
    if restarts:
        return f"{restarts} container restart{'s' if restarts != 1 else ''} (kube-state-metrics)"
    return None
