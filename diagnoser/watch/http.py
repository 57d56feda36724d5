"""The HTTP side of ``servediag watch``: ``GET /metrics`` (the findings and how the cycles
went, ``watch.exposition``) and ``GET /healthz`` (200 while serving; its body says whether the
last cycle was good). With a receiver (``--alerts``), also ``POST /alerts``: Alertmanager's
notifications, taken as ``servediag webhook`` takes them (``webhook.http``), its counters on
``/metrics`` beside the watch's. The listener is the webhook's hardened one
(``plumbing.listener``): at most ``max_connections`` served at once, a timeout for each read, a
deadline for each connection, a bounded request head."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler

from diagnoser.plumbing import listener
from diagnoser.watch.exposition import CONTENT_TYPE
from diagnoser.watch.loop import POLL, Stop, Watch
from diagnoser.webhook import http as receiving
from diagnoser.webhook.receiver import Webhook
from diagnoser.webhook.stop import SignalStop

log = logging.getLogger("servediag.watch")

MAX_CONNECTIONS = 16  # a scraper or two, a health check, a person with curl


class Server(listener.Server):
    """The hardened listener, serving at most ``max_connections`` connections at once."""

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.max_connections = max_connections
        super().__init__(address, handler)


def make_handler(watch: Watch, receiver: Webhook | None = None) -> type[BaseHTTPRequestHandler]:
    """The watch's pages; with ``receiver``, on the webhook's handler (its ``POST /alerts``)."""
    base = listener.Handler if receiver is None else receiving.make_handler(receiver)
    paths = "GET /metrics, /healthz" + ("; POST /alerts" if receiver else "")

    class Handler(base):  # type: ignore[misc,valid-type]
        server_version = "servediag-watch"

        def _text(self, code: int, body: str, ctype: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                extra = receiving.metrics_text(receiver) if receiver else ""
                self._text(200, watch.render() + extra, CONTENT_TYPE)
            elif path == "/healthz":
                self._text(200, watch.health(), "text/plain; charset=utf-8")
            else:
                self._text(404, f"not found: {paths}\n", "text/plain; charset=utf-8")

    return Handler


def listen(
    watch: Watch,
    host: str,
    port: int,
    max_connections: int = MAX_CONNECTIONS,
    receiver: Webhook | None = None,
) -> Server:
    """The listener bound to HOST:PORT (``OSError`` when it cannot be), not yet serving."""
    return Server((host, port), make_handler(watch, receiver), max_connections)


def serve(
    watch: Watch,
    server: Server,
    stop: Stop,
    receiver: Webhook | None = None,
    drain: float = receiving.DRAIN_TIMEOUT,
) -> bool:
    """Serve ``/metrics`` and run the cycles until ``stop`` is set; then let ``receiver``
    finish the alerts it took (``drain`` seconds at most, new ones answered 503) and close the
    listener. Whether a cycle or a diagnosis was still running (abandoned: the caller may
    leave without it)."""
    if receiver is not None:
        receiver.start()
    http = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": POLL})
    http.start()
    cycles = threading.Thread(target=watch.run, args=(stop,), daemon=True, name="watch-cycles")
    cycles.start()
    host, port = server.server_address[:2]
    log.info("serving http://%s:%d/metrics; a cycle every %g s", host, port, watch.every)
    try:
        while not stop.is_set():  # a signal handler only sets a flag: poll it
            time.sleep(POLL)
    finally:
        try:
            if receiver is not None:
                receiver.drain(drain, stop if isinstance(stop, SignalStop) else None)
        finally:
            server.shutdown()
            http.join()
            server.server_close()
    cycles.join(POLL)
    return cycles.is_alive() or bool(receiver and receiver.dispatcher.running)
