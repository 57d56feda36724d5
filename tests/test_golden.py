"""Golden text reports for fixed scenarios at a fixed time.

Regenerate after an intended change with ``make goldens`` and review the diff.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from diagnoser.diagnosis import Window, diagnose
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.report.text import text
from diagnoser.sim import library
from lab import harness
from lab.promserver import Prometheus

pytestmark = pytest.mark.prometheus

GOLDEN = Path(__file__).parent / "golden"
END = 1793534400.0  # 2026-11-01T12:00:00Z: a fixed end, so times in the reports are stable
SCENARIOS = ["retrieval-launch", "healthy-steady", "kv-cannot-fit-max-model-len"]


def normalise(text: str) -> str:
    """Timing varies from run to run; everything else must not."""
    return re.sub(r"[0-9.]+ s in Prometheus", "N s in Prometheus", text)


@pytest.fixture(scope="module")
def reports(tmp_path_factory, site):
    prepared = harness.prepare(SCENARIOS, tmp_path_factory.mktemp("golden"), end=END)
    out = {}
    for name in SCENARIOS:
        sc = library.find(name)
        with Prometheus(prepared[name].data_dir) as prom:
            window = Window.plan(sc.labels.window, END)
            result = diagnose(PrometheusSource(prom.url), site, window)
        out[name] = normalise(text(result, colour=False))
    return out


@pytest.mark.parametrize("name", SCENARIOS)
def test_the_text_report_matches_its_golden_file(name, reports):
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("UPDATE_GOLDENS"):
        path.write_text(reports[name])
    assert path.exists(), f"{path} missing: run make goldens"
    assert reports[name] == path.read_text(), f"{name}: report changed; run make goldens"
