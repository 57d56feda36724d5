"""Forward a diagnosed alert to a Slack-compatible incoming webhook (Slack, Mattermost, ...);
the message itself is ``report.chat``."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from diagnoser.diagnose import Diagnosis
from diagnoser.report.chat import message
from diagnoser.site import Site


class NotifyError(Exception):
    """The chat webhook could not be reached or refused the message (never shows the URL)."""


class SlackForwarder:
    """POSTs ``{"text": ...}`` to an incoming-webhook URL."""

    def __init__(self, url: str, site: Site, timeout: float = 10.0):
        self.url, self.site, self.timeout = url, site, timeout

    def send(self, record: dict[str, Any], diagnosis: Diagnosis | None) -> None:
        body = json.dumps({"text": message(record, diagnosis, self.site)}).encode()
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
