"""``--explain ID``: one playbook's signature evaluated step by step, per scope."""

from __future__ import annotations

import time

from diagnoser.diagnosis.model import Diagnosis
from diagnoser.report.format import scope_text


def explain(d: Diagnosis, playbook_id: str) -> str:
    every = (*d.findings, *d.resolved, *d.ended_before, *d.undecided, *d.checked)
    matches = [m for m in every if m.playbook.id == playbook_id]
    if not matches:
        return (
            f"{playbook_id}: not evaluated: no scope with traffic in the window "
            f"(or, for a target-level playbook, no vLLM target matched)\n"
        )

    def clock(t: float | None) -> str:
        return time.strftime("%H:%M", time.gmtime(t)) if t is not None else "-"

    out = []
    for m in matches:
        p = m.periods
        status = {
            "matched": f"MATCHED, confidence {m.confidence:.0%}",
            "ruled_out": f"ruled out: {m.reason}",
            "undecided": f"undecided: {m.reason or 'missing series'}",
            "not_matched": f"not matched: {m.reason}",
        }[m.status]
        if m.status == "matched" and m.end is not None:
            ended = "before the window" if m.end < d.window.start else "in the window"
            status += f", ended {ended} at {clock(m.end)} UTC (resolved)"
        out.append(f"{playbook_id} for {scope_text(m.scope)}: {status}")
        if m.explained_by:
            out.append(f"  explained by {m.explained_by} (its confidence halved)")
        for caveat in m.caveats:
            out.append(f"  caveat (confidence x0.75): {caveat}")
        if p is not None:
            onset = f"change at {clock(p.onset)} UTC" if p.onset else "no clear change point"
            out.append(
                f"  periods: baseline {clock(p.baseline[0])}-{clock(p.baseline[1])}, "
                f"now {clock(p.now[0])}-{clock(p.now[1])} UTC ({onset})"
            )
        for r in m.results:
            state = {True: "holds", False: "fails", None: "unknown"}[r.verdict.holds]
            nums = ", ".join(f"{k}={_short(v)}" for k, v in r.verdict.numbers.items())
            note = f" [{r.verdict.note}]" if r.verdict.note else ""
            missing = f" [no series: {', '.join(r.missing)}]" if r.missing else ""
            out.append(
                f"  {r.group:<10} {state:<7} {r.condition.describe():<58} {nums}{note}{missing}"
            )
        out.append("")
    return "\n".join(out)


def _short(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    return f"{v:.4g}"
