"""The chat message (Slack mrkdwn) for one diagnosed alert.

It says which alert fired and for what, then the diagnosis: its top finding with the
evidence, the cause, the fix and the runbook link. When the diagnosis did not confirm the
alert's playbook, the message says so and still gives that playbook's cause and runbook.

Slack-compatible servers read the same text in their own ways: Slack as mrkdwn (``<...>``
makes links and mentions), Mattermost and Rocket.Chat as Markdown (``[text](url)``, bare
URLs, ``@channel``, ``@all``). Every line but the runbook links is escaped for both: Slack's
three characters (``mrkdwn``) and ``plumbing.printable.defang``, so what an alert or a label
brought can neither notify anyone nor become a link. A link is only ever an http(s) URL.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from diagnoser.diagnosis.model import Diagnosis
from diagnoser.plumbing.printable import defang, inert, printable
from diagnoser.report.format import (
    NO_CURRENT_CAUSE,
    NO_SERIES,
    clock,
    ended_before_line,
    evidence_lines,
    health_line,
    idle_line,
    nothing_found,
    resolved_head,
    scope_text,
    since,
    unexplained,
)
from diagnoser.site import Site

MAX_EVIDENCE = 5


def mrkdwn(text: str) -> str:
    """``text`` with Slack's control characters escaped (its documented three): a ``<`` in an
    alert's summary or a label value cannot make a link or a ``<!channel>`` mention."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Link(str):
    """A runbook link, ``<url|text>``, built from escaped parts and left as it is."""


def link(url: str, text: str) -> _Link:
    """``<url|text>``; a URL that is not http(s) (``javascript:``, say) is no link, only text."""
    if urlsplit(url.strip()).scheme.lower() not in ("http", "https"):
        return _Link(defang(mrkdwn(f"{text} ({url})")))
    return _Link(f"<{mrkdwn(url).replace('|', '%7C')}|{defang(mrkdwn(text))}>")


def _line(parts: str | list[str]) -> str:
    parts = [parts] if isinstance(parts, str) else parts
    return " ".join(p if isinstance(p, _Link) else defang(mrkdwn(p)) for p in parts)


def _text(lines: list[str | list[str]]) -> str:
    return inert("\n".join(_line(line) for line in lines))


def message(record: dict[str, Any], d: Diagnosis | None, site: Site) -> str:
    """``record`` is the webhook's record of the alert (its JSON line); ``d`` its diagnosis.
    What the alert brought (its name, severity, summary, playbook, runbook URL, labels) is
    printed with its control characters escaped (``plumbing.printable``)."""
    record = {k: printable(v) if isinstance(v, str) else v for k, v in record.items()}
    playbook = record.get("playbook")
    lines: list[str | list[str]] = [
        f"*{record['alert']}* ({record.get('severity') or 'no severity'}) on "
        f"{scope_text(record['scope'])}: {record.get('summary') or playbook or record['alert']}"
    ]
    findings = d.findings if d else []
    if d is not None and d.warnings:  # a partial answer: what is missing may be the cause
        lines.append("*Partial answer:* " + "; ".join(d.warnings))
    if d is not None:
        lines += [f"*State:* {scope_text(h.scope)}: {health_line(h)}" for h in d.health]
    resolved = d.resolved if d is not None and not record.get("error") else []
    if record.get("error"):
        lines.append(f"*Diagnosis failed:* {record['error']}")
    elif not findings and resolved:  # what fired ended in the window: no cause now
        lines.append(f"*Diagnosis:* {NO_CURRENT_CAUSE}")
    elif not findings:
        sick = unexplained(d) if d else []
        quiet = nothing_found(d) if d else None
        if sick:
            lines.append(
                "*Diagnosis:* UNHEALTHY and no known problem pattern explains it: "
                + "; ".join(r for h in sick for r in h.reasons)
            )
        elif quiet == NO_SERIES:  # missing data is not health
            lines.append(f"*Diagnosis:* {NO_SERIES}")
        elif d is not None and quiet is None and d.idle:  # nothing with traffic to judge
            lines += [f"*Diagnosis:* {idle_line(s)}" for s in d.idle]
        else:
            lines.append(
                f"*Diagnosis:* no playbook matched over the last "
                f"{record['since_seconds'] / 60:g} min (see the undecided list in the JSON "
                "record)."
            )
    top = d.for_alert(playbook)[0] if d is not None and findings else None
    if d is not None and top is not None:
        head = "Diagnosis" if playbook else "Cause found"
        lines.append(
            f"*{head}:* {top.playbook.title} (`{top.playbook.id}`, confidence "
            f"{top.confidence:.0%}, {since(d, top)})"
        )
        shown = evidence_lines(d, top, MAX_EVIDENCE)
        if shown:
            lines.append("*Evidence:* " + "; ".join(shown))
        lines.append(f"*Cause:* {' '.join(top.playbook.cause.split())}")
        lines.append("*Fix:*")
        lines += [f"{i}. {step}" for i, step in enumerate(top.playbook.fix, 1)]
        lines.append(["*Runbook:*", link(d.runbook(top), top.playbook.id)])
    if d is not None and not record.get("error"):
        lines += _resolved(d)
    own = d.resolved_of(playbook) if d is not None and resolved else None
    if playbook is None:
        if record.get("runbook_url") and top is None:
            lines.append(["*Runbook:*", link(record["runbook_url"], record["alert"])])
        return _text(lines)
    if top is None or top.playbook.id != playbook:
        rank, cause = record.get("playbook_rank"), record.get("explained_by")
        if own is not None and own.end is not None:
            state = f"its pattern ended at {clock(own.end)}: resolved"
        elif cause and rank:
            state = f"ranked {rank} in the diagnosis, behind its cause `{cause}`"
        elif cause:
            state = f"not matched on its own; `{cause}` above accounts for its symptoms"
        else:
            state = f"ranked {rank} in the diagnosis" if rank else "not confirmed by the diagnosis"
        lines.append(f"*The alert's playbook* `{playbook}` ({state}):")
        if playbook in site.catalog:
            lines.append(f"*Cause:* {' '.join(site.catalog[playbook].cause.split())}")
        lines.append(["*Runbook:*", link(record["runbook_url"], playbook)])
    return _text(lines)


def _resolved(d: Diagnosis) -> list[str | list[str]]:
    """The findings that ended in the window, one line each with its evidence and runbook
    link, and what ended just before it: none is the cause of what fired."""
    lines: list[str | list[str]] = ["*Resolved in the window:*"] if d.resolved else []
    for m in d.resolved:
        shown = evidence_lines(d, m, MAX_EVIDENCE)
        evidence = f" ({'; '.join(shown)})" if shown else ""
        lines.append([f"{resolved_head(m)}{evidence}", link(d.runbook(m), "runbook")])
    before = ended_before_line(d)
    return lines if before is None else [*lines, before]
