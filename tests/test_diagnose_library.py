"""diagnose over the whole scenario library, each in a real Prometheus: the right cause first,
and an incident that ended reported resolved, never current."""

from __future__ import annotations

import pytest

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.sim import library

NAMES = library.names()
# Scenarios whose labels say an incident ended in the window or just before it.
ENDING = [n for n in NAMES if library.find(n).labels.resolved or library.find(n).labels.ended]


@pytest.fixture(scope="session")
def diagnoses(scenario_library, prometheus_for, site):
    """Each scenario diagnosed once per worker. Session-scoped, not module-scoped, so that the
    module's tests spread over the workers: the scenarios it simulates are the run's shared
    library, and one worker alone would simulate them all one after another."""
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            sc = library.find(name)
            prom = prometheus_for(name)
            window = Window.plan(sc.labels.window, scenario_library[name].end)
            cache[name] = to_json(diagnose(PrometheusSource(prom.url), site, window))
        return cache[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_the_top_finding_is_the_labelled_cause(name, diagnoses):
    sc = library.find(name)
    doc = diagnoses(name)
    found = [(f["id"], f["confidence"], f["explained_by"]) for f in doc["findings"]]
    if not sc.labels.expect:
        assert found == [], f"{sc.labels.kind} scenario {name} yielded findings: {found}"
        return
    assert found, f"{name}: nothing found; undecided {doc['undecided']}"
    assert found[0][0] == sc.labels.expect[0], (
        f"{name}: expected {sc.labels.expect[0]}, got {found}"
    )


@pytest.mark.parametrize("name", ENDING)
def test_incidents_that_ended_are_reported_resolved_and_not_current(name, diagnoses):
    sc = library.find(name)
    doc = diagnoses(name)
    ids = [f["id"] for f in doc["findings"]]
    misses = sc.labels.misses(ids, [f["id"] for f in doc["resolved"]])
    assert not misses, f"{name}: {'; '.join(misses)}"


@pytest.mark.parametrize("name", NAMES)
def test_look_alikes_are_not_reported_as_causes(name, diagnoses):
    sc = library.find(name)
    causes = {f["id"] for f in diagnoses(name)["findings"] if not f["explained_by"]}
    assert not causes & set(sc.labels.absent), f"{name}: {causes & set(sc.labels.absent)}"


def test_a_finding_carries_the_contract_fields(diagnoses):
    doc = diagnoses("retrieval-launch")
    top = doc["findings"][0]
    for key in (
        "id",
        "title",
        "confidence",
        "severity",
        "scope",
        "onset",
        "evidence",
        "cause",
        "fix",
        "guardrail",
        "runbook",
    ):
        assert key in top, key
    assert 0 < top["confidence"] <= 1
    assert top["scope"] == {"model_name": "llama-3.1-8b-instruct"}
    assert top["onset"] > doc["window"]["start"]
    confidences = [f["confidence"] for f in doc["findings"]]
    assert confidences == sorted(confidences, reverse=True)


def test_markdown_html_and_explain_render_the_same_diagnosis(
    scenario_library, prometheus_for, site
):
    from diagnoser.report.explain import explain
    from diagnoser.report.html import render
    from diagnoser.report.markdown import markdown

    sc = library.find("two-am-itl-spike")
    prom = prometheus_for(sc.name)
    window = Window.plan(sc.labels.window, scenario_library[sc.name].end)
    result = diagnose(PrometheusSource(prom.url), site, window)
    md = markdown(result)
    assert md.startswith("## Diagnosis") and "(`prefill-interference`)" in md
    page = render(result)
    assert page.startswith("<!doctype html>") and page.count("<svg") >= 3
    assert "onset" in page and "<script" not in page
    text = explain(result, "prefill-interference")
    assert "MATCHED" in text and "long_prefills_rate >= 0.005" in text
    assert "ruled out" in explain(result, "long-request-in-batch") or "not matched" in explain(
        result, "long-request-in-batch"
    )


def test_scoping_to_an_unknown_model_finds_nothing_to_diagnose(
    scenario_library, prometheus_for, site
):
    prom = prometheus_for("retrieval-launch")
    window = Window.plan(3600, scenario_library["retrieval-launch"].end)
    doc = to_json(
        diagnose(PrometheusSource(prom.url), site, window, matchers=('model_name="no-such-model"',))
    )
    assert doc["scopes"] == [] and doc["findings"] == []


def test_a_model_whose_new_pods_never_serve_is_unavailable_for_that_time(diagnoses):
    """A rollout's new pods that never served count as the model's targets: once the pods
    they replaced are gone nothing answers, which the availability SLI counts, and the
    health says why as the new pods' own kube-state-metrics series say it. A rollout whose
    new pods serve stays at 100%."""
    (stuck,) = diagnoses("rollout-never-starts")["health"]
    assert stuck["verdict"] == "unhealthy"
    assert stuck["targets"]["total"] == stuck["targets"]["down"] == 2
    assert stuck["slo"]["availability"]["good_share"] < 0.2
    assert stuck["slo"]["availability"]["good_share_now"] == 0
    assert stuck["reasons"][0].endswith(
        "2 of them a rollout's new pods that never served: its container cannot start "
        "(ImagePullBackOff: its image cannot be pulled; kube-state-metrics' waiting reason)"
    )
    (rolled,) = diagnoses("healthy-kubernetes-rollout")["health"]
    assert rolled["verdict"] == "healthy" and rolled["slo"]["availability"]["good_share"] == 1
