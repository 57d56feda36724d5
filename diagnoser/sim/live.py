"""``servediag simulate SCENARIO --serve HOST:PORT``: the scenario in real time on /metrics."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from diagnoser.sim.exposition import Recorder, text_exposition
from diagnoser.sim.run import run_iter
from diagnoser.sim.scenario import Scenario

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class LiveMetrics:
    """Advances the simulation with the wall clock and renders the latest samples."""

    def __init__(self, sc: Scenario, speed: float = 1.0):
        self.rec = Recorder(history=False)
        self.lock = threading.Lock()
        self.speed = speed
        self.sc = sc
        self.started = time.time()

    def render(self) -> str:
        with self.lock:
            return text_exposition(self.rec)

    def run(self, stop: threading.Event) -> None:
        """Simulated time t runs at ``speed`` x wall time from the start."""
        gen = run_iter(self.sc, float("inf"), self.rec, start=self.started)
        while not stop.is_set():
            with self.lock:  # a scrape never sees a half-written step
                t = next(gen)
            wall = self.started + (t - self.started) / self.speed
            delay = wall - time.time()
            if delay > 0 and stop.wait(delay):
                return


def serve(
    sc: Scenario,
    host: str,
    port: int,
    speed: float = 1.0,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
) -> None:
    live = LiveMetrics(sc, speed)
    stop = stop or threading.Event()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = live.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    worker = threading.Thread(target=live.run, args=(stop,), daemon=True)
    worker.start()
    if ready is not None:
        ready.set()
    try:
        while not stop.is_set():
            server.timeout = 0.5
            server.handle_request()
    finally:
        stop.set()
        server.server_close()
