"""Incidents back to back on one real vLLM server (``fixtures/real/sequences/``), recorded by
``python -m lab.real.sequence <name> --record`` into ``tests/data/real-sequences/``: over each
phase's own window, ``diagnose`` names that phase's incident first (or nothing current in a
healthy gap) and gives its verdict at the window's end; over an incident and the recovery
after it, it reports the incident as resolved and nothing current. Replayed from the recorded
answers; one test backfills the raw samples into a real Prometheus and diagnoses a window
again, so the recording holds what Prometheus scraped."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from diagnoser.diagnosis import Window, diagnose
from diagnoser.plumbing.source import PrometheusSource
from lab.real import sequence
from lab.real.incident import IncidentError
from lab.real.record import raw_prometheus
from lab.replay import Replay

RECORDED = sequence.recorded()
WINDOWS = [
    (d.name, p.name.removesuffix(".json.gz"))
    for d in RECORDED
    for p in sorted(d.glob("*.json.gz"), key=sequence._order)
]


def test_every_sequence_is_recorded():
    assert sorted(d.name for d in RECORDED) == sequence.names()


def test_the_evening_says_what_each_phase_must_give():
    seq = sequence.find("evening")
    incidents = [e.first for e in seq.expects if e.first]
    assert incidents == [
        "prefix-cache-collapse",
        "engine-hang",
        "batch-slot-limit",
        "context-length-rejections",
    ]
    # Every incident is followed by a gap that names it resolved; the crash, which no
    # playbook names, by a restart.
    resolved = [e.resolved for e in seq.expects if e.resolved]
    assert resolved == incidents
    assert [p.action for p in seq.phases if p.action] == ["freeze", "thaw", "kill", "start"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("phases: [{duration: 1m, expect: none}]", "phases: must list a baseline"),
        (
            "phases: [{duration: 1m, expect: none, resolved: x}, {duration: 1m, expect: none},"
            " {duration: 1m, expect: none}]",
            "phases[0].resolved: the first phase follows no incident",
        ),
        (
            "phases: [{duration: 1m, expect: none}, {duration: 1m, expect: none},"
            " {duration: 1m, expect: 3}]",
            "phases[2].expect: must name a playbook, or say none",
        ),
        (
            "phases: [{duration: 1m}, {duration: 1m, expect: none}, {duration: 1m}]",
            "phases[0].expect: must name a playbook, or say none",
        ),
    ],
)
def test_a_bad_sequence_file_is_one_line_naming_the_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(IncidentError) as err:
        sequence.load(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_windows_are_each_phase_and_each_incident_with_its_recovery():
    seq = sequence.find("evening")
    times, t = [], 1000.0
    for p in seq.phases:
        times.append({"start": t, "end": t + p.duration})
        t += p.duration
    w = sequence.windows(seq, times)
    assert w["phase-1"] == (300.0, times[1]["end"])  # the collapse's own five minutes
    assert w["after-2"] == (660.0, times[2]["end"])  # the collapse and its six minutes after
    assert len(w) == len(seq.phases) + sum(1 for e in seq.expects if e.resolved)


@pytest.mark.parametrize(("name", "which"), WINDOWS)
def test_each_window_is_diagnosed_as_the_phase_says(name, which, site):
    seq = sequence.find(name)
    said = sequence.said(sequence.replayed(sequence.DATA / name, which, site))
    expect = sequence.expectation(seq, which)
    assert said.ok(which, expect), said.line(which, expect)


@pytest.mark.prometheus
def test_the_raw_samples_give_the_recorded_diagnosis(site):
    directory = RECORDED[0]
    which = "after-4"  # the hang and the minutes after it
    meta = Replay(directory / f"{which}.json.gz").meta
    with (
        tempfile.TemporaryDirectory() as tmp,
        raw_prometheus(directory, Path(tmp), sequence.RAW_LOOKBACK) as prom,
    ):
        live = diagnose(PrometheusSource(prom.url), site, Window.plan(meta["since"], meta["end"]))
    again = sequence.replayed(directory, which, site)
    assert sequence.said(live) == sequence.said(again)
