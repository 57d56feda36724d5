"""A scenario's labels: ``resolved`` and ``ended`` read and checked like ``expect`` and
``absent``, and a diagnosis judged against them (current findings, resolved ones), on
hand-built answers: no simulation, no server."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.sim import library
from diagnoser.sim.labels import Expectation
from diagnoser.sim.scenario import ScenarioError, check_labels, load_scenario

ROOT = Path(__file__).resolve().parent.parent
SCENARIO = """\
description: A small steady server.
duration: 20m
labels:
  window: 10m
  {labels}
models:
  - name: m
    preset: llama-3.1-8b
    workload:
      rate: {{mean: 1}}
      prompt: {{median: 200, sigma: 0.4}}
      output: {{median: 100, sigma: 0.4}}
"""


def _load(tmp_path, labels: str):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(labels=labels))
    return load_scenario(path)


def test_resolved_and_ended_are_read_as_playbook_lists(tmp_path):
    sc = _load(tmp_path, "expect: []\n  resolved: [batch-slot-limit]")
    assert sc.labels.resolved == ("batch-slot-limit",) and sc.labels.expect == ()
    assert sc.labels.recovered and not sc.labels.healthy and sc.labels.kind == "recovery"
    sc = _load(tmp_path, "ended: [kv-cache-pressure]")
    assert sc.labels.ended == ("kv-cache-pressure",) and sc.labels.kind == "recovery"
    sc = _load(tmp_path, "expect: [batch-slot-limit]\n  resolved: [prefix-cache-collapse]")
    assert sc.labels.kind == "incident" and not sc.labels.recovered
    assert _load(tmp_path, "expect: []").labels.kind == "healthy"


@pytest.mark.parametrize(
    ("labels", "says"),
    [
        ("resolved: batch-slot-limit", "labels.resolved: must be a list of playbook ids"),
        ("ended: [1]", "labels.ended: must be a list of playbook ids"),
        (
            "expect: [batch-slot-limit]\n  resolved: [batch-slot-limit]",
            "labels.resolved[0]: batch-slot-limit is also in labels.expect",
        ),
        (
            "expect: [kv-cache-pressure]\n  ended: [kv-cache-pressure]",
            "labels.ended[0]: kv-cache-pressure is also in labels.expect",
        ),
        ("recovered: [x]", "labels: may hold only window, expect, absent, resolved, ended"),
    ],
)
def test_bad_labels_are_one_line_naming_file_and_field(tmp_path, labels, says):
    with pytest.raises(ScenarioError) as err:
        _load(tmp_path, labels)
    text = str(err.value)
    assert "\n" not in text and str(tmp_path / "s.yaml") in text and says in text, text


@pytest.mark.parametrize("key", ["resolved", "ended"])
def test_an_unknown_resolved_playbook_is_named_with_its_field(tmp_path, catalog, key):
    sc = _load(tmp_path, f"{key}: [batch-slot-limt]")
    with pytest.raises(ScenarioError, match=rf"labels\.{key}\[0\]: unknown playbook"):
        check_labels(sc, catalog.ids())


# --- judging --------------------------------------------------------------------------------

RECOVERED = Expectation(resolved=("batch-slot-limit",))
SEQUENCE = Expectation(expect=("batch-slot-limit",), resolved=("prefix-cache-collapse",))
AFTER = Expectation(window=600.0, ended=("batch-slot-limit",))


def test_a_recovery_needs_its_playbook_resolved_and_nothing_current():
    assert RECOVERED.misses([], ["batch-slot-limit"]) == []
    assert RECOVERED.misses([], []) == ["batch-slot-limit not reported resolved"]
    assert RECOVERED.misses(["batch-slot-limit"], []) == [
        "recovery, yet current: batch-slot-limit",
        "batch-slot-limit still current, expected resolved",
    ]
    assert RECOVERED.misses(["queue-saturation"], ["batch-slot-limit"]) == [
        "recovery, yet current: queue-saturation"
    ]


def test_a_sequence_needs_the_live_incident_first_and_the_ended_one_resolved():
    assert SEQUENCE.misses(["batch-slot-limit"], ["prefix-cache-collapse"]) == []
    assert SEQUENCE.misses(["batch-slot-limit", "prefix-cache-collapse"], []) == [
        "prefix-cache-collapse still current, expected resolved"
    ]
    assert SEQUENCE.misses(["prefix-cache-collapse", "batch-slot-limit"], []) == [
        "expected batch-slot-limit first, got prefix-cache-collapse, batch-slot-limit",
        "prefix-cache-collapse still current, expected resolved",
    ]
    assert SEQUENCE.misses([], ["prefix-cache-collapse"]) == [
        "nothing current; expected batch-slot-limit first"
    ]


def test_an_incident_ended_before_a_short_window_may_be_resolved_or_not_but_not_current():
    assert AFTER.misses([], []) == [] and AFTER.misses([], ["batch-slot-limit"]) == []
    assert AFTER.misses(["batch-slot-limit"], []) == [
        "recovery, yet current: batch-slot-limit",
        "batch-slot-limit still current, expected ended",
    ]


def test_healthy_and_incident_labels_are_judged_as_before():
    healthy, incident = Expectation(), Expectation(expect=("kv-cache-pressure",))
    assert healthy.misses([], []) == [] and healthy.misses([], ["kv-cache-pressure"]) == []
    assert healthy.misses(["kv-cache-pressure"]) == ["healthy, yet current: kv-cache-pressure"]
    assert incident.misses(["kv-cache-pressure", "queue-saturation"]) == []
    assert incident.misses(["queue-saturation"]) == [
        "expected kv-cache-pressure first, got queue-saturation"
    ]


def test_every_library_label_names_a_known_playbook(catalog):
    for name in library.names():
        check_labels(library.find(name), catalog.ids())


@pytest.mark.parametrize("world", ["healthy", "disaggregated"])
def test_the_benches_scenarios_beside_the_library_load_and_name_known_playbooks(catalog, world):
    """``fixtures/healthy`` and ``fixtures/disaggregated``: scenarios only the benches run."""
    paths = sorted((ROOT / "fixtures" / world).glob("*.yaml"))
    assert paths
    for path in paths:
        sc = load_scenario(path)
        check_labels(sc, catalog.ids())
        assert sc.name not in library.names(), sc.name


# --- variants of incidents that end ---------------------------------------------------------

ENDING = [n for n in library.names() if library.find(n).labels.kind == "recovery"]


def test_the_library_has_recoveries_short_windows_after_one_and_a_sequence():
    kinds = {n: library.find(n).labels for n in library.names()}
    assert sum(bool(lab.resolved) and not lab.expect for lab in kinds.values()) >= 3
    assert sum(bool(lab.ended) for lab in kinds.values()) >= 2
    assert any(lab.expect and lab.resolved for lab in kinds.values())


@pytest.mark.parametrize("name", ENDING)
def test_a_variant_of_a_recovery_shifts_the_incident_and_still_sets_the_knob_back(name):
    from diagnoser.sim.variants import SHIFTS, can_age

    base = library.find(name)
    assert not can_age(base)  # aged by hours, the incident would end long before its window
    for k in (1, 4, 8):
        v = library.find(f"{name}~{k}")
        assert v.labels == base.labels and v.duration == base.duration
        for m, mv in zip(base.models, v.models, strict=True):
            for c, cv in zip(m.timeline, mv.timeline, strict=True):
                assert cv.at == max(60.0, c.at + SHIFTS[k - 1])
            # The last change restores the value the model had before the timeline.
            (knob, value), *_ = m.timeline[-1].set.items()
            assert mv.timeline[-1].set[knob] == value
        # However shifted, the recovery stays inside the scenario and before its end.
        last = max(c.at + c.over for m in v.models for c in m.timeline)
        assert last < v.duration - 60
