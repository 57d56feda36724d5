"""PromQL builders for series as real servers write them, not as a simulator would.

- A counter's child is born at its first increment: prometheus_client writes no series for a
  label set never counted (the API server's ``status="4xx"`` before its first 4xx), so where
  the family is scraped an absent child is a rate of 0 (:func:`zero_where`).
- Histogram bounds are the server's: vLLM's token buckets end at its ``max_model_len`` (1, 2,
  5, ... up to it), and a site may set others (``--custom-histogram-buckets``). A quantile
  that falls in the +Inf bucket comes back as the top finite bound (:func:`top_bound` reads
  it from the series, so the value can be said as a lower bound).
"""

from __future__ import annotations

from diagnoser.core.promql import Expr, Scope, agg, selector


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
