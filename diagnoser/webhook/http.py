"""The HTTP side of ``servediag webhook``: Alertmanager posts here; health and metrics.

``POST /alerts`` (or ``/``) takes a notification: 200 when it was accepted (queued, or
nothing in it needed a diagnosis), 400 for a body that is not a notification (or JSON nested
too deeply), 413 for one over 1 MiB or with more new alerts than the queue holds, 503 when
the queue is full or the receiver is stopping. ``GET /healthz`` answers ``ok`` (503 while
stopping); ``GET /metrics`` exposes the receiver's own counters for Prometheus.

The edge holds up under load and against slow or hostile clients (``plumbing.listener``): at
most ``MAX_CONNECTIONS`` served at once, the next waiting in a listen backlog of ``BACKLOG``,
``CLIENT_TIMEOUT`` seconds for each read from a client and ``CLIENT_DEADLINE`` for a whole
request, after which its connection is closed, and a request head of at most 32 KiB and 64
header fields. Log lines escape control and bidirectional characters (``SafeFormatter``), so a
label value can neither forge one nor show it in another order.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from diagnoser.plumbing import listener
from diagnoser.plumbing.printable import inert, printable
from diagnoser.webhook.payload import PayloadError, parse_notification
from diagnoser.webhook.receiver import Webhook
from diagnoser.webhook.stop import SignalStop

log = logging.getLogger("servediag.webhook")

BACKLOG = listener.BACKLOG  # connections waiting to be accepted
MAX_CONNECTIONS = 64  # served at once; Alertmanager sends one notification at a time per group
CLIENT_TIMEOUT = listener.CLIENT_TIMEOUT  # seconds for each read from a client
CLIENT_DEADLINE = listener.CLIENT_DEADLINE  # seconds for a whole request
DRAIN_TIMEOUT = 8.0  # on SIGTERM: time to finish the queue (--drain-timeout)
STOP_POLL = 0.2  # seconds between two looks at whether a signal asked to stop
MAX_BODY = 1 << 20
DRAIN_LIMIT = 8 * MAX_BODY  # larger bodies are not read at all: the connection is closed
POST_PATHS = ("/", "/alerts")
HELP = {
    "notifications": "Alertmanager notifications received, by outcome.",
    "alerts": "Alerts in the notifications, by what was done with them.",
    "diagnoses": "Diagnoses run, by outcome.",
    "forwards": "Messages forwarded to the chat webhook, by outcome.",
    "records": "Records of alerts, printed on stdout or logged (stdout could not be written).",
}
REFUSED = {
    "queue_full": (503, "queue full, retry later"),
    "draining": (503, "the receiver is stopping, retry later"),
    "too_many": (413, "more new alerts than --queue-size; set max_alerts in webhook_config"),
}


class SafeFormatter(logging.Formatter):
    """A formatter whose messages are one line each, shown as they are: every control,
    line-separator and bidirectional character in what a client or a server sent (a label
    value with a newline, or a U+202E that shows the line in another order) is written as an
    escape (``plumbing.printable``), so no log line can be forged or disguised. A traceback
    keeps its lines, each of them inert."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return inert(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return inert(super().formatStack(stack_info))


def metrics_text(webhook: Webhook) -> str:
    values = webhook.counters.snapshot()
    out = []
    for family, text in HELP.items():
        name = f"servediag_webhook_{family}_total"
        out += [f"# HELP {name} {text}", f"# TYPE {name} counter"]
        for (fam, outcome), n in sorted(values.items()):
            if fam == family:
                out.append(f'{name}{{outcome="{outcome}"}} {n}')
    out += [
        "# HELP servediag_webhook_queue_groups Alert groups waiting for a diagnosis.",
        "# TYPE servediag_webhook_queue_groups gauge",
        f"servediag_webhook_queue_groups {webhook.dispatcher.depth()}",
        "# HELP servediag_webhook_queue_alerts Alerts waiting for a diagnosis.",
        "# TYPE servediag_webhook_queue_alerts gauge",
        f"servediag_webhook_queue_alerts {webhook.dispatcher.waiting()}",
    ]
    return "\n".join(out) + "\n"


def make_handler(webhook: Webhook) -> type[BaseHTTPRequestHandler]:
    class Handler(listener.Handler):
        server_version = "servediag-webhook"
        timeout = CLIENT_TIMEOUT
        deadline = CLIENT_DEADLINE

        def _answer(self, code: int, doc: dict[str, object] | str) -> None:
            text = doc if isinstance(doc, str) else json.dumps(doc) + "\n"
            body = text.encode()
            self.send_response(code)
            ctype = "text/plain; version=0.0.4" if isinstance(doc, str) else "application/json"
            self.send_header("Content-Type", f"{ctype}; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/healthz":
                if webhook.draining:
                    self._answer(503, "stopping\n")
                else:
                    self._answer(200, "ok\n")
            elif path == "/metrics":
                self._answer(200, metrics_text(webhook))
            else:
                self._answer(404, {"error": "not found: POST /alerts, GET /healthz, /metrics"})

        def do_POST(self) -> None:
            if self.path.split("?")[0] not in POST_PATHS:
                self._answer(404, {"error": "POST notifications to /alerts"})
                return
            try:
                length = int(self.headers.get("Content-Length", ""))
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                webhook.counters.add("notifications", "bad_request")
                log.warning(
                    "refused a notification from %s: body length %s (at most %d bytes)",
                    self.client_address[0],
                    self.headers.get("Content-Length", "missing"),
                    MAX_BODY,
                )
                if MAX_BODY < length <= DRAIN_LIMIT:  # read it, so the client sees the 413
                    left = length
                    while left > 0 and (chunk := self.rfile.read(min(1 << 16, left))):
                        left -= len(chunk)
                self._answer(413 if length > MAX_BODY else 400, {"error": "bad body length"})
                return
            if webhook.draining:  # before reading: the answer does not depend on the body
                self.close_connection = True
                self._refuse("draining")
                return
            body = self.rfile.read(length)
            if len(body) < length:
                webhook.counters.add("notifications", "bad_request")
                log.warning(
                    "dropped a notification from %s: %d of %d bytes arrived in time",
                    self.client_address[0],
                    len(body),
                    length,
                )
                self.close_connection = True
                return
            try:
                notification = parse_notification(body)
            except PayloadError as exc:
                webhook.counters.add("notifications", "bad_request")
                log.warning("refused a notification from %s: %s", self.client_address[0], exc)
                self._answer(400, {"error": str(exc)})
                return
            outcome = webhook.accept(notification)
            if outcome == "accepted":
                webhook.counters.add("notifications", "accepted")
                self._answer(200, {"status": "accepted"})
            else:
                self._refuse(outcome)

        def _refuse(self, outcome: str) -> None:
            webhook.counters.add("notifications", outcome)
            code, why = REFUSED[outcome]
            self._answer(code, {"error": why})

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.client_address[0], format % args)

    return Handler


class Server(listener.Server):
    max_connections = MAX_CONNECTIONS


def serve(
    webhook: Webhook,
    host: str,
    port: int,
    ready: threading.Event | None = None,
    stop: threading.Event | SignalStop | None = None,
    drain: float = DRAIN_TIMEOUT,
) -> None:
    """Serve until ``stop`` is set; then drain: notifications are answered 503 while the
    queue gets up to ``drain`` seconds to finish (less when a second signal cuts the drain
    short, with a ``SignalStop``), and alerts left are emitted as undone."""
    stop = stop or threading.Event()
    server = Server((host, port), make_handler(webhook))
    webhook.start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.start()
    log.info("listening on http://%s:%d/alerts", host, server.server_address[1])
    if ready is not None:
        ready.set()
    stopping = stop if isinstance(stop, SignalStop) else None
    try:
        # Poll: a signal handler only sets a flag (see webhook.stop), and a signal delivered
        # to another thread runs its handler only when the main thread wakes up.
        while not stop.is_set():
            time.sleep(STOP_POLL)
        if stopping is not None:
            log.info("stopping %s; a second signal ends the drain at once", stopping.why())
    finally:
        try:
            webhook.drain(drain, stopping)
        finally:
            server.shutdown()
            thread.join()
            server.server_close()
