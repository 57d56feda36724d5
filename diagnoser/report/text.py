"""The terminal report: the answer first, for on-call at 3 a.m."""

from __future__ import annotations

from diagnoser.diagnose.model import Diagnosis
from diagnoser.report.format import clock, day, evidence_lines, scope_text, wrap

MAX_EVIDENCE = 6


def text(d: Diagnosis, colour: bool = False) -> str:
    def c(code: str, s: str) -> str:
        return f"\033[{code}m{s}\033[0m" if colour else s

    w = d.window
    out = [
        f"diagnose {clock(w.start)} - {clock(w.end)} ({day(w.start)}), baseline "
        f"{clock(w.baseline_start)} - {clock(w.baseline_end)}"
    ]
    if not d.findings:
        if d.scopes and len(d.idle) < len(d.scopes):
            out.append(
                c(
                    "32",
                    "No known problem pattern matches: every checked playbook was "
                    "ruled out or did not match.",
                )
            )
        elif not d.scopes:
            out.append(
                c(
                    "33",
                    "No vLLM series in the window: nothing to diagnose (check the "
                    "URL, the selectors, and that vLLM is scraped).",
                )
            )
    for idle in d.idle:
        out.append(
            c(
                "33",
                f"{scope_text(idle)}: no traffic in the window (fewer than one finished "
                "request per 100 s), so its latency and load patterns cannot be "
                "judged.",
            )
        )
    floor = d.site.config.traffic_floor_rps
    for quiet in d.below_floor:
        out += wrap(
            f"{scope_text(quiet)}: traffic stayed below the site's traffic floor "
            f"({floor:g} req/s), so its alerts are silenced; diagnosed from little data.",
            "",
        )
    for i, m in enumerate(d.findings, 1):
        pb = m.playbook
        head = "LIKELY CAUSE" if i == 1 else "ALSO POSSIBLE"
        sev = c("31;1" if pb.severity == "critical" else "33;1", pb.severity)
        out.append("")
        out.append(c("1", f"{i}. {head}: {pb.title}") + f"  [{pb.id}]")
        since = f"since {clock(m.onset)}" if m.onset is not None else "through the window"
        expl = f"; a consequence of {m.explained_by}" if m.explained_by else ""
        out.append(
            f"   {scope_text(m.scope)} | {since} | confidence {m.confidence:.0%} | {sev}{expl}"
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
        for h in m.hints:
            out.append(f"   hint: see also {h.id} (advisory)")
    ruled = d.ruled_out()
    out.append("")
    if ruled:
        out += wrap("ruled out: " + "; ".join(f"{r.playbook.id} ({r.reason})" for r in ruled), "")
    if d.undecided:
        out += wrap(
            "undecided (missing data is not health): "
            + "; ".join(
                f"{u.playbook.id} needs {', '.join(u.missing) or 'more samples'}"
                + (f" from {' / '.join(d.providers(u))}" if d.providers(u) else "")
                for u in d.undecided
            ),
            "",
        )
    out.append(f"{d.queries} queries, {d.query_seconds:.1f} s in Prometheus")
    return "\n".join(out) + "\n"
