"""Real servers on loopback: ones that misbehave on purpose (each request runs a function of
the test's, which may drip bytes, redirect, echo the request, or answer a gzip bomb), and a
server of the package's (the webhook's receiver, the live simulator) run in a thread."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from lab.promserver import free_port


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Faulty:
    url: str
    seen: list[Seen] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)


Respond = Callable[[BaseHTTPRequestHandler, Faulty], None]


@contextlib.contextmanager
def serve(respond: Respond, host: str = "127.0.0.1") -> Iterator[Faulty]:
    """A threading HTTP/1.0 server on a free port of ``host``; every request runs
    ``respond(handler, faulty)``. At exit, ``faulty.release`` is set (dripping handlers
    stop) and the server shuts down."""
    box: list[Faulty] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            box[0].seen.append(Seen(self.command, self.path, dict(self.headers), body))
            self.request_body = body
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                respond(self, box[0])

        do_GET = do_POST = _any

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((host, 0), Handler)
    server.daemon_threads = True
    box.append(Faulty(f"http://{host}:{server.server_address[1]}"))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield box[0]
    finally:
        box[0].release.set()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def in_thread(
    serve: Callable[..., None],
    what: Any,
    stop: threading.Event | None = None,
    join: float = 30.0,
    **options: Any,
) -> Iterator[str]:
    """``serve(what, host, port, ready=, stop=, **options)`` (the webhook's receiver, the
    live simulator) in a thread of this process on a free loopback port: its host:port once
    it is ready. On leaving, or once the test sets ``stop``, it stops; its thread must have
    ended within ``join`` seconds."""
    port, ready = free_port(), threading.Event()
    stop = stop or threading.Event()
    kwargs = {"ready": ready, "stop": stop, **options}
    thread = threading.Thread(target=serve, args=(what, "127.0.0.1", port), kwargs=kwargs)
    thread.daemon = True
    thread.start()
    try:
        assert ready.wait(10)
        yield f"127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(join)
    assert not thread.is_alive()


def answer(
    h: BaseHTTPRequestHandler,
    body: bytes | dict[str, Any],
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> None:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    h.send_response(status)
    extra = {"Content-Type": "application/json", **(headers or {})}
    for k, v in extra.items():
        h.send_header(k, v)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


def drip(
    h: BaseHTTPRequestHandler,
    f: Faulty,
    data: bytes,
    every: float,
    content_type: str = "application/json",
) -> None:
    """Status and headers at once, then ``data`` a byte at a time, one every ``every``."""
    h.send_response(200)
    h.send_header("Content-Type", content_type)
    h.send_header("Content-Length", str(len(data)))
    h.end_headers()
    h.wfile.flush()
    for i in range(len(data)):
        if f.release.wait(every):
            return
        h.wfile.write(data[i : i + 1])
        h.wfile.flush()


EMPTY = {"status": "success", "data": {"resultType": "matrix", "result": []}}


def elapsed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, what ``fn`` returned or raised)."""
    t0 = time.monotonic()
    try:
        out: Any = fn()
    except Exception as exc:
        out = exc
    return time.monotonic() - t0, out


def post_alerts(url: str, body: dict[str, Any] | bytes, timeout: float = 30) -> tuple[int, Any]:
    """POST a notification (or raw bytes) to a webhook's ``/alerts``: (status, its JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(f"{url}/alerts", data=data, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_for(what: Callable[[], Any], timeout: float) -> Any:
    """What ``what()`` returns once it is truthy; the test fails after ``timeout`` seconds."""
    import pytest

    deadline = time.monotonic() + timeout
    while not (value := what()):
        if time.monotonic() > deadline:
            pytest.fail("timed out waiting for the webhook")
        time.sleep(0.05)
    return value


def fleet(
    models: int, points: int | None = None, sick: bool = True, labels: dict[str, str] | None = None
) -> Respond:
    """A Prometheus API's answers for a fleet of ``models`` models, each served by one target:
    every query (whatever its expression) gets one series per model, at every step of its
    range (or its first ``points`` steps), with ``labels`` besides its own (a site's group
    labels). With ``sick``, every other model's values jump fivefold halfway through, so that
    models are unhealthy and diagnosed at length; else they hold still. Answers are made once
    per range and kept."""
    made: dict[tuple[str, ...], bytes] = {}
    lock = threading.Lock()

    def body(start: float, end: float, step: float, instant: bool) -> bytes:
        count = 1 if instant else int((end - start) // step) + 1
        times = [start + k * step for k in range(count if points is None else min(count, points))]
        mid = times[len(times) // 2]
        result = []
        for i in range(models):
            series = {
                **(labels or {}),
                "model_name": f"model-{i:05d}",
                "job": "vllm",
                "instance": f"10.{i // 65536}.{i // 256 % 256}.{i % 256}:8000",
            }
            values = [[t, "5" if sick and i % 2 and t >= mid else "1"] for t in times]
            result.append(
                {"metric": series, "value": values[0]}
                if instant
                else {"metric": series, "values": values}
            )
        kind = "vector" if instant else "matrix"
        doc = {"status": "success", "data": {"resultType": kind, "result": result}}
        return json.dumps(doc, separators=(",", ":")).encode()

    def respond(h: BaseHTTPRequestHandler, f: Faulty) -> None:
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(h.path)
        form = getattr(h, "request_body", b"").decode() if h.command == "POST" else parts.query
        q = {k: v[0] for k, v in parse_qs(form).items()}
        instant = not parts.path.endswith("query_range")
        key = (q.get("start", ""), q.get("end", q.get("time", "")), q.get("step", ""))
        with lock:
            if key not in made:
                if instant:
                    made[key] = body(0.0, float(key[1] or time.time()), 1.0, True)
                else:
                    step = float(key[2].rstrip("s"))
                    made[key] = body(float(key[0]), float(key[1]), step, False)
            data = made[key]
        answer(h, data)

    return respond
