"""The chat message (Slack mrkdwn) for one diagnosed alert.

It says which alert fired and for what, then the diagnosis: its top finding with the
evidence, the cause, the fix and the runbook link. When the diagnosis did not confirm the
alert's playbook, the message says so and still gives that playbook's cause and runbook.
"""

from __future__ import annotations

from typing import Any

from diagnoser.diagnose.model import Diagnosis
from diagnoser.report.format import clock, evidence_lines, scope_text
from diagnoser.site import Site

MAX_EVIDENCE = 5


def message(record: dict[str, Any], d: Diagnosis | None, site: Site) -> str:
    """``record`` is the webhook's record of the alert (its JSON line); ``d`` its diagnosis."""
    playbook = record["playbook"]
    lines = [
        f"*{record['alert']}* ({record.get('severity') or 'no severity'}) on "
        f"{scope_text(record['scope'])}: {record.get('summary') or playbook}"
    ]
    findings = d.findings if d else []
    if record.get("error"):
        lines.append(f"*Diagnosis failed:* {record['error']}")
    elif not findings:
        lines.append(
            f"*Diagnosis:* no playbook matched over the last {record['since_seconds'] / 60:g} "
            "min (see the undecided list in the JSON record)."
        )
    if d is not None and findings:
        top = findings[0]
        since = clock(top.onset) if top.onset is not None else "the start of the window"
        lines.append(
            f"*Diagnosis:* {top.playbook.title} (`{top.playbook.id}`, confidence "
            f"{top.confidence:.0%}, since {since})"
        )
        shown = evidence_lines(d, top, MAX_EVIDENCE)
        if shown:
            lines.append("*Evidence:* " + "; ".join(shown))
        lines.append(f"*Cause:* {' '.join(top.playbook.cause.split())}")
        lines.append("*Fix:*")
        lines += [f"{i}. {step}" for i, step in enumerate(top.playbook.fix, 1)]
        lines.append(f"*Runbook:* <{d.runbook(top)}|{top.playbook.id}>")
    if not findings or findings[0].playbook.id != playbook:
        rank = record.get("playbook_rank")
        state = f"ranked {rank} in the diagnosis" if rank else "not confirmed by the diagnosis"
        lines.append(f"*The alert's playbook* `{playbook}` ({state}):")
        if playbook in site.catalog:
            lines.append(f"*Cause:* {' '.join(site.catalog[playbook].cause.split())}")
        lines.append(f"*Runbook:* <{record['runbook_url']}|{playbook}>")
    return "\n".join(lines)
