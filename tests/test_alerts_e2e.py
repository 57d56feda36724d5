"""End to end with native binaries: an alert that arrives diagnosed.

The simulator serves tests/scenarios/live-rejections.yaml live (healthy for 30 s, then 40% of
requests refused with HTTP 400). A real Prometheus scrapes it every second and evaluates
servediag's generated rules every second, with a test-only short ``for:`` on the alert. The
alert goes to a real Alertmanager routed by deploy/alertmanager.yml (its webhook URL pointed
at the test's receiver, its group waits shortened), which calls ``servediag webhook``; the
JSON line it prints must name the playbook, with the alert's runbook_url, as the diagnosis's
top finding. Every process is stopped at the end and its port is free again.

Timing: the rules' 5-minute rates see the whole short history, so the 4xx share passes the
alert's 5% about 4 s after the fault; ``for: 15s`` then puts the alert about 20 s after the
fault, so a 30 s diagnosis window at a 1 s step holds a clean stretch before the fault and
one after it. The whole run takes about a minute; it is bounded at 90 s.
"""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from diagnoser.outputs import rules
from diagnoser.site import Site
from diagnoser.site.config import AlertOverride, SiteConfig
from lab.promserver import Alertmanager, Prometheus, free_port, listening

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = Path(__file__).resolve().parent / "scenarios" / "live-rejections.yaml"
ALERT, PLAYBOOK, MODEL = "VllmRequestsRejected", "context-length-rejections", "qwen3-8b"
BUDGET = 90.0
TEST_CONFIG = SiteConfig(alerts={ALERT: AlertOverride(for_="15s")})


def alertmanager_config(webhook_url: str) -> dict[str, Any]:
    """deploy/alertmanager.yml with every webhook pointed at ``webhook_url`` and the group
    waits cut to a second: the same routing tree, on a test's time scale."""
    doc = yaml.safe_load((ROOT / "deploy" / "alertmanager.yml").read_text())
    for receiver in doc["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook_url
    routes = [doc["route"], *doc["route"].get("routes", [])]
    for route in routes:
        for key, value in (("group_wait", "1s"), ("group_interval", "2s")):
            if key in route or route is doc["route"]:
                route[key] = value
    return dict(doc)


def wait_http(url: str, proc: subprocess.Popen[str], deadline: float) -> None:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except (urllib.error.URLError, OSError):
            if proc.poll() is not None:
                pytest.fail(f"{proc.args[3]} exited: {proc.stderr.read() if proc.stderr else ''}")
            if time.monotonic() > deadline:
                pytest.fail(f"{url} did not answer")
            time.sleep(0.1)


@contextlib.contextmanager
def process(args: list[str]) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def lines_of(proc: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's stdout, line by line, read on a thread so the test can wait with a bound."""
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.put(line)

    threading.Thread(target=pump, daemon=True).start()
    return out


@pytest.mark.promtool
def test_an_alert_reaches_the_webhook_through_alertmanager_and_arrives_diagnosed(catalog):
    deadline = time.monotonic() + BUDGET
    servediag = [sys.executable, "-m", "diagnoser"]
    sim_port, hook_port = free_port(), free_port()
    ports: list[int] = [sim_port, hook_port]
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="servediag-e2e-")))
        files = rules.render_files(Site.build(TEST_CONFIG, catalog))
        rule_files = []
        for name in (rules.RECORDING_FILE, rules.ALERTS_FILE):
            (tmp / name).write_text(files[name])
            rule_files.append(tmp / name)

        am = stack.enter_context(
            Alertmanager(alertmanager_config(f"http://127.0.0.1:{hook_port}/alerts"))
        )
        prom = stack.enter_context(
            Prometheus(
                tmp / "data",
                rule_files=rule_files,
                scrape_configs=[
                    {
                        "job_name": "vllm",
                        "scrape_interval": "1s",
                        "static_configs": [{"targets": [f"127.0.0.1:{sim_port}"]}],
                    }
                ],
                config={
                    "global": {"evaluation_interval": "1s"},
                    "alerting": {
                        "alertmanagers": [
                            {"static_configs": [{"targets": [f"127.0.0.1:{am.port}"]}]}
                        ]
                    },
                },
            )
        )
        ports += [am.port, prom.port]
        hook = stack.enter_context(
            process(
                [
                    *servediag,
                    "webhook",
                    "--listen",
                    f"127.0.0.1:{hook_port}",
                    "--prometheus-url",
                    prom.url,
                    "--since",
                    "30s",
                    "--step",
                    "1s",
                    "--recorded-rules",
                ]
            )
        )
        records = lines_of(hook)
        wait_http(f"http://127.0.0.1:{hook_port}/healthz", hook, deadline)
        # The scenario's clock starts with the simulator; Prometheus scrapes it within a second.
        sim = stack.enter_context(
            process([*servediag, "simulate", str(SCENARIO), "--serve", f"127.0.0.1:{sim_port}"])
        )
        wait_http(f"http://127.0.0.1:{sim_port}/metrics", sim, deadline)
        record = None
        while record is None:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no diagnosis within {BUDGET:g} s; Alertmanager holds {am.alerts()}")
            try:
                line = records.get(timeout=min(left, 1.0))
            except queue.Empty:
                continue
            doc = json.loads(line)
            if doc["alert"] == ALERT:
                record = doc
        held = [a["labels"]["alertname"] for a in am.alerts()]
    for port in ports:
        assert not listening(port), port
    assert ALERT in held
    assert record["playbook"] == PLAYBOOK and record["scope"] == {"model_name": MODEL}
    assert record["runbook_url"] == TEST_CONFIG.runbook_for(PLAYBOOK)
    assert record["error"] is None, record["error"]
    assert record["top_finding"] == PLAYBOOK, json.dumps(record["diagnosis"], indent=1)
    # The rules are evaluated here every second, but a 30 s window is read at 4 s rates,
    # which the rules' five minutes would blur: nothing is read from them, and it says so.
    stats = record["diagnosis"]["stats"]
    assert stats["recorded_signals"] == 0
    assert stats["not_recorded"] == "the window's rates (4s) are under the rules' 5m"
    top = record["diagnosis"]["findings"][0]
    assert top["runbook"] == record["runbook_url"] and top["onset"]
