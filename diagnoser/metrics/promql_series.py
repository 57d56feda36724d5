"""PromQL builders for series as real servers write them, not as a simulator would.

- A counter's child is born at its first increment: prometheus_client writes no series for a
  label set never counted (the API server's ``status="4xx"`` before its first 4xx), so where
  the family is scraped an absent child is a rate of 0 (:func:`zero_where`).
- Histogram bounds are the server's: vLLM's token buckets end at its ``max_model_len`` (1, 2,
  5, ... up to it), and a site may set others (``--custom-histogram-buckets``). A quantile
  that falls in the +Inf bucket comes back as the top finite bound (:func:`top_bound` reads
  it from the series, so the value can be said as a lower bound); a share at or below a
  threshold is read at the bound the servers have (:func:`share_at_or_below`).
"""

from __future__ import annotations

import re

from diagnoser.metrics.buckets import le_label, read_at
from diagnoser.metrics.promql import Expr, Scope, agg, selector


def zero_where(expr: Expr, base: Expr) -> Expr:
    """``expr``, or 0 for every label set where ``base`` has a sample.

    A counter's child is born at its first increment (prometheus_client writes no series for
    a label set never counted: the API server's ``status="4xx"``, a finish reason vLLM 0.8
    counted on the way). Where the family is scraped (``base``: its other children, summed
    the same way) a label value with no series has a rate of 0, not an unknown one; the
    label sets come from ``base``, so no model is invented where nothing is scraped."""

    def build(scope: Scope) -> str:
        return f"({expr(scope)}) or ({base(scope)}) * 0"

    return build


def top_bound(*names: str) -> Expr:
    """The histogram's top finite bucket bound, read from its series (vLLM's token buckets
    end at the server's max_model_len; a site may set others): a quantile equal to it fell
    in the +Inf bucket, and is a lower bound, not a value.

    ``histogram_quantile`` of buckets that hold nothing below +Inf and one observation there
    returns the top finite bound; the rates do not matter, only which ``le`` exist."""

    def build(scope: Scope) -> str:
        alts = []
        for n in names:
            finite = agg("sum", scope, selector(n + "_bucket", scope.matchers, 'le!="+Inf"'), "le")
            top = agg("sum", scope, selector(n + "_bucket", scope.matchers, 'le="+Inf"'), "le")
            alts.append(f"histogram_quantile(0.5, {finite} * 0 or {top} * 0 + 1)")
        return " or ".join(f"({a})" for a in alts) if len(alts) > 1 else alts[0]

    return build


def share_at_or_below(name: str, threshold: float, default: tuple[float, ...]) -> Expr:
    """Share of observations at or below ``threshold`` (SLO attainment), read at the bucket
    bound the servers have: the threshold where it is a bound, else the largest bound below
    it (a stricter threshold). Servers with other bounds (``--custom-histogram-buckets``)
    each give the largest of theirs: cumulative buckets grow with ``le``, so the ``max`` over
    the candidate bounds is each scope's own."""

    def build(scope: Scope) -> str:
        m = scope.matchers
        les = read_at(threshold, scope.bound_sets(name, default)) or (threshold,)
        den = agg("sum", scope, f"rate({selector(name + '_count', m)}[{scope.window}])")
        if len(les) == 1:
            bucket = selector(name + "_bucket", m, f'le="{le_label(les[0])}"')
            num = agg("sum", scope, f"rate({bucket}[{scope.window}])")
        else:
            alts = "|".join(re.escape(le_label(le)).replace("\\", "\\\\") for le in les)
            bucket = selector(name + "_bucket", m, f'le=~"{alts}"')
            num = agg("max", scope, agg("sum", scope, f"rate({bucket}[{scope.window}])", "le"))
        return f"{num} / ({den} > 0)"

    return build


def bucket_share(name: str, le: str) -> Expr:
    """Share of observations at or below a bucket boundary (SLO attainment)."""

    def build(scope: Scope) -> str:
        m = scope.matchers
        bucket = selector(name + "_bucket", m, f'le="{le}"')
        num = agg("sum", scope, f"rate({bucket}[{scope.window}])")
        den = agg("sum", scope, f"rate({selector(name + '_count', m)}[{scope.window}])")
        return f"{num} / ({den} > 0)"

    return build


def rate_above(name: str, le: str) -> Expr:
    """Observations per second larger than the bucket bound ``le`` (+Inf minus that bucket)."""

    def build(scope: Scope) -> str:
        m = scope.matchers
        top = selector(name + "_bucket", m, 'le="+Inf"')
        below = selector(name + "_bucket", m, f'le="{le}"')
        total = agg("sum", scope, f"rate({top}[{scope.window}])")
        under = agg("sum", scope, f"rate({below}[{scope.window}])")
        return f"{total} - {under}"

    return build
