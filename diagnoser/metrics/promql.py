"""Small PromQL builders shared by every signal.

Every expression is built for a :class:`Scope`: the label matchers that select the series,
the labels to aggregate by, and the range of ``rate()``. The builders encode the rules that
existing vLLM dashboards get wrong: counters are always queried with ``_total``,
``histogram_quantile`` always aggregates ``sum by (le, ...)``, ratios divide by ``(den > 0)``
so an idle model yields no sample instead of NaN, and renamed metrics are read under both
names with ``or``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

from diagnoser.metrics import engines

# Labels that exist only on the engine's own series. HTTP and process series from the API
# server carry neither, so matchers on them must not be applied there; those series are
# scoped to a model through a join on (job, instance) instead.
ENGINE_ONLY_LABELS = frozenset({"model_name", "engine"})

# Each engine's running gauge (``engines.running_gauges``), one series per (job, instance,
# model_name) on every server of every version, is the join key from series without a model
# (HTTP, process, DCGM, scrape health) to the model they serve.

# How DCGM exporter series meet vLLM series. DCGM has no model_name and its own instance
# label. In Kubernetes, dcgm-exporter's pod mapping labels each GPU with the pod that uses it:
# GPU series with a pod label are joined on (namespace, pod). Elsewhere (bare metal, VMs, or
# no pod mapping) they are joined by host: the host part of the exporter's instance against
# the host part of the vLLM server's (both exporters run on the machine with the GPUs).
GPU_JOIN_LABELS = ("namespace", "pod")
GPU_HOST_LABEL = "host"
_HOST_OF_INSTANCE = '"host", "$1", "instance", "(.+):[0-9]+"'
HAS_POD = 'pod!=""'
_WITH_POD, _WITHOUT_POD = f"{{{HAS_POD}}}", '{pod=""}'


@dataclass(frozen=True)
class Scope:
    """Where and how an expression is evaluated."""

    matchers: tuple[str, ...] = ()
    by: tuple[str, ...] = ("model_name",)
    window: str = "5m"
    # Selects the scrape targets of the servers (for series of ``up``): one matcher per engine,
    # each an alternative (vLLM's, SGLang's).
    targets: tuple[str, ...] = ()
    # The bucket bounds the servers' histograms have, where they were read (``diagnose``
    # reads the ``le`` labels of the latency histograms; ``generate`` takes the site
    # config's ``histogram_buckets``): (metric name, its distinct sets of bounds).
    buckets: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...] = ()
    # One side of a disaggregated deployment (``sides.SIDES``): "decode" or "prefill"; "" for
    # the side each signal is about (``sides.on_side``), every server for the others.
    side: str = ""
    # The site's matchers of its prefill and of its decode servers, for a deployment whose
    # series cannot tell; empty: read from the series alone.
    roles: tuple[str, str] = ("", "")
    # The (job, instance) of the servers every rate leaves out (the other side), or "".
    exclude: str = ""

    def bound_sets(self, name: str, default: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
        """The sets of bounds ``name``'s histogram has on the scope's servers (its default
        where they were not read)."""
        for metric, sets in self.buckets:
            if metric == name and sets:
                return sets
        return (default,)

    def with_by(self, *labels: str) -> Scope:
        return replace(self, by=labels)

    def target_matchers(self) -> tuple[str, ...]:
        """Matchers that also apply to API-server series (no model or engine labels)."""
        return tuple(m for m in self.matchers if matcher_label(m) not in ENGINE_ONLY_LABELS)

    def group_labels(self) -> tuple[str, ...]:
        """The site's group labels in the aggregation (e.g. cluster): target labels that
        every series of a target carries, so joins between families keep them."""
        return tuple(label for label in self.by if label not in _NOT_GROUPS)

    def probe_matchers(self) -> tuple[str, ...]:
        """Matchers that apply to the synthetic probe's series.

        The probe is scraped as a target of its own (its own job and instance, no engine,
        often outside the cluster), so only the model selects its series.
        """
        return tuple(m for m in self.matchers if matcher_label(m) == "model_name")


Expr = Callable[[Scope], str]
_NOT_GROUPS = frozenset({"model_name", "engine", "job", "instance", "prompt_bucket"})


def _labels(*labels: str) -> str:
    return ", ".join(labels)


_LABEL = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def matcher_label(m: str) -> str:
    """The label a matcher selects on (``model_name="x"``: model_name)."""
    found = _LABEL.match(m)
    if not found:
        raise ValueError(f"not a label matcher: {m!r}")
    return found.group(1)


def quote(value: str) -> str:
    """A label value as a PromQL double-quoted string, whatever it holds."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


# One label matcher as a user writes it (``job="vllm"``, ``pod=~"vllm-.*"``): checked before
# it goes into a query, so it can narrow a selector and never break out of it.
MATCHER = re.compile(r'[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"(?:[^"\\\n]|\\.)*"')


def matcher(label: str, value: str) -> str:
    """``label="value"`` with the value escaped: a value can never widen or break a query."""
    return f"{label}={quote(value)}"


def selector(metric: str, matchers: tuple[str, ...], *extra: str) -> str:
    parts = [*matchers, *extra]
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def by_clause(scope: Scope, *extra: str) -> str:
    labels = [*extra, *scope.by]
    return f"by ({', '.join(labels)})" if labels else ""


def agg(fn: str, scope: Scope, inner: str, *extra_by: str) -> str:
    clause = by_clause(scope, *extra_by)
    return f"{fn} {clause} ({inner})" if clause else f"{fn}({inner})"


def model_map(scope: Scope, memory: str | None = None) -> str:
    """(job, instance) -> model_name, restricted to the scope's models.

    ``last_over_time`` keeps the mapping while a target is down: over the rate window for a
    restart, or over ``memory`` to remember which model a target served before it went down.
    """
    span = memory or _capped(scope.window)
    series = " or ".join(
        f"last_over_time({selector(m, scope.matchers)}[{span}])" for m in engines.running_gauges()
    )
    keys = _labels("job", "instance", *scope.group_labels(), "model_name")
    return f"group by ({keys}) ({series})"


def serving(matchers: tuple[str, ...], *extra: str) -> str:
    """The running gauge of every server of either engine: one series per model and server."""
    return " or ".join(selector(m, matchers, *extra) for m in engines.running_gauges())


def up(scope: Scope, highest_over: str = "", fn: str = "max_over_time") -> str:
    """``up`` of the servers' scrape targets, each engine's alternative (``Scope.targets``);
    with ``highest_over``, each target's highest ``up`` over that window (0: every scrape in
    it failed), or another ``fn`` of it (``count_over_time``: how many scrapes it holds)."""

    def one(extra: tuple[str, ...]) -> str:
        sel = selector("up", (*scope.target_matchers(), *extra))
        return f"{fn}({sel}[{highest_over}])" if highest_over else sel

    alts = [one((t,)) for t in scope.targets] or [one(())]
    return alts[0] if len(alts) == 1 else f"({' or '.join(alts)})"


MAP_MEMORY_MAX = "1h"


def _capped(window: str) -> str:
    """The rate window, as the model map's memory; at most an hour (an SLO's 3-day rates need
    no 3-day memory of which model each target serves)."""
    from diagnoser.plumbing.durations import parse_duration

    try:
        long = parse_duration(window) > parse_duration(MAP_MEMORY_MAX)
    except ValueError:  # a Grafana variable such as $__rate_interval
        return window
    return MAP_MEMORY_MAX if long else window


# A subquery over a window up to this long runs at the server's evaluation interval; a longer
# one at a resolution giving this many points, so that a year-long window costs what an hour
# does (a subquery at 15 s over 47 hours is 11,000 evaluations per step of a range query).
SUBQUERY_FULL_RESOLUTION = "1h"
SUBQUERY_POINTS = 240


def subquery_range(window: str) -> str:
    """The ``[range:resolution]`` of a subquery over ``window``: the server's evaluation
    interval up to an hour, else a resolution of ``SUBQUERY_POINTS`` points per window."""
    from diagnoser.plumbing.durations import parse_duration

    try:
        seconds = parse_duration(window)
        full = parse_duration(SUBQUERY_FULL_RESOLUTION)
    except ValueError:  # a Grafana variable such as $__rate_interval
        return f"[{window}:]"
    if seconds <= full:
        return f"[{window}:]"
    return f"[{window}:{max(1, round(seconds / SUBQUERY_POINTS))}s]"


def host_of(expr: str) -> str:
    """``expr`` with a ``host`` label: the host part of its ``instance`` (host:port)."""
    return f"label_replace({expr}, {_HOST_OF_INSTANCE})"


def gpu_model_map(scope: Scope, *, by_host: bool = False) -> str:
    """(namespace, pod) -> model_name; or, ``by_host``, host -> model_name.

    A host whose vLLM servers serve several models is left out of the host map: which of its
    GPUs serves which model cannot be told from the host, and a join on it would fail."""
    if not by_host:
        # Only servers with a pod: those without one all share the empty (namespace, pod),
        # and Prometheus refuses a join whose one side has duplicates, matched or not.
        labels = _labels(*GPU_JOIN_LABELS, *scope.group_labels(), "model_name")
        return f"group by ({labels}) ({serving(scope.matchers, HAS_POD)})"
    hosts = _labels(GPU_HOST_LABEL, *scope.group_labels())
    served = host_of(serving(scope.matchers))
    models = f"group by ({hosts}, model_name) ({served})"
    every = host_of(serving(scope.target_matchers()))
    shared = f"count by ({hosts}) (group by ({hosts}, model_name) ({every})) > 1"
    return f"({models} unless on ({hosts}) ({shared}))"


def kept(scope: Scope, expr: str) -> str:
    """``expr`` (per-server series) without the servers the scope leaves out (the other side
    of a disaggregated deployment: ``sides.on_side``)."""
    return f"({expr} unless on (job, instance) {scope.exclude})" if scope.exclude else expr


def _rate(scope: Scope, series: str) -> str:
    """``rate(series[window])``, without the servers the scope leaves out."""
    return kept(scope, f"rate({series}[{scope.window}])")


# --- counters -------------------------------------------------------------------------------


def counter_rate(*names: str, extra: tuple[str, ...] = ()) -> Expr:
    """Per-second rate of a counter, summed by the scope; several names are renames."""

    def build(scope: Scope) -> str:
        alts = [agg("sum", scope, _rate(scope, selector(n, scope.matchers, *extra))) for n in names]
        return " or ".join(alts)

    return build


def counter_rate_by(name: str, label: str, extra: tuple[str, ...] = ()) -> Expr:
    def build(scope: Scope) -> str:
        inner = _rate(scope, selector(name, scope.matchers, *extra))
        return agg("sum", scope, inner, label)

    return build


def share_of(name: str, num_matchers: tuple[str, ...], *, zero_if_absent: bool = False) -> Expr:
    """Share of a counter's rate carried by the series matching ``num_matchers``.

    With ``zero_if_absent`` the share is 0, not empty, where the family exists but the
    numerator's label value does not (for label values added in later versions).
    """

    def build(scope: Scope) -> str:
        den = agg("sum", scope, _rate(scope, selector(name, scope.matchers)))
        num = agg("sum", scope, _rate(scope, selector(name, scope.matchers, *num_matchers)))
        if zero_if_absent:
            num = f"({num} or {den} * 0)"
        return f"{num} / ({den} > 0)"

    return build


def share_by(name: str, label: str) -> Expr:
    def build(scope: Scope) -> str:
        rate = _rate(scope, selector(name, scope.matchers))
        num = agg("sum", scope, rate, label)
        den = agg("sum", scope, rate)
        return f"{num} / ignoring ({label}) group_left () ({den} > 0)"

    return build


def counter_resets(name: str, fn: str = "sum") -> Expr:
    """Restarts seen as counter resets: one per target, whatever its label values or engines;
    ``fn`` over the targets (``max``: the worst one's)."""

    def build(scope: Scope) -> str:
        per_series = f"resets({selector(name, scope.matchers)}[{scope.window}])"
        labels = [*scope.by, *(x for x in ("job", "instance") if x not in scope.by)]
        per_target = f"max by ({', '.join(labels)}) ({per_series})"
        return agg(fn, scope, per_target)

    return build


# --- gauges ---------------------------------------------------------------------------------


def gauge(fn: str, *names: str, extra: tuple[str, ...] = ()) -> Expr:
    """``fn by (scope) (gauge)``; several names are renames (newest first)."""

    def build(scope: Scope) -> str:
        return " or ".join(agg(fn, scope, selector(n, scope.matchers, *extra)) for n in names)

    return build


def gauge_by(fn: str, name: str, label: str) -> Expr:
    def build(scope: Scope) -> str:
        return agg(fn, scope, selector(name, scope.matchers), label)

    return build


# --- histograms -----------------------------------------------------------------------------


def _bucket_rates(scope: Scope, names: tuple[str, ...], *extra_by: str) -> str:
    alts = [
        agg(
            "sum",
            scope,
            _rate(scope, selector(n + "_bucket", scope.matchers)),
            "le",
            *extra_by,
        )
        for n in names
    ]
    return " or ".join(alts)


def quantile(q: float, *names: str, extra_by: tuple[str, ...] = ()) -> Expr:
    """``histogram_quantile`` over buckets summed by ``le`` and the scope."""

    def build(scope: Scope) -> str:
        return f"histogram_quantile({q}, {_bucket_rates(scope, names, *extra_by)})"

    return build


def hist_mean(*names: str) -> Expr:
    """Mean of a histogram's observations: rate(_sum) / rate(_count), guarded."""

    def build(scope: Scope) -> str:
        alts = []
        for n in names:
            s = agg("sum", scope, _rate(scope, selector(n + "_sum", scope.matchers)))
            c = agg("sum", scope, _rate(scope, selector(n + "_count", scope.matchers)))
            alts.append(f"{s} / ({c} > 0)")
        return " or ".join(f"({a})" for a in alts) if len(alts) > 1 else alts[0]

    return build


def hist_rate(name: str) -> Expr:
    """Observations per second of a histogram (e.g. engine steps per second)."""

    def build(scope: Scope) -> str:
        return agg("sum", scope, _rate(scope, selector(name + "_count", scope.matchers)))

    return build


# --- combinators ----------------------------------------------------------------------------


def either(*exprs: Expr) -> Expr:
    """The first expression that has a sample for a label set (renamed metric families)."""

    def build(scope: Scope) -> str:
        return " or ".join(f"({e(scope)})" for e in exprs)

    return build


def ratio(num: Expr, den: Expr) -> Expr:
    def build(scope: Scope) -> str:
        return f"({num(scope)}) / (({den(scope)}) > 0)"

    return build


def on_probe(inner: Expr) -> Expr:
    """``inner`` over the synthetic probe's series: scoped by model only (see Scope)."""

    def build(scope: Scope) -> str:
        return inner(replace(scope, matchers=scope.probe_matchers()))

    return build


def difference(a: Expr, b: Expr) -> Expr:
    def build(scope: Scope) -> str:
        return f"({a(scope)}) - ({b(scope)})"

    return build


def total(a: Expr, b: Expr) -> Expr:
    def build(scope: Scope) -> str:
        return f"({a(scope)}) + ({b(scope)})"

    return build


TargetExpr = Callable[[tuple[str, ...], str, tuple[str, ...]], str]


def on_targets(inner: TargetExpr, fn: str = "sum", extra_by: tuple[str, ...] = ()) -> Expr:
    """An API-server series (no model_name) scoped to models through (job, instance).

    ``inner(matchers, window, keep)`` returns a per-target vector that keeps the labels
    ``keep`` (the site's group labels, and ``extra_by``) if it aggregates; it is joined to the
    models the scope selects on (job, instance and the group labels) and aggregated by the
    scope's labels and ``extra_by``.
    """

    def build(scope: Scope) -> str:
        keep = scope.group_labels()
        joined = (
            f"{inner(scope.target_matchers(), scope.window, (*keep, *extra_by))}"
            f" * on ({_labels('job', 'instance', *keep)}) group_left (model_name)"
            f" {model_map(scope)}"
        )
        return agg(fn, scope, joined, *extra_by)

    return build


GpuExpr = Callable[[str], str]


def on_gpus(inner: GpuExpr, fn: str = "avg") -> Expr:
    """DCGM series joined to the models that use the GPUs, ``fn`` by the scope.

    ``inner(matchers)`` is a per-GPU vector over DCGM families, each selected with
    ``matchers`` (a ``{...}`` block): GPUs with a pod label are joined through their pod, the
    others through their host, so each GPU is counted once."""

    def build(scope: Scope) -> str:
        groups = scope.group_labels()
        pods = _labels(*GPU_JOIN_LABELS, *groups)
        by_pod = f"{inner(_WITH_POD)} * on ({pods}) group_left (model_name) " + (
            gpu_model_map(scope)
        )
        hosts = _labels(GPU_HOST_LABEL, *groups)
        by_host = f"{host_of(inner(_WITHOUT_POD))} * on ({hosts}) group_left (model_name) " + (
            gpu_model_map(scope, by_host=True)
        )
        return agg(fn, scope, f"{by_pod} or {by_host}")

    return build
