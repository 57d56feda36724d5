"""Scenarios: bad input in one line, exact exposition, the library visible in Prometheus."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest
from live_simulator import live_simulator

from diagnoser.metrics.exposition import iter_openmetrics
from diagnoser.metrics.signals import SIGNALS
from diagnoser.sim import library
from diagnoser.sim.run import simulate
from diagnoser.sim.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parent.parent

SMALL = """\
description: A short steady scenario for exposition tests.
duration: 10m
scrape_interval: 15s
seed: 5
labels: {{window: 5m, expect: [], absent: []}}
models:
  - name: tiny
    preset: llama-3.1-8b
    gpu: H100-80GB
    version: "{version}"
    probe: {{enabled: true, every: 60s}}
    workload:
      rate: {{mean: 2}}
      prompt: {{median: 400, sigma: 0.4}}
      output: {{median: 100, sigma: 0.4}}
"""


def _write(tmp_path: Path, text: str, name: str = "s.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize(
    ("edit", "where", "says"),
    [
        (
            ("rate: {mean: 2}", "rate: {mean: 2, colour: 1}"),
            "models[0].workload.rate.colour",
            "unknown key",
        ),
        (
            ("rate: {mean: 2}", "rate: {mean: -3}"),
            "models[0].workload.rate.mean",
            "must be between 0",
        ),
        (("preset: llama-3.1-8b", "preset: llama-9"), "models[0].preset", "unknown model preset"),
        (
            ("gpu: H100-80GB", "gpu: H100-80GB\n    engine: {gpu_memory_utilization: 0.2}"),
            "models[0].engine",
            "smaller than one block",
        ),
        (("duration: 10m", "duration: ten minutes"), "duration", "not a duration"),
        (
            ("    workload:", "    timeline: [{at: 5m, set: {workload.nope: 1}}]\n    workload:"),
            "models[0].timeline[0].set.workload.nope",
            "unknown knob",
        ),
        (
            ("gpu: H100-80GB", "gpu: H100-80GB\n    platform: openstack"),
            "models[0].platform",
            "must be one of kubernetes, bare-metal",
        ),
        (
            ("gpu: H100-80GB", "gpu: H100-80GB\n    rollout: blue-green"),
            "models[0].rollout",
            "must be one of in-place, new-pods",
        ),
        (
            ("gpu: H100-80GB", "gpu: H100-80GB\n    platform: bare-metal\n    rollout: new-pods"),
            "models[0].rollout",
            "new-pods needs platform kubernetes",
        ),
        (
            ("gpu: H100-80GB", "gpu: H100-80GB\n    engine: {new_token_ratio: 1.5}"),
            "models[0].engine.new_token_ratio",
            "must be between 0 and 1",
        ),
        (
            ("gpu: H100-80GB", "gpu: H100-80GB\n    engine: {mixed_chunk: sometimes}"),
            "models[0].engine.mixed_chunk",
            "must be true or false",
        ),
        (
            ("gpu: H100-80GB", "gpu: H100-80GB\n    fault: {start_failure: NoSuchReason}"),
            "models[0].fault.start_failure",
            "must be one of ErrImagePull, ImagePullBackOff",
        ),
    ],
)
def test_bad_scenarios_name_the_file_and_the_field(tmp_path, edit, where, says):
    text = SMALL.format(version="0.33").replace(*edit)
    path = _write(tmp_path, text)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert err.value.where == where, str(err.value)
    assert says in err.value.message
    assert "\n" not in str(err.value)


def test_the_cli_rejects_a_bad_scenario_with_exit_2(tmp_path):
    path = _write(tmp_path, SMALL.format(version="0.33").replace("mean: 2", "mean: -1"))
    proc = subprocess.run(
        [sys.executable, "-m", "diagnoser", "simulate", str(path), "--out", str(tmp_path / "x.om")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "s.yaml: models[0].workload.rate.mean:" in proc.stderr
    assert not (tmp_path / "x.om").exists()


def test_simulate_does_not_overwrite_an_existing_file(tmp_path):
    out = tmp_path / "mine.om"
    out.write_text("keep me")
    path = _write(tmp_path, SMALL.format(version="0.33"))
    proc = subprocess.run(
        [sys.executable, "-m", "diagnoser", "simulate", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "--force" in proc.stderr
    assert out.read_text() == "keep me"


def _exposition(tmp_path: Path, version: str) -> str:
    sc = load_scenario(_write(tmp_path, SMALL.format(version=version)))
    return "".join(iter_openmetrics(simulate(sc, end=1_800_000_000.0)))


def test_openmetrics_uses_vllms_exposed_names_labels_and_buckets(tmp_path):
    text = _exposition(tmp_path, "0.33")
    assert text.endswith("# EOF\n")
    assert "# TYPE vllm:num_preemptions counter\n" in text
    assert re.search(
        r'^vllm:num_preemptions_total\{engine="0",instance="tiny-0:8000",'
        r'job="vllm",model_name="tiny",namespace="llm",pod="tiny-0"\} ',
        text,
        re.M,
    )
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0"' in text
    assert 'le="0.001"' in text and 'le="2560.0"' in text and 'le="+Inf"' in text
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:request_time_per_output_token_seconds_count",
        "vllm:num_requests_waiting_by_reason",
        'finished_reason="repetition"',
        'status="2xx"',
        "process_cpu_seconds_total",
        "vllm:cache_config_info",
        "DCGM_FI_DEV_FB_USED",
        'llm_probe_requests_total{instance="llm-probe:9464"',
    ):
        assert name in text, name
    assert "vllm:gpu_cache_usage_perc" not in text


def test_the_pre_011_profile_uses_the_old_names(tmp_path):
    text = _exposition(tmp_path, "0.8")
    assert "vllm:gpu_cache_usage_perc{" in text
    assert "vllm:time_per_output_token_seconds_bucket{" in text
    assert "vllm:gpu_prefix_cache_hits_total{" in text
    for new in (
        "vllm:kv_cache_usage_perc",
        "vllm:inter_token_latency_seconds",
        'finished_reason="error"',
    ):
        assert new not in text, new


def test_histograms_are_cumulative_and_counts_match(tmp_path):
    sc = load_scenario(_write(tmp_path, SMALL.format(version="0.33")))
    rec = simulate(sc, end=1_800_000_000.0)
    fam = rec.families["vllm:e2e_request_latency_seconds"]
    (series,) = fam.hpoints.values()
    _t, _bounds, cum, _s = series[-1]
    assert all(a <= b for a, b in itertools.pairwise(cum))
    finished = sum(p[-1][1] for p in rec.families["vllm:request_success_total"].points.values())
    assert cum[-1] == finished > 0


def test_serve_answers_metrics_live(tmp_path):
    sc = load_scenario(_write(tmp_path, SMALL.format(version="0.33")))
    sc.scrape_interval = 1.0
    with live_simulator(sc, speed=20.0) as address:

        def finished() -> float:
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as r:
                body = r.read().decode()
            assert "# TYPE vllm:num_requests_running gauge" in body
            return sum(
                float(m)
                for m in re.findall(
                    r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", body, re.M
                )
            )

        time.sleep(1.0)
        first = finished()
        time.sleep(2.0)
        assert finished() > first


# --- the library in a real Prometheus -------------------------------------------------------

NAMES = library.names()


def test_the_library_covers_every_detectable_playbook_and_healthy_baselines(catalog):
    expected = set()
    healthy = 0
    for name in NAMES:
        sc = library.find(name)
        ids = set(sc.labels.expect) | set(sc.labels.absent)
        assert ids <= set(catalog.ids()), (name, ids - set(catalog.ids()))
        expected |= set(sc.labels.expect)
        healthy += sc.labels.healthy
    assert {p.id for p in catalog.detectable()} <= expected
    assert healthy >= 4


def _at(prom, name: str, t: float) -> float | None:
    """The signal's largest value at ``t``; where the servers export none of its series, its
    stand-in's (SGLang without its optional histograms), as diagnose reads it."""
    result = prom.query(SIGNALS[name].render(), at=t)
    for stand_in in SIGNALS[name].stand_in.values():
        result = result or prom.query(SIGNALS[stand_in.signal].render(), at=t)
    return max(float(r["value"][1]) for r in result) if result else None


@pytest.mark.parametrize("name", NAMES)
def test_the_labelled_signals_visibly_move(name, scenario_library, prometheus_for, catalog):
    sc = library.find(name)
    prom = prometheus_for(name)
    end = scenario_library[name].end
    before = end - sc.labels.window - 600
    if not sc.labels.expect:  # healthy, or calm again at the end after an incident that ended
        for sig, limit in (
            ("kv_cache_usage", 0.9),
            ("preemptions_rate", 0.01),
            ("http_5xx_share", 0.01),
            ("http_4xx_share", 0.01),
        ):
            # A family that is scraped gives its rare children a rate of 0 where they have
            # no series yet (a 4xx, a 5xx, a preemption): a value, never an absence.
            value = _at(prom, sig, end)
            assert value is not None and value < limit, (sig, value)
        for pid in (*sc.labels.resolved, *sc.labels.ended):
            _moved_and_came_back(prom, sc, catalog[pid], end)
        return
    playbook = catalog[sc.labels.expect[0]]
    moved = []
    for cond in playbook.signature.all:
        if cond.shape not in ("rises", "falls", "rises_by") or cond.over:
            continue
        now, then = _at(prom, cond.signal, end), _at(prom, cond.signal, before)
        assert now is not None and then is not None, (cond.signal, now, then)
        if cond.shape == "falls":
            assert now < then, (cond.signal, then, now)
        else:
            assert now > then, (cond.signal, then, now)
        moved.append(cond.signal)
    if not moved:  # levels only (e.g. the target is down): check they hold at the end
        for cond in playbook.signature.all:
            assert _at(prom, cond.signal, end) is not None, cond.signal


def _moved_and_came_back(prom, sc, playbook, end: float) -> None:
    """An incident that ended: each rising or falling signal of its playbook moved between
    the first timeline change and the last (the recovery), and is back at the end."""
    start = end - sc.duration
    onset = min(c.at for m in sc.models for c in m.timeline)
    recovery = max(c.at for m in sc.models for c in m.timeline)
    then, during = start + onset - 60, start + recovery - 60
    for cond in playbook.signature.all:
        if cond.shape not in ("rises", "falls", "rises_by") or cond.over:
            continue
        values = [_at(prom, cond.signal, t) for t in (then, during, end)]
        assert None not in values, (cond.signal, values)
        before, mid, after = values
        sign = -1 if cond.shape == "falls" else 1
        assert sign * (mid - before) > 0 and sign * (mid - after) > 0, (cond.signal, values)


def test_a_restart_with_a_longer_max_model_len_exposes_the_new_token_buckets(tmp_path):
    text = SMALL.format(version="0.33").replace(
        "    workload:",
        "    timeline: [{at: 4m, set: {engine.max_model_len: 65536}}]\n    workload:",
    )
    sc = load_scenario(_write(tmp_path, text))
    om = "".join(iter_openmetrics(simulate(sc, end=1_800_000_000.0)))
    prompt = [ln for ln in om.splitlines() if ln.startswith("vllm:request_prompt_tokens_bucket")]
    assert any('le="20000.0"' in ln for ln in prompt)  # before: up to 32768
    assert any('le="50000.0"' in ln for ln in prompt)  # after the restart: up to 65536
    for le in ("20000.0", "50000.0", "+Inf"):  # each bucket's samples stay in time order
        times = [float(ln.rsplit(" ", 1)[1]) for ln in prompt if f'le="{le}"' in ln]
        assert times == sorted(times)


def test_held_out_variants_change_seed_onset_magnitude_and_names():
    base = library.find("retrieval-launch")
    v1, v2 = library.find("retrieval-launch~1"), library.find("retrieval-launch~2")
    assert {v1.name, v2.name} == {"retrieval-launch~1", "retrieval-launch~2"}
    assert len({base.seed, v1.seed, v2.seed}) == 3
    assert v1.models[0].version == "0.8" and v2.models[0].version == base.models[0].version
    (b,), (c1,), (c2,) = (m.models[0].timeline for m in (base, v1, v2))
    assert c1.at < b.at < c2.at
    old = base.models[0].workload.prompt.median
    new = b.set["workload.prompt.median"]
    assert c1.set["workload.prompt.median"] == pytest.approx(old + (new - old) * 0.8, rel=0.01)
