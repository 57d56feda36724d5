"""The figures a what-if gives (the keys of its FIGURES objects: ``ttft_p95``, ``kv_usage``,
...), their names in words and how each is written, for both places a what-if is printed:
``servediag what-if``'s own text (``whatif.report``) and a finding's ``what_if`` under
``diagnose --what-if`` (``report.whatif``). Nothing here imports the simulator."""

from __future__ import annotations

from typing import Any

LABELS = {
    "ttft_p50": "TTFT p50",
    "ttft_p95": "TTFT p95",
    "itl_p50": "ITL p50",
    "itl_p95": "ITL p95",
    "kv_usage": "KV usage",
    "preemptions_per_second": "preemptions/s",
    "waiting": "waiting",
    "requests_per_second": "requests/s",
    "tokens_per_second": "tokens/s",
    "ttft_slo_share": "TTFT SLO met",
    "itl_slo_share": "ITL SLO met",
}
# What a lever's table shows (the JSON has every figure).
SHOWN = (
    "ttft_p95",
    "itl_p95",
    "tokens_per_second",
    "preemptions_per_second",
    "kv_usage",
    "ttft_slo_share",
    "itl_slo_share",
)


def fmt(name: str, v: float | None) -> str:
    """One figure with its unit: latencies in ms (or s), shares in %, rates plain."""
    if v is None:
        return "-"
    if name.startswith(("ttft_p", "itl_p")):
        return f"{v * 1000:.0f} ms" if v < 1 else f"{v:.2f} s"
    if name in ("kv_usage", "ttft_slo_share", "itl_slo_share"):
        return f"{v:.1%}"
    if name == "tokens_per_second":
        return f"{v:,.0f}"
    return f"{v:.3g}"


def with_band(name: str, v: float | None, band: float | None) -> str:
    """A figure and its ±, in one unit: ``90±20 ms``, ``0.05±0.02``."""
    if v is None or band is None:
        return fmt(name, v)
    if name.startswith(("ttft_p", "itl_p")):
        if v < 1:
            return f"{v * 1000:.0f}±{band * 1000:.0f} ms"
        digits = 0 if v >= 100 else 1 if v >= 10 else 2
        return f"{v:.{digits}f}±{band:.{digits}f} s"
    if name == "kv_usage":
        return f"{v:.1%}±{band:.1%}"
    if name == "preemptions_per_second":
        return f"{v:.2g}±{band:.2g}"
    return fmt(name, v)


def knee_lines(knee: dict[str, Any] | None, lever: str = "") -> list[str]:
    """A line per latency quantile on a knee (a lever's ``knee``): the figure may lie anywhere
    between its values a point of the observations either side."""
    out = []
    for name, (lo, hi) in (knee or {}).items():
        of = f" of {lever}" if lever else ""
        out.append(
            f"{LABELS.get(name, name)}{of} sits on a knee: {fmt(name, lo)} to {fmt(name, hi)} "
            "as one point more or fewer of the observations are slow"
        )
    return out
