"""A finding's what-if in words and a table, read from the what-if's JSON object (a
finding's ``what_if`` under ``diagnose --what-if``, the object ``servediag what-if --format
json`` prints): the same figures, written as ``whatif.figures`` writes them, and no simulator
imported to print them."""

from __future__ import annotations

from typing import Any

from diagnoser.plumbing.printable import printable
from diagnoser.report.format import wrap
from diagnoser.whatif.figures import fmt, knee_lines, with_band

# The columns of a finding's table, with their headings and widths.
COLUMNS = (
    ("ttft_p95", "TTFT p95", 13),
    ("itl_p95", "ITL p95", 11),
    ("tokens_per_second", "tokens/s", 9),
    ("preemptions_per_second", "preempt/s", 11),
    ("ttft_slo_share", "TTFT SLO", 9),
    ("itl_slo_share", "ITL SLO", 9),
)


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
