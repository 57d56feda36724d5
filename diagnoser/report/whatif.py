"""What-if figures in words and tables, read from the what-if's JSON object (the one
``servediag what-if --format json`` prints, and a finding's ``what_if`` under ``diagnose
--what-if``): the same numbers whichever command made them, and no simulator imported to
print them."""

from __future__ import annotations

from typing import Any

from diagnoser.core.printable import printable
from diagnoser.report.format import wrap

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
# The columns of a finding's table, with their headings and widths.
COLUMNS = (
    ("ttft_p95", "TTFT p95", 13),
    ("itl_p95", "ITL p95", 11),
    ("tokens_per_second", "tokens/s", 9),
    ("preemptions_per_second", "preempt/s", 11),
    ("ttft_slo_share", "TTFT SLO", 9),
    ("itl_slo_share", "ITL SLO", 9),
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


def finding_lines(doc: dict[str, Any], indent: str = "   ") -> list[str]:
    """A finding's what-if (its ``what_if`` object) as a table of its levers under today."""
    if doc.get("error"):
        return wrap(f"what-if: not predicted: {doc['error']}", indent)
    fit, cal = doc["fit"], doc["calibration"]
    out = wrap(
        f"what-if, the window replayed ({printable(str(fit['model_shape']))} on "
        f"{printable(str(fit['gpu']))}; calibrated prefill x{cal['prefill_factor']:.2f}, "
        f"decode x{cal['decode_factor']:.2f}):",
        indent,
    )
    levers = doc["levers"]
    width = max([5, *(len(lever["lever"]) + 1 for lever in levers)]) + 2
    row = indent + "  "
    out.append(row + "".ljust(width) + "".join(h.rjust(w) for _, h, w in COLUMNS))
    today = doc["today"]
    out.append(
        row + "today".ljust(width) + "".join(fmt(n, today.get(n)).rjust(w) for n, _, w in COLUMNS)
    )
    changes = []
    for lever in levers:
        label = (lever["lever"] + ("*" if lever["restart"] else "")).ljust(width)
        if lever["error"] or not lever["predicted"]:
            said = wrap(f"not predicted: {lever['error']}", " " * len(row + label))
            out += [row + label + said[0].lstrip(), *said[1:]]
            continue
        got, band = lever["predicted"], lever["band"] or {}
        cells = "".join(with_band(n, got.get(n), band.get(n)).rjust(w) for n, _, w in COLUMNS)
        out.append(row + label + cells)
        changes.append(f"{lever['lever'].split(':')[0]} {lever['change']}")
    notes = "* restarts the engine; ± is what the calibration left (its residual)"
    if changes:
        notes += "; " + ", ".join(changes)
    out += wrap(notes, row)
    for lever in levers:
        if lever.get("predicted"):
            for line in knee_lines(lever.get("knee"), printable(lever["lever"])):
                out += wrap(line, row)
    return out
