"""The Markdown report, for a ticket or a postmortem."""

from __future__ import annotations

from diagnoser.diagnosis.match import Match
from diagnoser.diagnosis.model import Diagnosis, what_if_of
from diagnoser.plumbing.durations import iso
from diagnoser.plumbing.printable import defang
from diagnoser.report.format import (
    NO_CURRENT_CAUSE,
    NO_SERIES,
    ended_before_line,
    health_line,
    needs,
    nothing_found,
    scope_text,
    since,
    span,
    unexplained,
)
from diagnoser.report.whatif import finding_lines


def cell(text: str) -> str:
    """``text`` for a table cell: a ``|`` in a label value would end the cell."""
    return text.replace("|", "\\|")


def plain(text: str) -> str:
    """What came from outside (label values, a server's warning), as text and nothing else
    once rendered: HTML written as entities (no tag, no image), no mention, link or URL
    (``plumbing.printable.defang``)."""
    return defang(text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))


def markdown(d: Diagnosis) -> str:
    w = d.window
    out = [f"## Diagnosis {iso(w.start)} - {iso(w.end)}", ""]
    if d.warnings:
        out += ["**Partial answer:** " + plain("; ".join(d.warnings)), ""]
    if d.health:
        out += ["| Model | State |", "|---|---|"]
        out += [
            f"| {cell(plain(scope_text(h.scope)))} | {cell(plain(health_line(h)))} |"
            for h in d.health
        ]
        out.append("")
    causeless = [h for h in d.health if h.verdict == "unhealthy" and not d.findings_for(h.scope)]
    sick = unexplained(d)
    if not d.findings and d.resolved:
        out += [f"**{NO_CURRENT_CAUSE}**", ""]
    elif len(causeless) > len(sick):
        out += [
            f"**{plain(scope_text(h.scope))}: no current cause:** its incidents below ended in "
            "the window."
            for h in causeless
            if d.resolved_for(h.scope)
        ]
        out.append("")
    for h in sick:
        out.append(
            f"**{plain(scope_text(h.scope))} is unhealthy and no known problem pattern explains "
            "it:** " + plain("; ".join(h.reasons)) + "."
        )
        near = d.nearest(h.scope)
        if near:
            out.append("")
            out += [
                f"- nearest: `{m.playbook.id}`: "
                + (
                    f"{f.condition.describe()} does not hold ({d.evidence_text(f)})"
                    if f
                    else m.reason
                )
                for m, f in near
            ]
        out.append("")
    quiet = nothing_found(d)
    if quiet is not None:
        out += [f"**{quiet}**" if quiet == NO_SERIES else quiet, ""]
    for i, m in enumerate(d.findings, 1):
        pb = m.playbook
        out.append(f"### {i}. {pb.title} (`{pb.id}`)")
        out.append("")
        out.append(f"- **Scope:** {plain(scope_text(m.scope))}")
        out.append(f"- **Since:** {since(d, m)} ({iso(m.onset) or 'no onset found'})")
        out.append(f"- **Confidence:** {m.confidence:.0%} ({pb.severity})")
        if m.explained_by:
            out.append(f"- **Explained by:** `{m.explained_by}`")
        for caveat in m.caveats:
            out.append(f"- **Caveat:** {caveat}")
        out.append("")
        out.append("| Evidence | Holds |")
        out.append("|---|---|")
        for r in m.shown():
            text = cell(f"{d.evidence_text(r)} ({r.condition.describe()})")
            out.append(f"| {text} | {r.verdict.holds} |")
        out.append("")
        out.append(f"**Cause.** {' '.join(pb.cause.split())}")
        out.append("")
        out.append("**Fix.**")
        out += [f"{k}. {s}" for k, s in enumerate(pb.fix, 1)]
        out.append("")
        out.append("**Guardrail.** " + " ".join(pb.guardrail))
        out.append("")
        out.append(f"Runbook: {d.runbook(m)}")
        out.append("")
        predicted = what_if_of(d, m)
        if predicted is not None:
            # In a code block, where only a backquote could end it early.
            shown = (ln.replace("`", "'") for ln in finding_lines(predicted, ""))
            out += ["**What-if.**", "", "```", *shown, "```", ""]
    for i, m in enumerate(d.resolved, len(d.findings) + 1):
        out += _resolved(d, i, m)
    before = ended_before_line(d)
    if before:
        out += [plain(before), ""]
    if d.undecided:
        out.append("### Undecided")
        out += [
            f"- `{u.playbook.id}`: {needs(u)}"
            + (f" ({d.engine_gap(u)})" if d.engine_gap(u) else "")
            for u in d.undecided
        ]
    return "\n".join(out) + "\n"


def _resolved(d: Diagnosis, i: int, m: Match) -> list[str]:
    """A finding that ended in the window: when it held, its evidence and its runbook (its
    cause and fix are the runbook's, should it return)."""
    pb = m.playbook
    out = [f"### {i}. Resolved: {pb.title} (`{pb.id}`)", ""]
    out.append(f"- **Resolved:** {span(m)} ({iso(m.onset) or 'no onset found'} to {iso(m.end)})")
    out.append(f"- **Scope:** {plain(scope_text(m.scope))}")
    out.append(f"- **Confidence:** {m.confidence:.0%} ({pb.severity})")
    if m.explained_by:
        out.append(f"- **Explained by:** `{m.explained_by}`")
    out += ["", "| Evidence | Holds |", "|---|---|"]
    for r in m.shown():
        text = cell(f"{d.evidence_text(r)} ({r.condition.describe()})")
        out.append(f"| {text} | {r.verdict.holds} |")
    return [*out, "", f"Runbook: {d.runbook(m)}", ""]
