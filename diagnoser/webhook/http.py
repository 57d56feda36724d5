"""The HTTP side of ``servediag webhook``: Alertmanager posts here; health and metrics.

``POST /alerts`` (or ``/``) takes a notification: 200 when it was accepted (queued, or
nothing in it needed a diagnosis), 400 for a body that is not a notification, 413 for one over
1 MiB, 503 when the queue is full. ``GET /healthz`` answers ``ok``; ``GET /metrics`` exposes
the receiver's own counters for Prometheus.
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from diagnoser.webhook.payload import PayloadError, parse_notification
from diagnoser.webhook.receiver import Webhook

log = logging.getLogger("servediag.webhook")

MAX_BODY = 1 << 20
DRAIN_LIMIT = 8 * MAX_BODY  # larger bodies are not read at all: the connection is closed
POST_PATHS = ("/", "/alerts")
HELP = {
    "notifications": "Alertmanager notifications received, by outcome.",
    "alerts": "Alerts in the notifications, by what was done with them.",
    "diagnoses": "Diagnoses run, by outcome.",
    "forwards": "Messages forwarded to the chat webhook, by outcome.",
}


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
    ]
    return "\n".join(out) + "\n"


def make_handler(webhook: Webhook) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "servediag-webhook"

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
            body = self.rfile.read(length)
            try:
                notification = parse_notification(body)
            except PayloadError as exc:
                webhook.counters.add("notifications", "bad_request")
                log.warning("refused a notification from %s: %s", self.client_address[0], exc)
                self._answer(400, {"error": str(exc)})
                return
            if webhook.accept(notification):
                webhook.counters.add("notifications", "accepted")
                self._answer(200, {"status": "accepted"})
            else:
                webhook.counters.add("notifications", "queue_full")
                self._answer(503, {"error": "queue full, retry later"})

        def log_message(self, format: str, *args: object) -> None:
            log.debug("%s %s", self.client_address[0], format % args)

    return Handler


class Server(ThreadingHTTPServer):
    daemon_threads = True


def serve(
    webhook: Webhook,
    host: str,
    port: int,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve until ``stop`` is set; then stop taking requests and stop the workers."""
    stop = stop or threading.Event()
    server = Server((host, port), make_handler(webhook))
    webhook.start()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2})
    thread.start()
    log.info("listening on http://%s:%d/alerts", host, server.server_address[1])
    if ready is not None:
        ready.set()
    try:
        # Wake up now and then: a signal delivered to another thread (SIGTERM from a
        # container runtime, say) runs its handler only when the main thread does.
        while not stop.wait(0.5):
            pass
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
        webhook.close()
