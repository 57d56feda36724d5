"""diagnose over the whole scenario library, each in a real Prometheus: the right cause first."""

from __future__ import annotations

import pytest

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.sim import library
from diagnoser.source import PrometheusSource

NAMES = library.names()


@pytest.fixture(scope="module")
def diagnoses(scenario_library, prometheus_for, catalog):
    cache: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in cache:
            sc = library.find(name)
            prom = prometheus_for(name)
            window = Window.plan(sc.labels.window, scenario_library[name].end)
            cache[name] = to_json(diagnose(PrometheusSource(prom.url), catalog, window))
        return cache[name]

    return get


@pytest.mark.parametrize("name", NAMES)
def test_the_top_finding_is_the_labelled_cause(name, diagnoses):
    sc = library.find(name)
    doc = diagnoses(name)
    found = [(f["id"], f["confidence"], f["explained_by"]) for f in doc["findings"]]
    if sc.labels.healthy:
        assert found == [], f"healthy scenario {name} yielded findings: {found}"
        return
    assert found, f"{name}: nothing found; undecided {doc['undecided']}"
    assert found[0][0] == sc.labels.expect[0], (
        f"{name}: expected {sc.labels.expect[0]}, got {found}"
    )


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
