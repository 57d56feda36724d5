"""``servediag webhook`` under faults, on real loopback sockets: every alert answered 200 gets
a record (diagnosed, failed or undone, through SIGTERM and internal errors), the chat webhook
is never fooled by a redirect nor held by a slow answer, the queue bounds alerts, and the
HTTP edge holds against floods, deep JSON, forged log lines and slow clients."""

from __future__ import annotations

import json
import select
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import loopback
import pytest
from loopback import EMPTY, answer, drip, elapsed, serve
from loopback import post_alerts as post
from notifications import alert, notification
from webhooks import running, start

from diagnoser.plumbing.source import PrometheusSource
from diagnoser.webhook import http as webhook_http
from diagnoser.webhook.notify import NotifyError, SlackForwarder
from diagnoser.webhook.payload import Notification
from diagnoser.webhook.receiver import Webhook


def wait_for(what: Callable[[], Any], timeout: float = 20.0) -> Any:
    return loopback.wait_for(what, timeout)


@pytest.fixture
def prometheus() -> Iterator[str]:
    """A Prometheus API on loopback that answers every query at once, with no series."""
    with serve(lambda h, f: answer(h, EMPTY)) as api:
        yield api.url


class Held:
    """A source whose queries wait until ``release`` is set (then answer no series)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started: list[str] = []

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Any]:
        self.started.append(expr)
        assert self.release.wait(60)
        return []

    def query(self, expr: str, at: float) -> list[Any]:
        return self.query_range(expr, at, at, 1)


class Broken:
    """A source that fails the way no one expected (a pure error path)."""

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Any]:
        raise ValueError("boom")

    def query(self, expr: str, at: float) -> list[Any]:
        raise ValueError("boom")


def make_hook(site, source: Any, **kw: Any) -> tuple[Webhook, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    hook = Webhook(source, site, records.append, **kw)
    return hook, records


# --- every alert answered 200 gets a record ----------------------------------------------


def test_sigterm_drains_the_queue_and_emits_what_is_left_as_undone():
    def slow(h, f):  # each query 0.3 s: a diagnosis takes seconds
        if not f.release.wait(0.3):
            answer(h, EMPTY)

    with serve(slow) as api:
        proc, url = start(api.url, "--workers", "1", "--drain-timeout", "2s", "--timeout", "30")
        for i in range(6):
            assert post(url, notification(alert(f"m-{i}"), group=f"g{i}"))[0] == 200
        proc.send_signal(signal.SIGTERM)
        took, (out, err) = elapsed(lambda: proc.communicate(timeout=60))
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    records = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["scope"]["model_name"] for r in records) == [f"m-{i}" for i in range(6)]
    undone = [r for r in records if r["outcome"] == "undone"]
    assert undone and all("--drain-timeout" in r["error"] for r in undone)
    assert all(r["diagnosis"] is None for r in undone)
    assert "emitted as undone" in err
    assert took < 20  # the 2 s drain, not the six diagnoses


def test_while_draining_notifications_get_503_and_running_jobs_are_not_emitted_twice(site):
    source = Held()
    hook, records = make_hook(site, source, workers=1)
    stop = threading.Event()
    with running(hook, drain=3.0, stop=stop) as url:
        assert post(url, notification(alert("m-a"), group="A"))[0] == 200
        wait_for(lambda: source.started)
        assert post(url, notification(alert("m-b"), group="B"))[0] == 200
        stop.set()
        wait_for(lambda: hook.draining)
        code, answered = post(url, notification(alert("m-c"), group="C"))
        assert code == 503 and "stopping" in answered["error"]
        with pytest.raises(urllib.error.HTTPError) as health:
            urllib.request.urlopen(f"{url}/healthz", timeout=5)
        health.value.close()
        assert health.value.code == 503
    assert sorted(r["scope"]["model_name"] for r in records) == ["m-a", "m-b"]
    assert {r["outcome"] for r in records} == {"undone"}
    source.release.set()  # the diagnosis of m-a ends now: its record was already emitted
    time.sleep(1.0)
    assert len(records) == 2
    assert hook.counters.snapshot()[("alerts", "undone")] == 2


def test_an_internal_error_is_emitted_counted_told_and_not_remembered(site):
    chat: list[dict[str, Any]] = []

    def chat_ok(h, f):
        chat.append(json.loads(f.seen[-1].body))
        answer(h, b"ok", 200, {"Content-Type": "text/plain"})

    with serve(chat_ok) as hooks:
        forwarder = SlackForwarder(hooks.url + "/hooks/T/B/secret", site)
        hook, records = make_hook(site, Broken(), forwarder=forwarder)
        with running(hook, drain=5.0) as url:
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: len(chat) == 1)
            # Alertmanager's resend is diagnosed, not skipped as a duplicate.
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: len(chat) == 2)
    first = records[0]
    assert first["outcome"] == "failed" and first["diagnosis"] is None
    assert first["error"] == "internal error: ValueError: boom"
    assert "*Diagnosis failed:* internal error: ValueError: boom" in chat[0]["text"]
    counts = hook.counters.snapshot()
    assert counts[("diagnoses", "internal_error")] == 2
    assert counts[("alerts", "queued")] == 2 and ("alerts", "duplicate") not in counts


def test_an_answer_with_a_null_metric_gives_a_record_with_the_error(site):
    body = {"status": "success", "data": {"result": [{"metric": None, "values": [[1, "1"]]}]}}
    with serve(lambda h, f: answer(h, body)) as api:
        hook, records = make_hook(site, PrometheusSource(api.url))
        with running(hook, drain=5.0) as url:
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: records)
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: len(records) == 2)
    assert "not in Prometheus's format" in records[0]["error"]
    assert records[0]["outcome"] == "failed"
    assert hook.counters.snapshot()[("diagnoses", "error")] == 2


def test_a_partial_answer_is_said_in_the_record_and_the_chat_message(site):
    warned = {**EMPTY, "warnings": ["partial response: store eu-1 unreachable"]}
    chat: list[dict[str, Any]] = []

    def chat_ok(h, f):
        chat.append(json.loads(f.seen[-1].body))
        answer(h, b"ok", 200, {"Content-Type": "text/plain"})

    with serve(lambda h, f: answer(h, warned)) as api, serve(chat_ok) as hooks:
        forwarder = SlackForwarder(hooks.url + "/hooks/T/B/secret", site)
        hook, records = make_hook(site, PrometheusSource(api.url), forwarder=forwarder)
        with running(hook, drain=5.0) as url:
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: chat)
    (record,) = records
    assert record["diagnosis"]["stats"]["warnings"] == ["partial response: store eu-1 unreachable"]
    assert "*Partial answer:* partial response: store eu-1 unreachable" in chat[0]["text"]


# --- the chat webhook ---------------------------------------------------------------------


def test_a_chat_webhook_redirect_is_a_failed_delivery(site, prometheus, caplog):
    def moved(h, f):
        if h.path.startswith("/hooks"):
            answer(h, b"", 302, {"Location": "/elsewhere"})
        else:
            answer(h, b"ok", 200, {"Content-Type": "text/plain"})

    with serve(moved) as chat:
        forwarder = SlackForwarder(chat.url + "/hooks/T/B/secret", site)
        hook, _ = make_hook(site, PrometheusSource(prometheus), forwarder=forwarder)
        with running(hook, drain=5.0) as url:
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: hook.counters.snapshot().get(("forwards", "error")))
    assert [s.method for s in chat.seen] == ["POST"]  # never resent as a GET
    assert ("forwards", "ok") not in hook.counters.snapshot()
    (line,) = [r.getMessage() for r in caplog.records if "forwarding" in r.getMessage()]
    assert "HTTP 302, a redirect: not followed" in line and "secret" not in line


def test_a_chat_webhook_that_drips_its_answer_holds_a_worker_no_longer_than_its_timeout(site):
    with serve(lambda h, f: drip(h, f, b"o" * 60, 0.25, "text/plain")) as chat:
        forwarder = SlackForwarder(chat.url + "/hooks/secret", site, timeout=1)
        record = {"alert": "A", "scope": {"model_name": "m"}, "since_seconds": 60}
        took, out = elapsed(lambda: forwarder.send(record, None))
    assert isinstance(out, NotifyError) and "did not answer within 1 s" in str(out)
    assert took < 6  # the whole drip (15 s) before


def test_a_chat_webhook_that_asks_to_retry_gets_the_message_again_within_its_timeout(site):
    def busy_once(h, f):
        if len(f.seen) == 1:
            answer(h, b"rate limited", 429, {"Retry-After": "1"})
        else:
            answer(h, b"ok", 200, {"Content-Type": "text/plain"})

    record = {"alert": "A", "scope": {"model_name": "m"}, "since_seconds": 60}
    with serve(busy_once) as chat:
        forwarder = SlackForwarder(chat.url + "/hooks/secret", site, timeout=5)
        took, out = elapsed(lambda: forwarder.send(record, None))
    assert out is None and took >= 1
    assert [s.method for s in chat.seen] == ["POST", "POST"]
    assert chat.seen[0].body == chat.seen[1].body and b'"text"' in chat.seen[1].body


def test_a_chat_webhook_retry_after_beyond_the_timeout_is_not_waited_for(site):
    record = {"alert": "A", "scope": {"model_name": "m"}, "since_seconds": 60}
    with serve(lambda h, f: answer(h, b"busy", 503, {"Retry-After": "40"})) as chat:
        forwarder = SlackForwarder(chat.url + "/hooks/secret", site, timeout=2)
        took, out = elapsed(lambda: forwarder.send(record, None))
    assert isinstance(out, NotifyError), out
    assert "HTTP 503 and asked to retry after 40 s, past the 2 s" in str(out)
    assert "secret" not in str(out)
    assert took < 10 and len(chat.seen) == 1


# --- bounds ---------------------------------------------------------------------------------


def test_the_queue_bounds_alerts_not_groups(site):
    source = Held()
    hook, records = make_hook(site, source, workers=1, max_pending=3)
    with running(hook, drain=5.0) as url:
        assert post(url, notification(alert("m-a"), group="A"))[0] == 200
        wait_for(lambda: source.started)
        three = [alert(f"m-b{i}") for i in range(3)]
        assert post(url, notification(*three, group="B"))[0] == 200
        code, answered = post(url, notification(alert("m-c"), group="C"))
        assert code == 503 and "queue full" in answered["error"]
        many = [alert(f"m-d{i}") for i in range(5)]
        code, answered = post(url, notification(*many, group="D"))
        assert code == 413 and "max_alerts" in answered["error"]
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
        source.release.set()
        wait_for(lambda: len(records) == 4)
    assert "servediag_webhook_queue_alerts 3" in metrics
    assert 'servediag_webhook_alerts_total{outcome="too_many"} 5' in metrics
    assert 'servediag_webhook_notifications_total{outcome="queue_full"} 1' in metrics


def test_dedupe_entries_are_dropped_after_their_window(site):
    clock = [0.0]
    hook, _ = make_hook(site, Held(), dedupe_window=600, clock=lambda: clock[0])
    for i in range(3):
        n = Notification("g", [_firing(f"m-{i}")])
        assert hook.accept(n) == "accepted"
    assert len(hook.seen) == 3
    clock[0] = 601
    assert hook.accept(Notification("g", [_firing("m-new")])) == "accepted"
    assert len(hook.seen) == 1


def _firing(model: str) -> Any:
    from diagnoser.webhook.payload import parse_notification

    return parse_notification(json.dumps(notification(alert(model))).encode()).alerts[0]


# --- the HTTP edge --------------------------------------------------------------------------


def test_a_flood_of_concurrent_posts_gets_answers_not_resets(site, prometheus):
    hook, _ = make_hook(site, PrometheusSource(prometheus), max_pending=20)

    def one(i: int) -> int | str:
        try:
            return post(url, notification(alert(f"m-{i}"), group=f"g{i}"), timeout=60)[0]
        except (OSError, ValueError) as exc:
            return type(exc).__name__

    with running(hook, drain=5.0) as url, ThreadPoolExecutor(200) as pool:
        start = threading.Barrier(200)
        outcomes = list(pool.map(lambda i: (start.wait(), one(i))[1], range(200)))
    assert all(o in (200, 503) for o in outcomes), sorted(map(str, outcomes))
    assert outcomes.count(200) >= 20


def test_json_nested_too_deeply_is_answered_400(site, prometheus):
    hook, _ = make_hook(site, PrometheusSource(prometheus))
    deep = b'{"alerts": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with running(hook, drain=5.0) as url:
        code, answered = post(url, deep)
        assert code == 400 and "nested too deeply" in answered["error"]
        assert post(url, notification(alert()))[0] == 200  # still serving


@pytest.mark.parametrize(
    "body",
    [
        b'{"alerts": [], "truncatedAlerts": ' + b"9" * 5000 + b"}",
        b'{"alerts": [], "truncatedAlerts": -' + b"9" * 5000 + b"}",
        b'{"alerts": [], "groupKey": "g", "version": ' + b"1" * 100_000 + b"}",
    ],
    ids=["5000 digits", "negative", "100000 digits"],
)
def test_a_number_of_thousands_of_digits_is_answered_400(site, prometheus, body):
    """It was answered nothing: Python refuses to read an integer of over 4,300 digits with
    a ValueError that is not a JSON error, and the connection was closed without a word."""
    hook, _ = make_hook(site, PrometheusSource(prometheus))
    with running(hook, drain=5.0) as url:
        code, answered = post(url, body)
        assert code == 400, answered
        assert "digits" in answered["error"] and "set_int_max_str_digits" not in answered["error"]
        assert post(url, notification(alert()))[0] == 200  # still serving
    assert hook.counters.snapshot()[("notifications", "bad_request")] == 1


def test_a_label_value_cannot_forge_a_log_line(prometheus):
    proc, url = start(prometheus)
    forged = "m-1\n2026-11-29 03:00:00,000 ERROR forged: all models down"
    try:
        assert post(url, notification(alert(forged)))[0] == 200
        time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert not [ln for ln in err.splitlines() if ln.startswith("2026-11-29 03:00:00,000")]
    assert "m-1\\n2026-11-29 03:00:00,000 ERROR forged" in err
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert record["scope"]["model_name"] == forged


def _closed_within(sock: socket.socket, seconds: float, drip: bytes = b"") -> float | None:
    """Seconds until the server closes ``sock`` (sending ``drip`` a byte every 0.3 s)."""
    t0 = time.monotonic()
    for i in range(int(seconds / 0.3)):
        if drip:
            try:
                sock.sendall(drip[i % len(drip) : i % len(drip) + 1])
            except OSError:
                return time.monotonic() - t0
        readable, _, _ = select.select([sock], [], [], 0.3)
        if readable:
            try:
                if sock.recv(4096) == b"":
                    return time.monotonic() - t0
            except OSError:
                return time.monotonic() - t0
    return None


def test_slow_clients_are_not_held(site, prometheus, monkeypatch):
    monkeypatch.setattr(webhook_http, "CLIENT_TIMEOUT", 1.0)
    monkeypatch.setattr(webhook_http, "CLIENT_DEADLINE", 2.0)
    hook, _ = make_hook(site, PrometheusSource(prometheus))
    with running(hook, drain=5.0) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as silent:
            assert _closed_within(silent, 10) is not None  # sends nothing
        with socket.create_connection(("127.0.0.1", port)) as slow:
            slow.sendall(b"POST /alerts HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n")
            took = _closed_within(slow, 12, drip=b"{")  # a byte every 0.3 s: no read waits 1 s
            assert took is not None and took < 8
        assert post(url, notification(alert()))[0] == 200  # others are served meanwhile
