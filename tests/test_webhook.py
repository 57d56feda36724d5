"""``servediag webhook``: Alertmanager notifications in, diagnoses out, bounded and robust.

The diagnoses are real: a Prometheus loaded with the context-length-rejections scenario,
diagnosed at the scenario's end. Only the bounded-queue test slows the source down on purpose
(a wrapper that holds each query until the test lets it go).
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import loopback
import notifications
import pytest
from loopback import post_alerts as post
from notifications import PLAYBOOK, notification
from webhooks import running

from diagnoser.plumbing.source import PrometheusSource
from diagnoser.report.chat import message
from diagnoser.webhook.notify import SlackForwarder
from diagnoser.webhook.receiver import Webhook
from lab import harness
from lab.promserver import Prometheus, free_port, listening

SCENARIO = PLAYBOOK  # a Prometheus serving the scenario of the alerts' playbook
MODEL = "qwen3-8b"
RUNBOOK = "https://runbooks.example/context-length-rejections"


def alert(model: str = MODEL, status: str = "firing", **labels: str) -> dict[str, Any]:
    return notifications.alert(model, status, runbook=RUNBOOK, **labels)


def wait_for(what: Callable[[], Any], timeout: float = 60.0) -> Any:
    return loopback.wait_for(what, timeout)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> Iterator[tuple[str, float]]:
    prepared = harness.prepare([SCENARIO], tmp_path_factory.mktemp("tsdb"))[SCENARIO]
    with Prometheus(prepared.data_dir) as prom:
        yield prom.url, prepared.end


def make_hook(site, loaded, source=None, **kw: Any) -> tuple[Webhook, list[dict[str, Any]]]:
    url, end = loaded
    records: list[dict[str, Any]] = []
    hook = Webhook(source or PrometheusSource(url), site, records.append, now=lambda: end, **kw)
    return hook, records


@pytest.mark.prometheus
def test_a_firing_playbook_alert_arrives_diagnosed(site, loaded):
    hook, records = make_hook(site, loaded)
    with running(hook) as url:
        assert post(url, notification(alert())) == (200, {"status": "accepted"})
        (record,) = wait_for(lambda: records)
    assert record["alert"] == "VllmRequestsRejected" and record["scope"] == {"model_name": MODEL}
    assert record["playbook"] == SCENARIO and record["runbook_url"] == RUNBOOK
    assert record["top_finding"] == SCENARIO and record["playbook_rank"] == 1
    assert record["error"] is None
    top = record["diagnosis"]["findings"][0]
    assert top["scope"] == {"model_name": MODEL} and top["cause"] and top["fix"]
    json.dumps(record)  # a JSON line as it stands


BAD = [
    (b"not json", "not JSON"),
    (b"[]", "must be a JSON object"),
    (b'{"alerts": "none"}', "alerts: must be a list"),
    (b'{"alerts": [{"status": "firing", "labels": {"a": 1}}]}', "alerts[0].labels"),
    (b'{"alerts": [{"status": "pending", "labels": {}}]}', "alerts[0].status"),
    (b'{"groupKey": 7, "alerts": []}', "groupKey"),
]


@pytest.mark.prometheus
def test_a_bad_payload_is_answered_400_and_logged(site, loaded, caplog):
    hook, records = make_hook(site, loaded)
    caplog.set_level(logging.WARNING, logger="servediag.webhook")
    with running(hook) as url:
        for body, why in BAD:
            code, answer = post(url, body)
            assert code == 400 and why in answer["error"], body
        code, _ = post(url, b"{" + b" " * (1 << 20) + b"}")
        assert code == 413
        # Still serving, and still diagnosing.
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
            assert resp.read() == b"ok\n"
        assert post(url, notification(alert()))[0] == 200
        wait_for(lambda: records)
    refused = [r.getMessage() for r in caplog.records if "refused a notification" in r.message]
    assert len(refused) == len(BAD) + 1
    assert any("not JSON" in m for m in refused)


@pytest.mark.prometheus
def test_resolved_and_undiagnosable_alerts_are_not_diagnosed(site, loaded):
    hook, records = make_hook(site, loaded)
    advisory = alert(playbook="hidden-tail")
    unknown = alert(playbook="no-such-playbook")
    nowhere = {"status": "firing", "labels": {"alertname": "Watchdog"}, "annotations": {}}
    with running(hook) as url:
        code, _ = post(url, notification(alert(status="resolved"), advisory, unknown, nowhere))
        assert code == 200
        counts = hook.counters.snapshot()
    assert counts[("alerts", "resolved")] == 1
    assert counts[("alerts", "unknown_playbook")] == 2
    assert counts[("alerts", "no_scope")] == 1
    assert ("alerts", "queued") not in counts and records == []


@pytest.mark.prometheus
def test_a_symptom_page_arrives_with_the_cause_found(site, loaded):
    """An alert without a playbook (an SLO burning, a target down) gets the model's whole
    diagnosis: the cause it finds leads the record and the message."""
    hook, records = make_hook(site, loaded)
    page = alert(alertname="VllmAvailabilityBudgetBurn", symptom="slo-availability")
    page["labels"].pop("playbook")
    page["labels"]["severity"] = "critical"
    page["annotations"]["runbook_url"] = "https://rb/slo-availability"
    with running(hook) as url:
        assert post(url, notification(page))[0] == 200
        (record,) = wait_for(lambda: records)
    assert record["playbook"] is None and record["symptom"] == "slo-availability"
    assert record["top_finding"] == SCENARIO and record["playbook_rank"] is None
    health = record["diagnosis"]["health"]
    assert health and health[0]["scope"] == {"model_name": MODEL}
    window = record["diagnosis"]["window"]
    assert window["start"] < window["end"]


@pytest.mark.prometheus
def test_duplicates_within_the_window_are_skipped(site, loaded):
    clock = [1000.0]
    hook, records = make_hook(site, loaded, dedupe_window=600, clock=lambda: clock[0])
    with running(hook) as url:
        assert post(url, notification(alert()))[0] == 200
        wait_for(lambda: records)
        clock[0] += 599
        assert post(url, notification(alert()))[0] == 200  # Alertmanager's repeat: skipped
        assert hook.counters.snapshot()[("alerts", "duplicate")] == 1
        assert post(url, notification(alert(model="other-model")))[0] == 200  # another model
        wait_for(lambda: len(records) == 2)
        clock[0] += 2
        assert post(url, notification(alert()))[0] == 200  # past the window: diagnosed again
        wait_for(lambda: len(records) == 3)
    assert [r["scope"]["model_name"] for r in records] == [MODEL, "other-model", MODEL]
    assert records[1]["top_finding"] is None  # no such model in Prometheus: nothing found


class HeldSource:
    """The real source, but every query waits until ``release`` is set."""

    def __init__(self, url: str):
        self.inner = PrometheusSource(url)
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.started: list[str] = []

    def query_range(self, expr: str, start: float, end: float, step: float) -> Any:
        model = expr.split('model_name="')[1].split('"')[0] if 'model_name="' in expr else ""
        with self.lock:
            if model not in self.active:
                self.active.add(model)
                self.started.append(model)
        assert self.release.wait(60)
        return self.inner.query_range(expr, start, end, step)

    def query(self, expr: str, at: float) -> Any:
        return self.inner.query(expr, at)


@pytest.mark.prometheus
def test_the_queue_is_bounded_and_a_group_runs_one_diagnosis_at_a_time(site, loaded, caplog):
    source = HeldSource(loaded[0])
    hook, records = make_hook(site, loaded, source=source, workers=2, max_pending=3)
    caplog.set_level(logging.WARNING, logger="servediag.webhook")
    with running(hook) as url:
        assert post(url, notification(alert("m-a"), group="A"))[0] == 200
        wait_for(lambda: source.started == ["m-a"])
        # Group A is busy: its next notification waits, although a worker is free.
        assert post(url, notification(alert("m-a2"), group="A"))[0] == 200
        assert post(url, notification(alert("m-b"), group="B"))[0] == 200
        wait_for(lambda: hook.dispatcher.depth() == 1)  # B started on the free worker
        assert post(url, notification(alert("m-c"), group="C"))[0] == 200
        assert hook.dispatcher.depth() == 2
        # A newer notification for a waiting group joins it: one group, one more alert.
        assert post(url, notification(alert("m-c2"), group="C"))[0] == 200
        assert hook.dispatcher.depth() == 2 and hook.dispatcher.waiting() == 3
        code, answer = post(url, notification(alert("m-d"), group="D"))
        assert code == 503 and "queue full" in answer["error"]
        # B's worker may not have sent its first query yet: wait for it; C never starts.
        wait_for(lambda: sorted(source.started) == ["m-a", "m-b"])
        source.release.set()
        wait_for(lambda: len(records) == 5)
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
            metrics = resp.read().decode()
    assert sorted(r["scope"]["model_name"] for r in records) == [
        "m-a",
        "m-a2",
        "m-b",
        "m-c",
        "m-c2",
    ]
    assert any("queue full" in r.getMessage() for r in caplog.records)
    assert 'servediag_webhook_notifications_total{outcome="queue_full"} 1' in metrics
    assert 'servediag_webhook_diagnoses_total{outcome="ok"} 5' in metrics


@contextlib.contextmanager
def chat_server(status: int = 200) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1})
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hooks/T0/B0/secret", received
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


@pytest.mark.prometheus
def test_diagnoses_are_forwarded_to_a_slack_compatible_webhook(site, catalog, loaded):
    with chat_server() as (chat_url, received):
        hook, records = make_hook(site, loaded, forwarder=SlackForwarder(chat_url, site))
        with running(hook) as url:
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: received)
    (msg,) = received
    text = msg["text"]
    assert text.startswith("*VllmRequestsRejected* (warning) on model_name=qwen3-8b")
    assert f"`{SCENARIO}`" in text
    assert "*Evidence:* http_4xx_share" in text
    assert "*Cause:* " + catalog[SCENARIO].cause.split()[0] in text
    assert "*Fix:*\n1. " + catalog[SCENARIO].fix[0] in text
    top = records[0]["diagnosis"]["findings"][0]
    assert f"*Runbook:* <{top['runbook']}|{SCENARIO}>" in text


@pytest.mark.prometheus
def test_a_chat_outage_is_logged_and_the_diagnosis_still_emitted(site, loaded, caplog):
    caplog.set_level(logging.ERROR, logger="servediag.webhook")
    with chat_server(status=500) as (chat_url, received):
        hook, records = make_hook(site, loaded, forwarder=SlackForwarder(chat_url, site))
        with running(hook) as url:
            assert post(url, notification(alert()))[0] == 200
            wait_for(lambda: hook.counters.snapshot().get(("forwards", "error")))
    assert received and len(records) == 1
    (line,) = [r.getMessage() for r in caplog.records if "forwarding" in r.message]
    assert "HTTP 500" in line and "secret" not in line


def test_the_message_without_a_confirming_diagnosis_gives_the_alerts_playbook(site, catalog):
    record = {
        "alert": "VllmKvCachePressure",
        "severity": "warning",
        "summary": "The KV cache is full.",
        "playbook": "kv-cache-pressure",
        "runbook_url": "https://rb/kv",
        "scope": {"model_name": "m"},
        "since_seconds": 3600.0,
        "playbook_rank": None,
        "diagnosis": {"findings": []},
        "error": None,
    }
    text = message(record, None, site)
    assert "no playbook matched over the last 60 min" in text
    assert "`kv-cache-pressure` (not confirmed by the diagnosis)" in text
    assert catalog["kv-cache-pressure"].cause.split()[0] in text
    assert "*Runbook:* <https://rb/kv|kv-cache-pressure>" in text


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "diagnoser", "webhook", *args]


def test_an_unreachable_prometheus_is_logged_and_the_receiver_keeps_running():
    port = free_port()
    dead = f"http://127.0.0.1:{free_port()}"
    proc = subprocess.Popen(
        _cli("--listen", f"127.0.0.1:{port}", "--prometheus-url", dead, "--timeout", "5"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:
                    return resp.status == 200
            except OSError:
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                return False

        wait_for(healthy, 30)
        assert post(url, notification(alert()))[0] == 200

        def diagnosed() -> bool:
            with urllib.request.urlopen(f"{url}/metrics", timeout=2) as resp:
                return 'diagnoses_total{outcome="error"} 1' in resp.read().decode()

        wait_for(diagnosed)
        assert healthy() and proc.poll() is None
        assert post(url, b"garbage")[0] == 400
        assert post(url, notification(alert(model="second")))[0] == 200
    finally:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    errors = [ln for ln in err.splitlines() if " ERROR " in ln]
    assert errors and "diagnosis of model_name=qwen3-8b failed: cannot reach" in errors[0]
    assert "connection refused" in errors[0]
    first = json.loads(out.splitlines()[0])
    assert first["playbook"] == SCENARIO and first["runbook_url"] == RUNBOOK
    assert first["diagnosis"] is None and "cannot reach" in first["error"]
    assert not listening(port)


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--listen", "nowhere"], "is not HOST:PORT"),
        (["--listen", "127.0.0.1:9", "--slack-url", "ftp://x"], "--slack-url must be"),
        (["--listen", "127.0.0.1:9", "--since", "1h", "--step", "0.1s"], "too fine"),
        (["--listen", "127.0.0.1:9", "--since", "soon"], "not a duration"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args, why):
    proc = subprocess.run(_cli(*args), capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 2 and why in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_port_in_use_is_one_line_and_exit_2():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            _cli("--listen", f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and f"cannot listen on 127.0.0.1:{port}" in proc.stderr


def test_the_message_names_the_cause_that_stands_in_for_the_alerts_playbook(site):
    record = {
        "alert": "VllmRequestQueueSaturated",
        "severity": "warning",
        "summary": "Requests are queueing.",
        "playbook": "queue-saturation",
        "runbook_url": "https://rb/queue",
        "scope": {"model_name": "m"},
        "since_seconds": 3600.0,
        "playbook_rank": None,
        "explained_by": "replica-imbalance",
        "diagnosis": {"findings": []},
        "error": None,
    }
    text = message(record, None, site)
    assert "`queue-saturation` (not matched on its own; `replica-imbalance` above" in text
    record |= {"playbook_rank": 2}
    assert "ranked 2 in the diagnosis, behind its cause `replica-imbalance`" in message(
        record, None, site
    )


def test_an_alert_on_a_model_without_series_is_not_read_as_all_clear(site):
    """The chat message of an alert on a model with no series says so, as the text report
    does, rather than that no playbook matched."""
    empty = loopback.serve(lambda h, f: loopback.answer(h, loopback.EMPTY))
    with empty as prom, chat_server() as (chat_url, received):
        hook = Webhook(
            PrometheusSource(prom.url),
            site,
            lambda r: None,
            lookback=0,
            forwarder=SlackForwarder(chat_url, site),
            now=lambda: 1_800_000_000,
        )
        with running(hook) as url:
            assert post(url, notification(alert()))[0] == 200
            (msg,) = wait_for(lambda: received)
    assert "*Diagnosis:* No vLLM series in the window: nothing to diagnose" in msg["text"]
    assert "no playbook matched" not in msg["text"]
