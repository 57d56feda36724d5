"""Forward a diagnosed alert to a Slack-compatible incoming webhook (Slack, Mattermost, ...).

The message says which alert fired and for what, then the diagnosis: its top finding with the
evidence, the cause, the fix and the runbook link. When the diagnosis did not confirm the
alert's playbook, the message says so and still gives that playbook's cause and runbook.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from diagnoser.catalog import Catalog
from diagnoser.report import evidence_line

MAX_EVIDENCE = 5


class NotifyError(Exception):
    """The chat webhook could not be reached or refused the message (never shows the URL)."""


def _clock(iso: str | None) -> str:
    return f"{iso[11:16]} UTC" if iso else "the start of the window"


def _scope(scope: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in scope.items())


def message(record: dict[str, Any], catalog: Catalog) -> str:
    """The message text (Slack mrkdwn) for one record of ``Webhook.record``."""
    playbook = record["playbook"]
    lines = [
        f"*{record['alert']}* ({record.get('severity') or 'no severity'}) on "
        f"{_scope(record['scope'])}: {record.get('summary') or playbook}"
    ]
    doc = record.get("diagnosis")
    findings = doc["findings"] if doc else []
    if record.get("error"):
        lines.append(f"*Diagnosis failed:* {record['error']}")
    elif not findings:
        lines.append(
            f"*Diagnosis:* no playbook matched over the last {record['since_seconds'] / 60:g} "
            "min (see the undecided list in the JSON record)."
        )
    if findings:
        top = findings[0]
        lines.append(
            f"*Diagnosis:* {top['title']} (`{top['id']}`, confidence {top['confidence']:.0%}, "
            f"since {_clock(top['onset'])})"
        )
        shown = [
            e for e in top["evidence"] if e["holds"] and e["group"] in ("all", "any", "supporting")
        ]
        if shown:
            lines.append("*Evidence:* " + "; ".join(evidence_line(e) for e in shown[:MAX_EVIDENCE]))
        lines.append(f"*Cause:* {' '.join(top['cause'].split())}")
        lines.append("*Fix:*")
        lines += [f"{i}. {step}" for i, step in enumerate(top["fix"], 1)]
        lines.append(f"*Runbook:* <{top['runbook']}|{top['id']}>")
    if not findings or findings[0]["id"] != playbook:
        rank = record.get("playbook_rank")
        state = f"ranked {rank} in the diagnosis" if rank else "not confirmed by the diagnosis"
        lines.append(f"*The alert's playbook* `{playbook}` ({state}):")
        if playbook in catalog:
            lines.append(f"*Cause:* {' '.join(catalog[playbook].cause.split())}")
        lines.append(f"*Runbook:* <{record['runbook_url']}|{playbook}>")
    return "\n".join(lines)


class SlackForwarder:
    """POSTs ``{"text": ...}`` to an incoming-webhook URL."""

    def __init__(self, url: str, catalog: Catalog, timeout: float = 10.0):
        self.url, self.catalog, self.timeout = url, catalog, timeout

    def send(self, record: dict[str, Any]) -> None:
        body = json.dumps({"text": message(record, self.catalog)}).encode()
        req = urllib.request.Request(
            self.url, data=body, headers={"Content-Type": "application/json"}, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                resp.read()
        except urllib.error.HTTPError as exc:
            raise NotifyError(f"the chat webhook answered HTTP {exc.code}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise NotifyError(f"the chat webhook cannot be reached: {reason}") from None
