"""``servediag simulate SCENARIO --serve HOST:PORT``: the scenario in real time, over HTTP.

Every target the scenario runs has its own ``/metrics``, as the real processes would, with no
target labels in it: ``/servers/POD/metrics`` for each vLLM server (``503`` while it is
down, so Prometheus records ``up == 0``), ``/dcgm/NODE/metrics`` for each node's
dcgm-exporter, ``/probe/MODEL/metrics`` for a probe. ``/targets`` lists them for Prometheus'
``http_sd_configs`` with the labels Kubernetes service discovery would give them (``job``,
``instance``, ``namespace``, ``pod``); ``/metrics`` is the server itself when the scenario
runs only one. ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` answer OpenAI-compatible requests (see :mod:`diagnoser.sim.openai`)
with the timing the model predicts: each request is injected into the simulated engine like
the scenario's own traffic, so it waits for tokenization, a batch slot and KV blocks, pays for
its prefill, decodes in the running batch, and shows up in the server's ``vllm:*`` metrics.

The simulation follows the wall clock (``speed`` simulated seconds per second) and runs a
little ahead of it (:data:`LOOKAHEAD`), so each token's time is known before it is due and is
streamed then. A request enters the engine at the simulation's next step, up to
``LOOKAHEAD`` after it arrived: the client sees that as network time. Token times within one
engine phase are exact; across phases they are spread evenly between two observations.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from diagnoser.metrics.exposition import Recorder
from diagnoser.sim.engine import Request
from diagnoser.sim.openai import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    DONE,
    ApiError,
    Completion,
    ProxyBuffer,
    Relay,
    Shapes,
    check_length,
    parse,
    sse,
    token_text,
)
from diagnoser.sim.run import ModelRun, Simulation
from diagnoser.sim.scenario import Scenario

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
POLL = 0.005  # wall seconds between steps of the simulation
LOOKAHEAD = 0.015  # wall seconds the simulation runs ahead of the clock
MAX_BODY = 32 << 20


def token_times(
    seen: int, seen_at: float, generated: int, last: float, first: float
) -> list[float]:
    """Times of tokens ``seen + 1 .. generated``, the latest at ``last``, spread evenly."""
    out: list[float] = []
    if generated <= seen:
        return out
    if seen == 0:
        out.append(first)
        seen, seen_at = 1, first
    n = generated - seen
    step = (last - seen_at) / n if n else 0.0
    out += [seen_at + step * (k + 1) for k in range(n)]
    return out


class LiveSim:
    """The simulation following the wall clock, open to requests from real clients."""

    def __init__(self, sc: Scenario, speed: float = 1.0, proxy: ProxyBuffer | None = None):
        self.rec = Recorder(history=False)
        self.cond = threading.Condition()
        self.speed, self.proxy = speed, proxy
        self.started = time.time()
        self.sim = Simulation(sc, self.rec, self.started, live=True)
        self.models = [m.name for m in sc.models]
        self.ticks = 0
        self.stopped = False

    def wall(self, t: float) -> float:
        """The wall time of simulated time ``t``."""
        return self.started + (t - self.started) / self.speed

    def page(self, path: str) -> tuple[int, str]:
        """A target's ``/metrics`` (status, body); ``/metrics`` is the only server's."""
        with self.cond:  # a scrape never sees a half-written step
            if path == "/metrics":
                servers = [p for p in self.sim.pages if p.startswith("/servers/")]
                if len(servers) != 1:
                    return 404, (
                        f"this scenario runs {len(servers)} servers: scrape each target that "
                        "/targets lists (Prometheus http_sd_configs)\n"
                    )
                path = servers[0]
            if path not in self.sim.pages:
                return 404, f"{path} is not served here\n"
            body = self.sim.pages[path]
            if body is None:
                return 503, "the server is down\n"
            return 200, body

    def targets(self, address: str) -> list[dict[str, Any]]:
        """The scenario's targets as Prometheus HTTP service discovery reads them."""
        with self.cond:
            return [
                {"targets": [address], "labels": {"__metrics_path__": path, **labels}}
                for run in self.sim.runs
                for path, labels in run.targets()
            ]

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                target = self.started + (time.time() + LOOKAHEAD - self.started) * self.speed
                with self.cond:
                    for _t in self.sim.run(target, exact=True):
                        pass
                    self.ticks += 1
                    self.cond.notify_all()
                stop.wait(POLL)
        finally:
            with self.cond:
                self.stopped = True
                self.cond.notify_all()

    def models_doc(self) -> dict[str, Any]:
        with self.cond:
            data = [
                {
                    "id": run.m.name,
                    "object": "model",
                    "created": int(self.started),
                    "owned_by": "servediag-simulator",
                    "max_model_len": run.m.engine.max_model_len,
                }
                for run in self.sim.runs
            ]
        return {"object": "list", "data": data}

    def submit(self, c: Completion) -> tuple[ModelRun, Request]:
        """Inject the request at the simulation's next step; ApiError if it is refused."""
        with self.cond:
            run = self.sim.model(c.model)
            if run is None:
                raise ApiError(404, f"The model `{c.model}` does not exist.", "NotFoundError")
            limit = run.m.engine.max_model_len
            route = CHAT_PATH if c.chat else COMPLETIONS_PATH
            try:
                check_length(c, limit)
            except ApiError:
                if run.serving():  # the API server tokenized it before refusing it
                    refused = Request(0, self.sim.t, c.prompt_tokens, 1, 1, True, handler=route)
                    run.inject(refused, True)
                raise
            if not run.serving():
                raise ApiError(503, "the server is restarting", "ServiceUnavailableError")
            cap = min(c.max_tokens or limit, limit - c.prompt_tokens)
            want = int(run.m.workload.output.sample(run.rng, 1)[0])
            target = max(1, min(want, cap))
            req = Request(0, self.sim.t, c.prompt_tokens, target, cap, target >= cap, handler=route)
            run.inject(req)
            return run, req

    def follow(self, run: ModelRun, req: Request) -> Iterator[tuple[list[float], str]]:
        """The times of the request's new tokens after every step, and its outcome
        (``""`` while it runs; ``finished``, ``aborted`` or ``stopped`` last)."""
        tick, seen, seen_at = -1, 0, req.arrival
        while True:
            with self.cond:
                while self.ticks == tick and not self.stopped:
                    self.cond.wait(1.0)
                tick = self.ticks
                generated, last = run.progress(req)
                outcome, first = req.outcome, req.first_token
                if self.stopped and not outcome:
                    outcome = "stopped"
            new = token_times(seen, seen_at, generated, last, first)
            if new:
                seen, seen_at = generated, new[-1]
            yield new, outcome
            if outcome:
                return


def make_handler(live: LiveSim) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 120  # an idle keep-alive connection is closed after this

        def handle(self) -> None:
            with contextlib.suppress(ConnectionResetError, BrokenPipeError):
                super().handle()  # a client that hangs up is not an error

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics" or path.endswith("/metrics"):
                status, body = live.page(path)
                self._send(status, body.encode(), CONTENT_TYPE if status == 200 else "text/plain")
            elif path == "/targets":
                addr = self.server.server_address
                bound = f"{addr[0]!s}:{addr[1]!s}" if isinstance(addr, tuple) else "localhost"
                host = self.headers.get("Host") or bound
                self._json(200, live.targets(host))
            elif path == "/v1/models":
                self._json(200, live.models_doc())
            elif path == "/health":
                self._send(200, b"", "text/plain")
            else:
                self._error(ApiError(404, f"{path} is not served here", "NotFoundError"))

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 <= length <= MAX_BODY:
                self.close_connection = True
                self._error(ApiError(400, "a request body needs a Content-Length up to 32 MiB"))
                return
            body = self.rfile.read(length)
            if path not in (CHAT_PATH, COMPLETIONS_PATH):
                self._error(ApiError(404, f"{path} is not served here", "NotFoundError"))
                return
            try:
                c = parse(path, body, live.models)
                run, req = live.submit(c)
            except ApiError as exc:
                self._error(exc)
                return
            try:
                if c.stream:
                    self._stream(c, run, req)
                else:
                    self._whole(c, run, req)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away

        def _stream(self, c: Completion, run: ModelRun, req: Request) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            shapes = Shapes(c, req.rid)
            relay = Relay(self._chunk, live.wall, req.arrival, live.proxy)
            if c.chat:
                relay.send(shapes.role_chunk(), req.arrival)
            sent, at = 0, req.arrival
            for times, outcome in live.follow(run, req):
                for at in times:
                    relay.send(shapes.chunk(token_text(sent), None), at)
                    sent += 1
                if outcome == "finished":
                    relay.send(shapes.chunk("", _finish(req)), at)
                    if c.include_usage:
                        relay.send(shapes.usage_chunk(sent), at)
                    relay.send(DONE, at)
                elif outcome == "error":
                    error = ApiError(
                        500, "the KV load from the prefill instance failed", "InternalServerError"
                    )
                    relay.send(sse({"error": _error_obj(error)}), at)
                    relay.send(DONE, at)
                elif outcome == "aborted":
                    error = ApiError(500, "the engine died while generating", "InternalServerError")
                    relay.send(sse({"error": _error_obj(error)}), at)
                    relay.send(DONE, at)
            relay.close()
            self._chunk(b"")  # the terminating chunk; "stopped" ends the stream without [DONE]

        def _whole(self, c: Completion, run: ModelRun, req: Request) -> None:
            outcome, at = "", req.arrival
            for times, state in live.follow(run, req):
                outcome, at = state, (times[-1] if times else at)
            if outcome != "finished":
                self._error(
                    ApiError(500, "the engine died while generating", "InternalServerError")
                )
                return
            wait = live.wall(at) - time.time()  # answered when the last token is out
            if wait > 0:
                time.sleep(wait)
            text = "".join(token_text(k) for k in range(req.generated))
            self._send(200, Shapes(c, req.rid).whole(text, _finish(req), req.generated))

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, doc: dict[str, Any] | list[dict[str, Any]]) -> None:
            import json

            self._send(status, json.dumps(doc).encode())

        def _error(self, exc: ApiError) -> None:
            self._send(exc.status, exc.body())

        def log_message(self, format: str, *args: object) -> None:
            return

    return Handler


def _finish(req: Request) -> str:
    return "length" if req.length_stop else "stop"


def _error_obj(exc: ApiError) -> dict[str, Any]:
    return {"message": exc.message, "type": exc.kind, "param": None, "code": exc.status}


def serve(
    sc: Scenario,
    host: str,
    port: int,
    speed: float = 1.0,
    ready: threading.Event | None = None,
    stop: threading.Event | None = None,
    proxy: ProxyBuffer | None = None,
    listening: Callable[[], None] | None = None,
) -> None:
    """Serve ``sc`` live until ``stop``; ``listening`` is called once the port is bound (a
    port already in use raises OSError before it)."""
    live = LiveSim(sc, speed, proxy)
    stop = stop or threading.Event()
    server = ThreadingHTTPServer((host, port), make_handler(live))
    server.daemon_threads = True
    if listening is not None:
        listening()
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
        worker.join(5)
        server.server_close()
