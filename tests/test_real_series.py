"""Series as a real vLLM server writes them, read in a real Prometheus: token histograms whose
buckets end at the server's ``--max-model-len`` (1, 2, 5, ... up to it), and counters whose
children are born at their first increment."""

from __future__ import annotations

from pathlib import Path

import pytest

from diagnoser.diagnosis import Window, diagnose
from diagnoser.diagnosis.fetch import fetch, needed_signals
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.sim.scenario import load_scenario
from lab import harness
from lab.promserver import Prometheus

pytestmark = pytest.mark.prometheus

HERE = Path(__file__).resolve().parent
SHORT = load_scenario(HERE / "scenarios" / "short-context-long-prompts.yaml")


@pytest.fixture(scope="module")
def short_context(tmp_path_factory):
    prepared = harness.prepare([SHORT], tmp_path_factory.mktemp("short"))[SHORT.name]
    with Prometheus(prepared.data_dir) as prom:
        yield prom, prepared.end


def test_a_quantile_in_the_inf_bucket_is_said_as_a_lower_bound(short_context, site):
    prom, end = short_context
    window = Window.plan(SHORT.labels.window, end)
    result = diagnose(PrometheusSource(prom.url), site, window)
    (first,) = [f for f in result.findings if f.playbook.id == "prompt-length-shift"]
    texts = [result.evidence_text(r) for r in first.results]
    p50 = next(t for t in texts if t.startswith("prompt_tokens_p50 "))
    # The median is about 2,700 tokens; the top bound at max_model_len 4096 is 2,000.
    assert "-> ≥ 2,000 (≥ x" in p50, p50


def test_the_bounds_are_read_from_the_series(short_context, site):
    """The top bound of the server's buckets (2,000 at max_model_len 4096, not 20,000), and the
    long-prefill threshold taken from the bounds it has: decided, not missing."""
    prom, end = short_context
    window = Window.plan(SHORT.labels.window, end)
    signals = needed_signals(site)
    data = next(iter(fetch(PrometheusSource(prom.url), site, signals, window).models.values()))
    assert data.ceilings["prompt_tokens_p50"] == (2000.0,)
    assert data.has("long_prefills_rate")
    result = diagnose(PrometheusSource(prom.url), site, window)
    assert "prefill-interference" not in {m.playbook.id for m in result.undecided}
