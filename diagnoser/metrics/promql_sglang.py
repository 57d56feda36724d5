"""PromQL builders for SGLang's families, aggregated to the same labels as vLLM's.

The rules of :mod:`diagnoser.metrics.promql` hold here too (``_total`` counters, ``sum by (le)``
in quantiles, ``/ (den > 0)`` guards). What SGLang adds:

- Scheduler series carry ``tp_rank``, ``pp_rank`` and ``moe_ep_rank``: one scheduler per
  rank may report the same engine (``--enable-metrics-for-all-schedulers``, pipeline stages),
  so a scheduler family is first collapsed over those ranks (``max without``) and only then
  aggregated; data-parallel ranks (``dp_rank``) stay apart and add up.
- With priority scheduling the scheduler's queue gauges carry the total under
  ``priority=""`` and a breakdown under each priority: scheduler selectors keep the total.
- Counters appear only once something was counted (prometheus_client's multiprocess mode has
  no series for a label set never written), so counts of rare events fall back to 0 where an
  SGLang server serves the model (:func:`or_zero`).
"""

from __future__ import annotations

from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_progress
from diagnoser.metrics.family import Family
from diagnoser.metrics.promql import Expr, Scope

RANKS = "tp_rank, pp_rank, moe_ep_rank"
TOTAL = 'priority=""'


def _scheduler(fam: Family) -> bool:
    return fam.base == SG.SCHEDULER


def _sel(fam: Family, scope: Scope, suffix: str = "", extra: tuple[str, ...] = ()) -> str:
    own = (TOTAL,) if _scheduler(fam) else ()
    return q.selector(fam.name + suffix, scope.matchers, *own, *extra)


def _one_engine(fam: Family, inner: str) -> str:
    """``inner`` with each engine's ranks collapsed into one series (scheduler families)."""
    return f"max without ({RANKS}) ({inner})" if _scheduler(fam) else inner


def _rate(fam: Family, scope: Scope, suffix: str = "", extra: tuple[str, ...] = ()) -> str:
    return _one_engine(fam, f"rate({_sel(fam, scope, suffix, extra)}[{scope.window}])")


def gauge(fn: str, fam: Family) -> Expr:
    def build(scope: Scope) -> str:
        return q.agg(fn, scope, _one_engine(fam, _sel(fam, scope)))

    return build


def counter_rate(fam: Family, extra: tuple[str, ...] = ()) -> Expr:
    def build(scope: Scope) -> str:
        return q.agg("sum", scope, _rate(fam, scope, extra=extra))

    return build


def serving(scope: Scope) -> str:
    """0 for every model an SGLang server serves (the base of :func:`or_zero`)."""
    return f"{gauge('sum', SG.RUNNING)(scope)} * 0"


def or_zero(expr: Expr) -> Expr:
    """``expr``, or 0 where SGLang serves the model but has not counted anything yet."""

    def build(scope: Scope) -> str:
        return f"({expr(scope)}) or {serving(scope)}"

    return build


def quantile(p: float, fam: Family, extra: tuple[str, ...] = ()) -> Expr:
    def build(scope: Scope) -> str:
        rates = q.agg("sum", scope, _rate(fam, scope, "_bucket", extra), "le")
        return f"histogram_quantile({p}, {rates})"

    return build


def quantile_up_to(p: float, fam: Family, bound: float) -> Expr:
    """The ``p`` quantile of the observations at or below ``bound`` alone: the buckets above
    it dropped, and the one at it read as +Inf (a bound of the family's buckets)."""
    kept = "|".join(f"{b:g}" for b in fam.bucket_bounds(0) if b <= bound)

    def build(scope: Scope) -> str:
        under = q.agg("sum", scope, _rate(fam, scope, "_bucket", (f'le=~"{kept}"',)), "le")
        top = q.agg("sum", scope, _rate(fam, scope, "_bucket", (f'le="{bound:g}"',)), "le")
        inf = f'label_replace({top}, "le", "+Inf", "", "")'
        return f"histogram_quantile({p}, {under} or {inf})"

    return build


def top_bound(fam: Family) -> Expr:
    """The histogram's top finite bucket bound (see :func:`diagnoser.metrics.promql.top_bound`)."""

    def build(scope: Scope) -> str:
        finite = q.agg(
            "sum", scope, _one_engine(fam, _sel(fam, scope, "_bucket", ('le!="+Inf"',))), "le"
        )
        top = q.agg(
            "sum", scope, _one_engine(fam, _sel(fam, scope, "_bucket", ('le="+Inf"',))), "le"
        )
        return f"histogram_quantile(0.5, {finite} * 0 or {top} * 0 + 1)"

    return build


def hist_mean(fam: Family, extra: tuple[str, ...] = ()) -> Expr:
    def build(scope: Scope) -> str:
        s = q.agg("sum", scope, _rate(fam, scope, "_sum", extra))
        c = q.agg("sum", scope, _rate(fam, scope, "_count", extra))
        return f"{s} / ({c} > 0)"

    return build


def hist_sum_rate(fam: Family) -> Expr:
    """What a histogram's observations add up to, per second (e.g. uncached prompt tokens)."""

    def build(scope: Scope) -> str:
        return q.agg("sum", scope, _rate(fam, scope, "_sum"))

    return build


def hist_rate(fam: Family, extra: tuple[str, ...] = ()) -> Expr:
    """Observations per second of a histogram (e.g. requests admitted, from the queue time)."""

    def build(scope: Scope) -> str:
        return q.agg("sum", scope, _rate(fam, scope, "_count", extra))

    return build


def bucket_share(fam: Family, le: str) -> Expr:
    def build(scope: Scope) -> str:
        num = q.agg("sum", scope, _rate(fam, scope, "_bucket", (f'le="{le}"',)))
        den = q.agg("sum", scope, _rate(fam, scope, "_count"))
        return f"{num} / ({den} > 0)"

    return build


def rate_above(fam: Family, le: str) -> Expr:
    def build(scope: Scope) -> str:
        total = q.agg("sum", scope, _rate(fam, scope, "_bucket", ('le="+Inf"',)))
        under = q.agg("sum", scope, _rate(fam, scope, "_bucket", (f'le="{le}"',)))
        return f"{total} - {under}"

    return build


def stalled() -> Expr:
    """Schedulers with running requests whose token counts (prefill computed, cached and
    decoded, written at each of its log intervals) did not move over the rate window."""
    return promql_progress.stalled(
        lambda scope: _one_engine(SG.RUNNING, _sel(SG.RUNNING, scope)),
        lambda scope: _rate(SG.REALTIME_TOKENS, scope),
    )


def counter_resets(fam: Family, fn: str = "sum") -> Expr:
    """Restarts seen as resets of a counter: one per target, whatever its label sets; ``fn``
    over the targets (``max``: the worst one's)."""

    def build(scope: Scope) -> str:
        per_series = f"resets({_sel(fam, scope)}[{scope.window}])"
        labels = [*scope.by, *(x for x in ("job", "instance") if x not in scope.by)]
        return q.agg(fn, scope, f"max by ({', '.join(labels)}) ({per_series})")

    return build


# The inference endpoints of SGLang's HTTP server: OpenAI's and Anthropic's APIs and its own.
INFERENCE_ENDPOINTS = (
    'endpoint=~"/v1/completions|/v1/chat/completions|/v1/responses|/v1/messages|/generate"'
)


def http_responses(status: str | None) -> Expr:
    """Inference responses per second (of one status class, ``4`` or ``5``), by target,
    joined to the models (SGLang's HTTP series carry no model)."""

    def inner(matchers: tuple[str, ...], window: str, keep: tuple[str, ...]) -> str:
        extra = (INFERENCE_ENDPOINTS,) + ((f'status_code=~"{status}.."',) if status else ())
        sel = q.selector(SG.HTTP_RESPONSES.name, matchers, *extra)
        return f"sum by ({', '.join(('job', 'instance', *keep))}) (rate({sel}[{window}]))"

    return q.on_targets(inner)


def tokenizer_cpu() -> Expr:
    """CPU of the tokenizer process (SGLang's HTTP front and tokenizer), by target."""

    def inner(matchers: tuple[str, ...], window: str, keep: tuple[str, ...]) -> str:
        sel = q.selector(SG.PROCESS_CPU.name, matchers, 'component="tokenizer"')
        return f"rate({sel}[{window}])"

    return q.on_targets(inner, fn="max")
