"""diagnose on recorded Prometheus answers (tests/data/answers): a matching or ranking change
shows here in milliseconds, with the whole JSON diagnosis compared, not only the top finding.

The recordings are real Prometheus answers for library scenarios at a fixed end; ``make
goldens`` records them again (in a real Prometheus) and rewrites the expected diagnoses.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.sim import library
from lab.replay import Recording, Replay

pytestmark = pytest.mark.prometheus

ANSWERS = Path(__file__).parent / "data" / "answers"
END = 1793534400.0  # 2026-11-01T12:00:00Z, as the goldens
SCENARIOS = [
    "retrieval-launch",
    "healthy-steady",
    "healthy-quiet-night",
    "kv-cannot-fit-max-model-len",
    "two-am-itl-spike",
    "batch-slot-limit",
    "fast-server-slow-users",
    "gpu-memory-contention",
]


def _stable(doc: dict) -> dict:
    doc = dict(doc)
    doc.pop("stats")
    return doc


@pytest.fixture(scope="module")
def recorded(tmp_path_factory, site) -> None:
    """With UPDATE_GOLDENS set: record every scenario again from a real Prometheus."""
    if not os.environ.get("UPDATE_GOLDENS"):
        return
    from diagnoser.plumbing.source import PrometheusSource
    from lab import harness
    from lab.promserver import Prometheus

    ANSWERS.mkdir(parents=True, exist_ok=True)
    prepared = harness.prepare(SCENARIOS, tmp_path_factory.mktemp("replay"), end=END)
    for name in SCENARIOS:
        sc = library.find(name)
        with Prometheus(prepared[name].data_dir) as prom:
            source = Recording(PrometheusSource(prom.url))
            window = Window.plan(sc.labels.window, END)
            doc = _stable(to_json(diagnose(source, site, window)))
        source.save(ANSWERS / f"{name}.json.gz", scenario=name, end=END)
        (ANSWERS / f"{name}.expected.json").write_text(json.dumps(doc, indent=1) + "\n")


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_recorded_answers_give_the_recorded_diagnosis(name, site, recorded):
    replay = Replay(ANSWERS / f"{name}.json.gz")
    window = Window.plan(library.find(name).labels.window, replay.meta["end"])
    got = _stable(to_json(diagnose(replay, site, window)))
    want = json.loads((ANSWERS / f"{name}.expected.json").read_text())
    assert got == want, f"{name}: the diagnosis changed; review, then run make goldens"
