"""The webhook's and the probe's listeners against many, idle and hostile clients, on real
loopback sockets: connections served at once are bounded (the others wait, unaccepted, and
are served later), an idle connection is closed, a request head is bounded in bytes and
fields, and the probe's /metrics listens on loopback unless told otherwise."""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from loopback import EMPTY, answer, serve
from loopback import post_alerts as post
from webhooks import running

from diagnoser.cli.probe import probe_cmd
from diagnoser.plumbing import listener
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.probe import runner
from diagnoser.probe.stream import Endpoint
from diagnoser.webhook import http as webhook_http
from diagnoser.webhook.receiver import Webhook

NOTIFICATION = {
    "version": "4",
    "groupKey": "g",
    "status": "firing",
    "alerts": [
        {
            "status": "firing",
            "labels": {
                "alertname": "VllmRequestsRejected",
                "playbook": "context-length-rejections",
                "model_name": "m",
            },
            "annotations": {},
        }
    ],
}


@contextlib.contextmanager
def _webhook(site: Any) -> Iterator[str]:
    """A webhook receiver serving on loopback, with a Prometheus that has no series."""
    with serve(lambda h, f: answer(h, EMPTY)) as api:
        hook = Webhook(PrometheusSource(api.url), site, lambda r: None)
        with running(hook, drain=5.0) as url:
            yield url


@contextlib.contextmanager
def _metrics() -> Iterator[str]:
    """The probe's /metrics on loopback (its target is never asked)."""
    cfg = runner.ProbeConfig(Endpoint("http://127.0.0.1:1"), "m", classes=(128,))
    server = runner.serve_metrics(runner.Prober(cfg), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def webhook_url(site) -> Iterator[str]:
    with _webhook(site) as url:
        yield url


@pytest.fixture
def metrics_url() -> Iterator[str]:
    with _metrics() as url:
        yield url


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _serving() -> int:
    """Threads serving a connection in this process."""
    return sum("process_request_thread" in t.name for t in threading.enumerate())


def _status(url: str, head: bytes, body: bytes = b"") -> int:
    """Send a raw request; the status code answered (0: the connection closed first)."""
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=10) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(head + body)
        try:
            first = sock.makefile("rb").readline()
        except OSError:
            return 0
    return int(first.split()[1]) if first.startswith(b"HTTP/") else 0


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 0.2)
        if readable:
            try:
                if sock.recv(4096) == b"":
                    return True
            except OSError:
                return True
    return False


def _post_head(n_fields: int = 0, field_size: int = 10, path: str = "/alerts") -> bytes:
    body = json.dumps(NOTIFICATION).encode()
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    lines += [f"X-Pad-{i}: {'p' * field_size}" for i in range(n_fields)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


BODY = json.dumps(NOTIFICATION).encode()


# --- connections at once ----------------------------------------------------------------------


@contextlib.contextmanager
def _listening(which: str, site: Any, monkeypatch: Any, cap: int) -> Iterator[str]:
    monkeypatch.setattr(webhook_http.Server, "max_connections", cap)
    monkeypatch.setattr(runner.MetricsServer, "max_connections", cap)
    with _webhook(site) if which == "webhook" else _metrics() as url:
        yield url


def _ask(which: str, url: str) -> None:
    if which == "webhook":
        assert post(url, NOTIFICATION, timeout=300)[0] == 200
    else:
        with urllib.request.urlopen(f"{url}/metrics", timeout=300) as resp:
            assert b"llm_probe_requests_total" in resp.read()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["webhook", "probe"])
def test_connections_beyond_the_cap_take_no_thread(which, site, monkeypatch):
    """Each connection took a thread (and a file descriptor) for as long as its client kept
    it: 1,000 idle connections, 1,006 threads."""
    with _listening(which, site, monkeypatch, cap=3) as url, contextlib.ExitStack() as stack:
        before = _serving()
        idle = [
            stack.enter_context(socket.create_connection(("127.0.0.1", _port(url))))
            for _ in range(12)
        ]
        most = 0
        for _ in range(20):
            most = max(most, _serving() - before)
            time.sleep(0.05)
        assert most <= 3
        assert all(_closed_within(s, 15) for s in idle)  # none is held forever
        _ask(which, url)


@pytest.mark.parametrize("which", ["webhook", "probe"])
def test_a_flood_of_idle_connections_does_not_keep_a_real_request_waiting(which, site, monkeypatch):
    """With every slot taken by connections that send nothing, each held it for the 10 s of
    its read timeout: 1,000 of them kept a real request waiting 147 s at the webhook, and
    over 300 s at the probe. The one that waited longest for its request is closed instead,
    once a client waits."""
    with _listening(which, site, monkeypatch, cap=3) as url, contextlib.ExitStack() as stack:
        for _ in range(60):
            stack.enter_context(socket.create_connection(("127.0.0.1", _port(url))))
        t0 = time.monotonic()
        _ask(which, url)
        assert time.monotonic() - t0 < 5  # 60 / 3 x 10 s = 200 s without the eviction


def test_the_probes_metrics_closes_idle_and_dripping_connections(metrics_url, monkeypatch):
    """An idle connection to the probe's exporter was kept forever."""
    monkeypatch.setattr(listener.Handler, "timeout", 1.0)
    monkeypatch.setattr(listener.Handler, "deadline", 2.0)
    with socket.create_connection(("127.0.0.1", _port(metrics_url))) as silent:
        assert _closed_within(silent, 5)
    with socket.create_connection(("127.0.0.1", _port(metrics_url))) as drip:
        t0 = time.monotonic()
        drip.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")
        closed = False
        while not closed and time.monotonic() - t0 < 10:  # a byte every 0.3 s: no read waits 1 s
            try:
                drip.sendall(b"y")
            except OSError:
                break
            closed = _closed_within(drip, 0.3)
        assert time.monotonic() - t0 < 6  # the 2 s deadline, not the 10 s of dripping


# --- the request head -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("head", "code"),
    [
        (_post_head(n_fields=80), 431),  # http.server takes 100
        (_post_head(n_fields=1, field_size=40_000), 431),  # and 64 KiB a line
        (_post_head(n_fields=20, field_size=2_000), 431),  # 40 KiB in all
        (_post_head(path="/alerts?" + "q" * 40_000), 414),
        (_post_head(n_fields=60, field_size=100), 200),
    ],
    ids=["80 fields", "one field of 40 KiB", "40 KiB of fields", "a 40 KiB path", "60 fields"],
)
def test_the_webhooks_request_head_is_bounded(webhook_url, head, code):
    assert _status(webhook_url, head, BODY) == code
    assert post(webhook_url, NOTIFICATION)[0] == 200  # still serving


@pytest.mark.parametrize(
    ("head", "code"),
    [
        (b"GET /metrics HTTP/1.1\r\n" + b"X-Pad: y\r\n" * 80 + b"\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"y" * 40_000 + b"\r\n\r\n", 431),
        (b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 200),
    ],
    ids=["80 fields", "one field of 40 KiB", "plain"],
)
def test_the_probes_request_head_is_bounded(metrics_url, head, code):
    assert _status(metrics_url, head) == code


# --- where the probe listens ------------------------------------------------------------------


def test_the_probes_metrics_listen_on_loopback_unless_told_otherwise():
    """It listened on every interface by default: anyone on the network could read which
    models are served where, and hold its connections."""
    default = next(p for p in probe_cmd.params if p.name == "listen").default
    assert default == "127.0.0.1:9464"
