"""The terminal report: each model's state first, then the likely cause, for on-call at 3 a.m."""

from __future__ import annotations

from diagnoser.diagnosis.model import Diagnosis, what_if_of
from diagnoser.report.format import (
    NO_CURRENT_CAUSE,
    NO_SERIES,
    clock,
    day,
    ended_before_line,
    evidence_lines,
    health_line,
    idle_line,
    needs,
    nothing_found,
    resolved_head,
    scope_text,
    since,
    unexplained,
    wrap,
)
from diagnoser.report.whatif import finding_lines

MAX_EVIDENCE = 6


def text(d: Diagnosis, colour: bool = False) -> str:
    def c(code: str, s: str) -> str:
        return f"\033[{code}m{s}\033[0m" if colour else s

    w = d.window
    out = [
        f"diagnose {clock(w.start)} - {clock(w.end)} ({day(w.start)}), baseline "
        f"{clock(w.baseline_start)} - {clock(w.baseline_end)}"
    ]
    if d.warnings:  # a partial answer (Thanos, Mimir): what is missing may be the cause
        out += [c("33", ln) for ln in wrap("PARTIAL ANSWER: " + "; ".join(d.warnings), "")]
    colours = {"unhealthy": "31;1", "healthy": "32", "idle": "33", "unknown": "33"}
    for h in d.health:
        out.append(f"{scope_text(h.scope)}: " + c(colours[h.verdict], health_line(h)))
    causeless = [h for h in d.health if h.verdict == "unhealthy" and not d.findings_for(h.scope)]
    sick = unexplained(d)
    nothing = nothing_found(d)
    if not d.findings and d.resolved:  # what made it sick ended: no cause now, none likely
        out.append(c("32", NO_CURRENT_CAUSE))
    elif len(causeless) > len(sick):
        out += [
            f"{scope_text(h.scope)}: no current cause: its incidents below ended in the window."
            for h in causeless
            if d.resolved_for(h.scope)
        ]
    elif nothing is not None:
        out.append(c("33" if nothing == NO_SERIES else "32", nothing))
    for h in sick:
        out.append("")
        out += [
            c("31;1", line)
            for line in wrap(
                f"{scope_text(h.scope)} is UNHEALTHY and no known problem pattern explains it: "
                + "; ".join(h.reasons)
                + ".",
                "",
            )
        ]
        near = d.nearest(h.scope)
        if near:
            out += wrap(
                "nearest playbooks: "
                + "; ".join(
                    f"{m.playbook.id} ({f.condition.describe()} does not hold: "
                    f"{d.evidence_text(f)})"
                    if f
                    else f"{m.playbook.id} ({m.reason})"
                    for m, f in near
                ),
                "   ",
            )
    for idle in d.idle:
        out.append(c("33", idle_line(idle)))
    floor = d.site.config.traffic_floor_rps
    for quiet in d.below_floor:
        out += wrap(
            f"{scope_text(quiet)}: traffic stayed below the site's traffic floor "
            f"({floor:g} req/s), so its alerts are silenced; diagnosed from little data.",
            "",
        )
    if d.reach is not None and d.looked_back:
        reached = d.reach.first_sample
        how_far = (
            f"the data goes back to {clock(reached)} ({day(reached)})"
            if reached is not None and reached > d.reach.start + 3600
            else f"from {clock(d.reach.start)} ({day(d.reach.start)})"
        )
        out += wrap(
            f"looked back {d.reach.requested / 3600:g} h for "
            f"{', '.join(scope_text(s) for s in d.looked_back)}: {how_far}",
            "",
        )
    for i, m in enumerate(d.findings, 1):
        pb = m.playbook
        head = "LIKELY CAUSE" if i == 1 else "ALSO POSSIBLE"
        sev = c("31;1" if pb.severity == "critical" else "33;1", pb.severity)
        out.append("")
        out.append(c("1", f"{i}. {head}: {pb.title}") + f"  [{pb.id}]")
        expl = f"; a consequence of {m.explained_by}" if m.explained_by else ""
        out.append(
            f"   {scope_text(m.scope)} | {since(d, m)} | confidence {m.confidence:.0%} | "
            f"{sev}{expl}"
        )
        shown = evidence_lines(d, m, MAX_EVIDENCE)
        if shown:
            out.append("   evidence: " + "; ".join(shown))
        if i == 1:
            out += wrap(f"cause: {pb.cause}", "   ")
            out.append("   fix:")
            for k, step in enumerate(pb.fix, 1):
                lines = wrap(f"{k}. {step}", "     ")
                out += [lines[0], *("   " + ln for ln in lines[1:])]
            out += wrap(f"guardrail: {pb.guardrail[0]}", "   ")
        else:
            out += wrap(f"fix: {pb.fix[0]}", "   ")
        out.append(f"   runbook: {d.runbook(m)}")
        for caveat in m.caveats:
            out += wrap(f"caveat: {caveat}", "   ")
        for hint in m.hints:
            out.append(f"   hint: see also {hint.id} (advisory)")
        predicted = what_if_of(d, m)
        if predicted is not None:
            out += finding_lines(predicted)
    for i, m in enumerate(d.resolved, len(d.findings) + 1):
        out.append("")
        out.append(c("1", f"{i}. {resolved_head(m)}"))
        expl = f" | a consequence of {m.explained_by}" if m.explained_by else ""
        out += wrap(
            f"{m.playbook.title} | {scope_text(m.scope)} | confidence {m.confidence:.0%}{expl}",
            "   ",
        )
        shown = evidence_lines(d, m, MAX_EVIDENCE)
        if shown:
            out += wrap("evidence: " + "; ".join(shown), "   ")
        out.append(f"   runbook: {d.runbook(m)}")
    ruled = d.ruled_out()
    out.append("")
    before = ended_before_line(d)
    if before:
        out += wrap(before, "")
    if ruled:
        out += wrap("ruled out: " + "; ".join(f"{r.playbook.id} ({r.reason})" for r in ruled), "")
    if d.undecided:
        out += wrap(
            "undecided (missing data is not health): "
            + "; ".join(
                f"{u.playbook.id} {needs(u)}"
                + (f" from {' / '.join(d.providers(u))}" if d.providers(u) else "")
                + (f" ({d.engine_gap(u)})" if d.engine_gap(u) else "")
                for u in d.undecided
            ),
            "",
        )
    read = f"{d.queries} queries, {d.query_seconds:.1f} s in Prometheus"
    if d.recorded:
        read += f"; {d.recorded} signals read from the site's recording rules"
    elif d.not_recorded:
        read += f"; no recording rule read: {d.not_recorded}"
    out.append(read)
    return "\n".join(out) + "\n"
