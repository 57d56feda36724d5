"""The HTTP side of ``servediag watch``: ``GET /metrics`` (the findings and how the cycles
went, ``watch.exposition``) and ``GET /healthz`` (200 while serving; its body says whether the
last cycle was good). The listener is the webhook's hardened one (``plumbing.listener``):
at most ``max_connections`` served at once, a timeout for each read, a deadline for each
connection, a bounded request head."""

from __future__ import annotations

import logging
import threading
import time
from http.server import BaseHTTPRequestHandler

from diagnoser.plumbing import listener
from diagnoser.watch.exposition import CONTENT_TYPE
from diagnoser.watch.loop import POLL, Stop, Watch

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


def make_handler(watch: Watch) -> type[BaseHTTPRequestHandler]:
    class Handler(listener.Handler):
        server_version = "servediag-watch"

        def _answer(self, code: int, body: str, ctype: str) -> None:
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                self._answer(200, watch.render(), CONTENT_TYPE)
            elif path == "/healthz":
                self._answer(200, watch.health(), "text/plain; charset=utf-8")
            else:
                self._answer(
                    404, "not found: GET /metrics, /healthz\n", "text/plain; charset=utf-8"
                )

    return Handler


def listen(watch: Watch, host: str, port: int, max_connections: int = MAX_CONNECTIONS) -> Server:
    """The listener bound to HOST:PORT (``OSError`` when it cannot be), not yet serving."""
    return Server((host, port), make_handler(watch), max_connections)


def serve(watch: Watch, server: Server, stop: Stop) -> bool:
    """Serve ``/metrics`` and run the cycles until ``stop`` is set; then close the listener.
    Whether a cycle was still running (abandoned: the caller may leave without it)."""
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
        server.shutdown()
        http.join()
        server.server_close()
    cycles.join(POLL)
    return cycles.is_alive()
