"""``servediag watch --alerts``: Alertmanager's notifications answered from the watch's last
cycle, on a real Prometheus: the cycle's diagnosis of a model is what a diagnosis scoped to
that model names; an alert is answered from the cycle only when the cycle is good, recent and
saw the alert begin, and diagnosed anew otherwise; the receiver shares the watch's listener
and /metrics."""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import replace

import pytest
from test_watch import samples, value

from diagnoser.diagnosis.model import to_json
from diagnoser.plumbing.durations import iso
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.request import Scope, run
from diagnoser.site import Site
from diagnoser.watch.http import listen
from diagnoser.watch.loop import Watch
from diagnoser.webhook.receiver import Webhook
from lab.promserver import free_port

FLEET = "mixed-fleet-retrieval"  # prompt-length-shift on qwen3-8b (SGLang), llama untouched
SHIFTED, STEADY = "qwen3-8b", "llama-3.1-8b-instruct"
EVERY = 60.0


@pytest.fixture(scope="module")
def cycled(scenario_library, prometheus_for):
    """A watch of the fleet that ran one good cycle at the scenario's end, its clock there."""
    prom = prometheus_for(FLEET)
    end = scenario_library[FLEET].end
    clock = {"now": end}
    watch = Watch(
        PrometheusSource(prom.url),
        Site.load(None),
        3600.0,
        every=EVERY,
        lookback=0.0,
        timeout=30.0,
        now=lambda: clock["now"],
    )
    assert watch.cycle(end).kind == "ok"
    return watch, prom, clock


def alert(model: str, starts: float, name: str = "VllmPromptLengthShift") -> dict:
    return {
        "status": "firing",
        "labels": {"alertname": name, "playbook": "prompt-length-shift", "model_name": model},
        "annotations": {},
        "startsAt": iso(starts),
    }


def test_a_models_part_of_the_cycle_is_what_a_diagnosis_of_that_model_names(cycled):
    watch, prom, _ = cycled
    whole = watch.latest
    assert {m.playbook.id for m in whole.findings} >= {"prompt-length-shift"}
    for model in (SHIFTED, STEADY):
        mine = watch.recent({"model_name": model}, None)
        alone = run(
            replace(
                watch.request,
                source=PrometheusSource(prom.url),
                scope=Scope(labels=(("model_name", model),)),
                until=whole.window.end,
            )
        )
        assert [m.playbook.id for m in mine.findings] == [m.playbook.id for m in alone.findings]
        assert [(h.scope, h.verdict) for h in mine.health] == [
            (h.scope, h.verdict) for h in alone.health
        ]
        assert {s["model_name"] for s in to_json(mine)["scopes"]} == {model}
    shifted = watch.recent({"model_name": SHIFTED}, None)
    assert shifted.findings[0].playbook.id == "prompt-length-shift"
    assert not watch.recent({"model_name": STEADY}, None).findings


def test_the_cycle_answers_only_when_it_is_good_recent_and_saw_the_alert_begin(cycled):
    watch, _, clock = cycled
    end = watch.latest.window.end
    at = watch.last_success
    assert watch.recent({"model_name": SHIFTED}, end - 600) is not None
    assert watch.recent({"model_name": SHIFTED}, end + 1) is None  # began after the window
    assert watch.recent({"model_name": "not-served"}, None) is None  # not in its scope
    assert watch.recent({"job": "vllm", "instance": "a:8000"}, None) is None  # a target's alert
    clock["now"] = at + 2 * EVERY + 1  # two turns without a good cycle
    try:
        assert watch.recent({"model_name": SHIFTED}, None) is None
    finally:
        clock["now"] = at
    last = watch.last
    watch.last = replace(last, kind="source")  # the last cycle failed: what is kept is stale
    try:
        assert watch.recent({"model_name": SHIFTED}, None) is None
    finally:
        watch.last = last


def test_alerts_on_the_watch_listener_are_answered_from_the_cycle_or_anew(cycled):
    watch, _, clock = cycled
    end = watch.latest.window.end
    records: list[dict] = []
    # Diagnosed anew against a Prometheus that is not there: the record says it failed, so a
    # record that did not fail came from the cycle, with no query sent.
    hook = Webhook(
        PrometheusSource(f"http://127.0.0.1:{free_port()}", timeout=5.0),
        watch.site,
        records.append,
        since=3600.0,
        recent=watch.recent,
        now=lambda: clock["now"],
    )
    server = listen(watch, "127.0.0.1", 0, receiver=hook)
    hook.start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        body = json.dumps(
            {
                "groupKey": "g",
                "alerts": [alert(SHIFTED, end - 900), alert(STEADY, end + 30, "VllmTtftSlo")],
            }
        ).encode()
        req = urllib.request.Request(base + "/alerts", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        assert hook.dispatcher.wait_idle(30)
        by_model = {r["scope"]["model_name"]: r for r in records}
        cycle = by_model[SHIFTED]
        assert cycle["outcome"] == "diagnosed" and cycle["from_cycle"] == iso(end)
        assert cycle["top_finding"] == "prompt-length-shift" and cycle["playbook_rank"] == 1
        assert cycle["diagnosis"] == to_json(watch.latest.within({"model_name": SHIFTED}))
        anew = by_model[STEADY]
        assert anew["outcome"] == "failed" and anew["from_cycle"] is None
        with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert value(text, "servediag_webhook_diagnoses_total", outcome="from_watch_cycle") == 1
        assert value(text, "servediag_webhook_diagnoses_total", outcome="error") == 1
        assert len(samples(text)["servediag_health"]) == 2  # the watch's own series beside them
    finally:
        hook.drain(1.0)
        server.shutdown()
        server.server_close()
