"""Forward a diagnosed alert to a Slack-compatible incoming webhook (Slack, Mattermost, ...);
the message itself is ``report.chat``.

A delivery has one deadline (``timeout``: connections, answers, retries and ``Retry-After``
waits), so a chat server that answers slowly holds a worker no longer than that. A refused
connection, a 429 or a 503 is retried within it (twice at most): none of them took the
message. A redirect is a failed delivery: following it would resend the message as a GET
without its body (what ``urllib`` does with a 302), and the chat server would answer as if
the message had arrived.
"""

from __future__ import annotations

import json
import time
from typing import Any

from diagnoser.diagnosis import Diagnosis
from diagnoser.plumbing import http
from diagnoser.report.chat import message
from diagnoser.site import Site

MAX_ANSWER = 1 << 16
RETRIES = 2  # after a refused connection, or a 429 or 503 (the message was not taken)
RETRY_STATUSES = (429, 503)
RETRY_PAUSE = 0.5  # doubled at each retry, unless the server says how long (Retry-After)


class NotifyError(Exception):
    """The chat webhook could not be reached or refused the message (never shows the URL)."""


class SlackForwarder:
    """POSTs ``{"text": ...}`` to an incoming-webhook URL."""

    def __init__(self, url: str, site: Site, timeout: float = 10.0):
        self.url, self.site, self.timeout = url, site, timeout

    def send(self, record: dict[str, Any], diagnosis: Diagnosis | None) -> None:
        body = json.dumps({"text": message(record, diagnosis, self.site)}).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "servediag-webhook"}
        at = time.monotonic() + self.timeout
        retries = 0
        while True:
            try:
                resp = http.request("POST", self.url, at, headers, body, MAX_ANSWER)
            except http.TimedOut:
                raise NotifyError(
                    f"the chat webhook did not answer within {self.timeout:g} s"
                ) from None
            except http.TooLarge:
                raise NotifyError(
                    f"the chat webhook's answer is longer than {MAX_ANSWER // 1024} KiB"
                ) from None
            except http.ConnectError as exc:  # nothing was sent: a retry cannot post twice
                if not exc.tls and retries < RETRIES and http.pause(RETRY_PAUSE, at):
                    retries += 1
                    continue
                raise NotifyError(f"the chat webhook cannot be reached: {exc}") from None
            except http.HttpError as exc:
                raise NotifyError(f"the chat webhook cannot be reached: {exc}") from None
            note = ""
            if resp.status in RETRY_STATUSES and retries < RETRIES:
                asked = http.retry_after(resp.headers.get("retry-after"))
                if http.pause(RETRY_PAUSE * 2**retries if asked is None else asked, at):
                    retries += 1
                    continue
                if asked is not None:
                    note = f" and asked to retry after {asked:g} s, past the {self.timeout:g} s"
            break
        if 300 <= resp.status < 400:
            raise NotifyError(
                f"the chat webhook answered HTTP {resp.status}, a redirect: not followed, so "
                "the message was not delivered (use the URL it redirects to)"
            )
        if not 200 <= resp.status < 300:
            raise NotifyError(f"the chat webhook answered HTTP {resp.status}{note}")
