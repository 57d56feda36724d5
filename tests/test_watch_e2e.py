"""End to end with native binaries: servediag watch names a live incident, and the page and the
dashboard carry what it names.

The simulator serves tests/scenarios/live-kv-transfer-failures.yaml live (a decode server
healthy for 15 s, then one KV transfer in six fails and its request ends HTTP 500). A real
Prometheus scrapes it and a real ``servediag watch`` process (``--since 20s --every 10s``,
the shortest cycle the command takes) every second, and evaluates servediag's generated rules
every second. The watch's /metrics must serve the finding; Prometheus must hold it as
``servediag_finding{playbook="kv-transfer-failures"}``; the symptom alert VllmHttpErrors and
ServediagLikelyCause, as that Prometheus evaluates them, must name the cause in their
annotations; and every query of the Overview dashboard's "Diagnosis now" row (and its onset
annotation) must return data from that Prometheus. Every process is stopped at the end and its
port is free again.

The alerts' ``for:`` is cut to a second in the test's copy of the rules (5m and 2m as
generated); nothing else of the rules is changed. That a finding leaves once the incident is
over takes --clear-after after the recovery, too long to wait for live: tests/test_watch.py
steps the cycles through a recovered incident on a backfilled Prometheus for that.

Over 20 s the diagnosis may not date the onset (the failures' series begin with the fault):
the annotation then says "an onset not known" and the onset's queries return nothing, which
the test accepts only while the watch serves no onset; tests/test_dashboards.py reads them
against a backfilled one.

Timing: the 5xx series only exist from the first failure on, and the diagnosis names the
failures once the last 20 s hold enough of them (about 25 s after the fault); a finding is
served from its second cycle on, 10 s later. The run takes about 55 s; it is bounded at 80 s.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_alerts_e2e import process, wait_http
from test_watch import finding

from diagnoser.outputs import rules
from diagnoser.site import Site
from lab.promserver import Prometheus, free_port, listening

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = Path(__file__).resolve().parent / "scenarios" / "live-kv-transfer-failures.yaml"
PLAYBOOK, MODEL = "kv-transfer-failures", "pd-chat"
SYMPTOM, CAUSE = "VllmHttpErrors", "ServediagLikelyCause"
BUDGET = 80.0
ROW = "Diagnosis now"


def alerts_for_the_test(text: str) -> str:
    """The generated alert rules with the ``for:`` of the two alerts under test cut to 1 s."""
    doc = yaml.safe_load(text)
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") in (SYMPTOM, CAUSE):
                rule["for"] = "1s"
    return yaml.safe_dump(doc, sort_keys=False)


def row_queries() -> list[str]:
    """Every query of the Overview's "Diagnosis now" row and of its onset annotation, from
    the generated dashboard, its variables set to all models."""
    board = json.loads((ROOT / "dashboards" / "overview.json").read_text())
    panels = board["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == ROW)
    row = []
    for p in panels[start + 1 :]:
        if p["type"] == "row":
            break
        row.append(p)
    exprs = [t["expr"] for p in row for t in p.get("targets", [])]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "servediag_" in a.get("expr", "")]
    assert len(exprs) >= 5, exprs
    return [re.sub(r"\$\{?model_name\}?", ".*", e) for e in exprs]


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return str(resp.read().decode())


def active(prom: Prometheus) -> list[dict[str, Any]]:
    return list(json.loads(get(prom.url + "/api/v1/alerts"))["data"]["alerts"])


def named(alerts: list[dict[str, Any]], name: str) -> dict[str, Any] | None:
    """The alert ``name`` of the model whose annotations name a cause, if it is active."""
    for a in alerts:
        if a["labels"]["alertname"] == name and a["labels"].get("model_name") == MODEL:
            text = a["annotations"].get("likely_cause", a["annotations"].get("description", ""))
            if PLAYBOOK in text:
                return a
    return None


@pytest.mark.promtool
def test_watch_names_a_live_incident_on_its_metrics_the_page_and_the_dashboard():
    deadline = time.monotonic() + BUDGET
    servediag = [sys.executable, "-m", "diagnoser"]
    sim_port, watch_port = free_port(), free_port()
    ports: list[int] = [sim_port, watch_port]
    watch_url = f"http://127.0.0.1:{watch_port}/metrics"
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="servediag-watch-")))
        files = rules.render_files(Site.default())
        (tmp / "recording.yaml").write_text(files[rules.RECORDING_FILE])
        (tmp / "alerts.yaml").write_text(alerts_for_the_test(files[rules.ALERTS_FILE]))
        scrape = [("vllm", sim_port), ("servediag-watch", watch_port)]
        prom = stack.enter_context(
            Prometheus(
                tmp / "data",
                rule_files=[tmp / "recording.yaml", tmp / "alerts.yaml"],
                scrape_configs=[
                    {
                        "job_name": job,
                        "scrape_interval": "1s",
                        "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
                    }
                    for job, port in scrape
                ],
                config={"global": {"evaluation_interval": "1s"}},
            )
        )
        ports.append(prom.port)
        # The scenario's clock starts with the simulator; the watch's first cycle right away.
        sim = stack.enter_context(
            process([*servediag, "simulate", str(SCENARIO), "--serve", f"127.0.0.1:{sim_port}"])
        )
        watch = stack.enter_context(
            process(
                [
                    *servediag,
                    "watch",
                    "--prometheus-url",
                    prom.url,
                    "--since",
                    "20s",
                    "--every",
                    "10s",
                    "--listen",
                    f"127.0.0.1:{watch_port}",
                ]
            )
        )
        wait_http(f"http://127.0.0.1:{sim_port}/metrics", sim, deadline)
        wait_http(watch_url, watch, deadline)
        served = stored = symptom = cause = None
        while not (served and stored and symptom and cause):
            if time.monotonic() > deadline:
                held = [(a["labels"]["alertname"], a["state"]) for a in active(prom)]
                pytest.fail(
                    f"not all within {BUDGET:g} s: served {served}, stored {stored}, "
                    f"alerts {held}; the watch serves:\n{get(watch_url)}"
                )
            time.sleep(0.5)
            served = served or finding(get(watch_url), PLAYBOOK)
            stored = stored or prom.query(f'servediag_finding{{playbook="{PLAYBOOK}"}}')
            alerts = active(prom)
            symptom = symptom or named(alerts, SYMPTOM)
            cause = cause or named(alerts, CAUSE)
        answers = {expr: prom.query(expr) for expr in row_queries()}
        page = get(watch_url)
    for port in ports:
        assert not listening(port), port
    assert served is not None and 0 < served <= 1
    assert finding(page, PLAYBOOK, "servediag_finding_rank") == 1
    ((series,),) = [stored]
    assert series["metric"]["model_name"] == MODEL and series["metric"]["job"] == "servediag-watch"
    # The page carries the cause the watch names, its confidence, onset and runbook. Over 20 s
    # the diagnosis may not date the onset (the failures' series begin with the fault, so
    # there is no level before it to split from): then the page says so, and the queries of
    # the onset (the causes table's column, the annotation) have nothing to return.
    notes = symptom["annotations"]
    cause_text = re.fullmatch(
        rf"{PLAYBOOK} \(warning\), confidence [0-9.]+%, since (.+)", notes["likely_cause"]
    )
    assert cause_text, notes
    dated = cause_text.group(1) != "an onset not known"
    assert not dated or re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", cause_text.group(1)), notes
    assert notes["likely_cause_runbook"] == Site.default().runbook(PLAYBOOK)
    assert cause["labels"]["playbook"] == PLAYBOOK and cause["labels"]["severity"] == "warning"
    assert cause["annotations"]["runbook_url"] == Site.default().runbook(PLAYBOOK)
    onset = finding(page, PLAYBOOK, "servediag_finding_onset_timestamp_seconds")
    empty = [e for e, result in answers.items() if not result and (onset or "onset" not in e)]
    assert not empty, f"the dashboard's queries returned nothing: {empty}"
    assert len([e for e, result in answers.items() if result]) >= 5, answers
