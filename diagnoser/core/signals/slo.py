"""Service-level signals: the share of requests and tokens within the site's SLO thresholds,
stalled streams, and goodput."""

from __future__ import annotations

from diagnoser.core import families
from diagnoser.core import promql as q
from diagnoser.core.signals.base import ITL_STALL, Signal
from diagnoser.core.signals.names import ITL, TTFT
from diagnoser.core.signals.traffic import REQUEST_RATE


def slo_attainment(
    family: str | tuple[str, ...], threshold: float, buckets: tuple[float, ...]
) -> q.Expr:
    """Share of observations at or below ``threshold``, which must be a bucket bound."""
    if threshold not in buckets:
        near = ", ".join(families.le_label(b) for b in buckets)
        raise ValueError(f"SLO threshold {threshold:g} s is not a bucket boundary ({near})")
    names = (family,) if isinstance(family, str) else family
    le = families.le_label(threshold)
    return q.either(*(q.bucket_share(n, le) for n in names))


def signals(ttft_slo: float, itl_slo: float) -> list[Signal]:
    s = Signal
    ttft_slo_expr = slo_attainment(TTFT, ttft_slo, families.TTFT_BUCKETS)
    itl_slo_expr = slo_attainment(ITL, itl_slo, families.ITL_BUCKETS)
    stall_expr = slo_attainment(ITL, ITL_STALL, families.ITL_BUCKETS)
    return [
        s(
            "ttft_slo_attainment",
            "ratio",
            f"Share of requests with TTFT <= {ttft_slo:g} s (a bucket boundary).",
            ttft_slo_expr,
            ("vllm_time_to_first_token_seconds", "slo_attainment"),
        ),
        s(
            "itl_slo_attainment",
            "ratio",
            f"Share of output tokens with ITL <= {itl_slo:g} s (a bucket boundary).",
            itl_slo_expr,
            ("vllm_inter_token_latency_seconds", "slo_attainment"),
        ),
        s(
            "itl_stall_share",
            "ratio",
            f"Share of output tokens that came more than {ITL_STALL:g} s after the previous one: "
            "stalled streams, counted even when too few to move the ITL p99.",
            lambda sc: f"1 - ({stall_expr(sc)})",
            ("vllm_inter_token_latency_seconds", "stall_share"),
        ),
        s(
            "goodput_rate",
            "req/s",
            "Requests per second meeting the TTFT SLO, scaled by the ITL SLO attainment "
            "(an estimate: vLLM exposes the two distributions separately).",
            lambda sc: f"({REQUEST_RATE(sc)}) * ({ttft_slo_expr(sc)}) * ({itl_slo_expr(sc)})",
            ("vllm_goodput", "rate"),
        ),
    ]
