"""Service-level signals: the share of requests and tokens within the site's SLO thresholds,
stalled streams, and goodput."""

from __future__ import annotations

from diagnoser.metrics import buckets
from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_series as rs
from diagnoser.metrics import promql_sglang as sg
from diagnoser.metrics.engines import Gap
from diagnoser.metrics.family import Family
from diagnoser.metrics.signals.base import ITL_STALL, SGLANG_ITL_STALL, Signal, on
from diagnoser.metrics.signals.traffic import REQUEST_RATE, SGLANG_REQUEST_RATE


def slo_attainment(
    family: str | tuple[str, ...], threshold: float, bounds: tuple[float, ...]
) -> q.Expr:
    """Share of observations at or below ``threshold``, read at the bucket bound the servers
    have (``bounds``, vLLM's defaults, where the scope has not read them): the threshold, or
    the largest bound below it."""
    names = (family,) if isinstance(family, str) else family
    return q.either(*(rs.share_at_or_below(n, threshold, bounds) for n in names))


def sglang_attainment(fam: Family, threshold: float) -> q.Expr | Gap:
    """SGLang's share at or below ``threshold``, or why not (not one of its bounds)."""
    assert isinstance(fam.buckets, tuple)
    if threshold not in fam.buckets:
        near = ", ".join(buckets.le_label(b) for b in fam.buckets)
        return Gap(f"{threshold:g} s is not a bound of SGLang's {fam.name} ({near})")
    return sg.bucket_share(fam, buckets.le_label(threshold))


def signals(ttft_slo: float, itl_slo: float) -> list[Signal]:
    s = Signal
    ttft_slo_expr = slo_attainment(F.TTFT.name, ttft_slo, buckets.TTFT_BUCKETS)
    itl_slo_expr = slo_attainment(F.ITL_NAMES, itl_slo, buckets.ITL_BUCKETS)
    stall_expr = slo_attainment(F.ITL_NAMES, ITL_STALL, buckets.ITL_BUCKETS)
    sg_ttft = sglang_attainment(SG.TTFT, ttft_slo)
    sg_itl = sglang_attainment(SG.ITL, itl_slo)
    sg_stall = sglang_attainment(SG.ITL, SGLANG_ITL_STALL)
    assert not isinstance(sg_stall, Gap)
    goodput: q.Expr | Gap
    if isinstance(sg_ttft, Gap):
        goodput = sg_ttft
    elif isinstance(sg_itl, Gap):
        goodput = sg_itl
    else:
        goodput = _product(SGLANG_REQUEST_RATE, sg_ttft, sg_itl)
    return [
        s(
            "ttft_slo_attainment",
            "ratio",
            f"Share of requests with TTFT <= {ttft_slo:g} s (read at the largest bucket bound "
            "at or below it).",
            on(vllm=ttft_slo_expr, sglang=sg_ttft),
            ("vllm_time_to_first_token_seconds", "slo_attainment"),
        ),
        s(
            "itl_slo_attainment",
            "ratio",
            f"Share of output tokens with ITL <= {itl_slo:g} s (read at the largest bucket "
            "bound at or below it).",
            on(vllm=itl_slo_expr, sglang=sg_itl),
            ("vllm_inter_token_latency_seconds", "slo_attainment"),
        ),
        s(
            "itl_stall_share",
            "ratio",
            f"Share of output tokens that came more than {ITL_STALL:g} s after the previous one "
            f"(SGLang: {SGLANG_ITL_STALL:g} s, the bound its ITL histogram has): stalled "
            "streams, counted even when too few to move the ITL p99.",
            on(
                vllm=lambda sc: f"1 - ({stall_expr(sc)})",
                sglang=lambda sc: f"1 - ({sg_stall(sc)})",
            ),
            ("vllm_inter_token_latency_seconds", "stall_share"),
        ),
        s(
            "goodput_rate",
            "req/s",
            "Requests per second meeting the TTFT SLO, scaled by the ITL SLO attainment "
            "(an estimate: vLLM exposes the two distributions separately).",
            on(vllm=_product(REQUEST_RATE, ttft_slo_expr, itl_slo_expr), sglang=goodput),
            ("vllm_goodput", "rate"),
        ),
    ]


def _product(*exprs: q.Expr) -> q.Expr:
    return lambda sc: " * ".join(f"({e(sc)})" for e in exprs)


# --- the SLIs' error ratios (what the burn-rate rules record) ---------------------------------


def availability_error_ratio() -> q.Expr:
    """Failed inference requests over all of them: HTTP 5xx on the inference handlers, plus
    requests the engine finished with ``finished_reason="error"`` (a request counted by both
    counts twice: an upper bound). Without HTTP metrics, the engine's side alone. A family
    that has not seen a failure yet has no series for it, so each part falls back to zero."""
    from diagnoser.metrics.signals.server import api_requests

    http_failed, http_all = api_requests("5xx"), api_requests(None)
    failed = q.counter_rate(F.SUCCESS.name, extra=('finished_reason="error"',))
    finished = q.counter_rate(F.SUCCESS.name)

    def build(scope: q.Scope) -> str:
        f, h, e, n = http_failed(scope), http_all(scope), failed(scope), finished(scope)
        errors = f"(({f}) or ({h}) * 0 or ({n}) * 0) + (({e}) or ({n}) * 0)"
        return f"({errors}) / ((({h}) or ({n})) > 0)"

    return build


def latency_error_ratio(
    family: str | tuple[str, ...], threshold: float, bounds: tuple[float, ...]
) -> q.Expr:
    """The share of observations above ``threshold`` (a bucket bound)."""
    attainment = slo_attainment(family, threshold, bounds)
    return lambda scope: f"1 - ({attainment(scope)})"


def sglang_availability_error_ratio() -> q.Expr:
    """SGLang's failed inference requests: HTTP 5xx over all inference responses (it counts
    no engine errors apart); without HTTP metrics, none failed of those it finished."""
    failed, answered = sg.http_responses("5"), sg.http_responses(None)

    def build(scope: q.Scope) -> str:
        f, h, n = failed(scope), answered(scope), SGLANG_REQUEST_RATE(scope)
        return f"(({f}) or ({h}) * 0 or ({n}) * 0) / ((({h}) or ({n})) > 0)"

    return build


def error_ratio(sli: str, ttft_seconds: float, itl_seconds: float) -> q.Expr:
    """The error ratio of an SLI (``availability``, ``ttft`` or ``itl``) at these thresholds,
    from either engine (SGLang's latency SLIs where the threshold is one of its bounds)."""
    if sli == "availability":
        return q.either(availability_error_ratio(), sglang_availability_error_ratio())
    if sli == "ttft":
        vllm = latency_error_ratio(F.TTFT.name, ttft_seconds, buckets.TTFT_BUCKETS)
        other = sglang_attainment(SG.TTFT, ttft_seconds)
    else:
        vllm = latency_error_ratio(F.ITL_NAMES, itl_seconds, buckets.ITL_BUCKETS)
        other = sglang_attainment(SG.ITL, itl_seconds)
    if isinstance(other, Gap):
        return vllm
    sglang = other
    return q.either(vllm, lambda scope: f"1 - ({sglang(scope)})")
