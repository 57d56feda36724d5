"""diagnose is never silent while a model is sick: each model's state first, incidents of any
age (looked for further back), restart loops, and plain words when no pattern explains it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.report import render
from diagnoser.sim import library
from diagnoser.sim.scenario import load_scenario
from diagnoser.sim.variants import aged, restart_loop
from lab import harness
from lab.promserver import Prometheus

HERE = Path(__file__).resolve().parent
SCENARIOS = {
    "aged-prompts": aged(library.find("retrieval-launch"), 2),  # began 3 h before the window
    "aged-stop-token": aged(library.find("answers-that-never-ended"), 2),  # 3 h before
    "aged-truncation": aged(library.find("max-tokens-truncation"), 2),  # 3 h before
    "loop": restart_loop(library.find("gpu-memory-contention"), 2),
    "crash": load_scenario(HERE / "scenarios" / "crash-stays-down.yaml"),
    "stopped": load_scenario(HERE / "scenarios" / "traffic-stops.yaml"),
    "healthy": library.find("healthy-steady"),
}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``served(key)`` -> (Prometheus, end) for each scenario, simulated once."""
    prepared = harness.prepare(list(SCENARIOS.values()), tmp_path_factory.mktemp("health"))
    servers: dict[str, Prometheus] = {}

    def get(key: str) -> tuple[Prometheus, float]:
        sc = SCENARIOS[key]
        if key not in servers:
            servers[key] = Prometheus(prepared[sc.name].data_dir).start()
        return servers[key], prepared[sc.name].end

    yield get
    for s in servers.values():
        s.close()


def run(served, site, key: str, **kw):
    prom, end = served(key)
    window = Window.plan(SCENARIOS[key].labels.window, end)
    return diagnose(PrometheusSource(prom.url), site, window, **kw)


@pytest.fixture(scope="module")
def strict(tmp_path_factory):
    """A site that holds TTFT to 99.5% within 1 s: retrieval-launch's longer prompts leave
    about 98.5% of first tokens within a second, a burn rate of 3 against it (1.5 against
    the default 99%, which is under the 2 that makes a model unhealthy)."""
    from diagnoser.site import Site
    from diagnoser.site.config import load_config

    path = tmp_path_factory.mktemp("strict") / "site.yaml"
    path.write_text("slo: {ttft: 0.995}\n")
    return Site.build(load_config(path), Site.default().catalog)


@pytest.mark.prometheus
def test_an_incident_that_began_hours_before_the_window_is_found_and_dated(served, strict):
    result = run(served, strict, "aged-prompts")
    top = result.findings[0]
    assert top.playbook.id == "prompt-length-shift" and top.basis == "lookback"
    before = result.window.start - top.onset
    assert 2.5 * 3600 < before < 3.5 * 3600, before
    doc = to_json(result)
    assert doc["findings"][0]["onset_before_window_seconds"] == pytest.approx(before, abs=1)
    assert doc["lookback"]["scopes"] == [top.scope]
    text = render(result, "text")
    assert "before the window" in text and "looked back 24 h" in text
    assert "No known problem pattern" not in text


@pytest.mark.prometheus
def test_without_a_lookback_an_abnormal_state_is_still_reported(served, site):
    result = run(served, site, "aged-stop-token", lookback=0)
    top = result.findings[0]
    assert top.playbook.id == "stop-token-mismatch" and top.basis == "absolute"
    assert top.confidence <= 0.6 and top.onset is None
    assert "no change found in the lookback" in render(result, "text")
    looked = run(served, site, "aged-stop-token")
    assert looked.findings[0].playbook.id == "stop-token-mismatch"
    assert looked.findings[0].basis == "lookback"


@pytest.mark.prometheus
def test_answers_cut_by_a_low_max_tokens_are_not_taken_for_an_ignored_stop_token(served, site):
    """Both states are a high length share; only the cap being the typical answer's length
    tells a lowered max_tokens from a stop token ignored, with no change to go by."""
    result = run(served, site, "aged-truncation", lookback=0)
    assert [m.playbook.id for m in result.findings] == ["max-tokens-truncation"]
    assert result.findings[0].basis == "absolute"
    stop = [m for m in result.checked if m.playbook.id == "stop-token-mismatch"]
    assert any(
        m.basis == "absolute" and m.status == "ruled_out" and "max-tokens-truncation" in m.reason
        for m in stop
    ), [(m.basis, m.status, m.reason) for m in stop]
    looked = run(served, site, "aged-truncation")
    assert looked.findings[0].playbook.id == "max-tokens-truncation"
    assert looked.findings[0].basis == "lookback"


@pytest.mark.prometheus
def test_a_lookback_longer_than_the_data_says_how_far_it_went(served, strict):
    result = run(served, strict, "aged-prompts", lookback=30 * 86400)
    assert result.reach is not None and result.reach.first_sample is not None
    assert result.reach.first_sample > result.reach.start + 86400
    assert result.findings[0].playbook.id == "prompt-length-shift"
    assert "the data goes back to" in render(result, "text")


@pytest.mark.prometheus
def test_a_restart_loop_is_a_finding_whatever_the_error_counters_say(served, site):
    result = run(served, site, "loop")
    assert result.findings[0].playbook.id == "gpu-memory-contention"
    (health,) = result.health
    assert health.verdict == "unhealthy" and health.restarts >= 5
    evidence = " ".join(result.evidence_text(r) for r in result.findings[0].held())
    assert "engine_restarts" in evidence and "targets_down" in evidence


@pytest.mark.prometheus
def test_a_server_that_died_is_reported_for_its_model(served, site):
    result = run(served, site, "crash")
    (health,) = result.health
    assert health.verdict == "unhealthy" and health.targets_down == 1
    # Down, and its downtime is unavailable: it counted no failed request, yet served nothing.
    reason, availability = health.reasons
    assert reason.startswith("1 of 1 target(s) down since ") and "after serving" in reason
    assert "would name it" in reason  # which exporter would say why, none being scraped
    assert availability.startswith("availability ") and health.slis[0].good < 0.9
    assert health.down_since is not None and health.down_since > result.window.start
    # It served before: not a server that never started (the metrics cannot say why it stays
    # down), so no playbook is named and none is offered as near.
    assert not result.findings
    text = " ".join(render(result, "text").split())
    assert "is UNHEALTHY and no known problem pattern explains it: 1 of 1 target(s) down" in text
    assert "nearest playbooks" not in text and "No known problem pattern matches" not in text
    served_flag = next(d for d in result.data.values() if "target_served" in d.series)
    assert np.nanmin(served_flag.series["target_served"].v) == 1.0


@pytest.mark.prometheus
def test_an_unexplained_sick_model_is_said_to_be_in_words_that_cannot_pass_for_healthy(
    served, site
):
    result = run(served, site, "stopped")
    (health,) = result.health
    assert health.verdict == "unhealthy" and health.stopped_at is not None
    assert not result.findings and result.idle == []
    text = " ".join(render(result, "text").split())
    assert "is UNHEALTHY and no known problem pattern explains it" in text
    assert "no requests finished at the end of the window" in text
    assert "No known problem pattern matches" not in text
    doc = json.loads(render(result, "json"))
    (h,) = doc["health"]
    assert h["verdict"] == "unhealthy" and h["cause"] == "unknown"
    assert h["traffic_stopped_at"] is not None
    assert "is unhealthy and no known problem pattern explains it" in render(result, "markdown")
    assert "is unhealthy and no known problem pattern explains it" in render(result, "html")


@pytest.mark.prometheus
def test_a_healthy_model_reports_its_slos_met(served, site):
    doc = to_json(run(served, site, "healthy"))
    (h,) = doc["health"]
    assert h["verdict"] == "healthy" and h["reasons"] == []
    assert h["targets"] == {
        "total": 2,
        "down": 0,
        "down_share": 0.0,
        "down_since": None,
        "gone_at": None,
    }
    for sli in ("availability", "ttft", "itl"):
        assert h["slo"][sli]["good_share"] >= h["slo"][sli]["objective"]
    assert doc["findings"] == [] and doc["lookback"] is None


# --- one restart is a deploy: synthetic series, judged without a Prometheus ---------------------


def _deployed(restarts: tuple[float, ...], down: tuple[float, float], ttft_good: float = 1.0):
    """A 15-minute window at 15 s (t 900-1800): 2 req/s, SLOs met unless ``ttft_good`` says
    otherwise, one target down over ``down``, a 5-minute restart count up after each restart."""
    import numpy as np

    from diagnoser.diagnosis.match import ScopeData
    from diagnoser.plumbing.source import Series

    t = np.arange(0.0, 1815.0, 15.0)
    scope = {"model_name": "m"}

    def s(v) -> Series:
        return Series(dict(scope), t, np.broadcast_to(np.asarray(v, dtype=float), t.shape).copy())

    count = np.zeros(t.size)
    for at in restarts:
        count[(at <= t) & (t < at + 300)] += 1
    return ScopeData(
        dict(scope),
        {
            "request_rate": s(2.0),
            "http_request_rate": s(2.0),
            "generation_tokens_rate": s(400.0),
            "http_5xx_share": s(0.0),
            "finished_error_share": s(0.0),
            "ttft_slo_attainment": s(ttft_good),
            "itl_slo_attainment": s(1.0),
            "targets_total": s(1.0),
            "targets_down": s(((down[0] <= t) & (t < down[1])).astype(float)),
            "engine_restarts": s(count),
        },
    )


def _assess(site, data):
    from diagnoser.diagnosis.health import assess

    return assess(site, data, (900.0, 1800.0), (0.0, 900.0))


def test_one_restart_with_a_minute_down_and_the_slos_met_is_a_deploy(site):
    from diagnoser.report.format import health_line

    h = _assess(site, _deployed((1080.0,), (1020.0, 1080.0)))
    assert h.restarts == 1 and h.down_share == pytest.approx(4 / 61, abs=0.01)
    assert h.verdict == "healthy" and h.reasons == []
    assert h.notes == ["1 restart (a deploy or a single crash, a target down 60 s), SLOs met"]
    assert "1 restart (a deploy or a single crash" in health_line(h)


def test_downtime_counts_against_availability_when_it_lasted_a_minute(site):
    """One failed scrape of a replica that serves is no outage; a target down five minutes
    is unavailable all five (the rules count it from its first minute on)."""
    from diagnoser.diagnosis.availability import all_down as _all_down

    blip = _deployed((), (1200.0, 1215.0))  # one scrape at 15 s
    assert _all_down(blip, (900.0, 1800.0)) == 0.0
    assert _assess(site, blip).slis[0].good == 1.0
    held = _deployed((), (1200.0, 1500.0))  # samples 1200..1485
    assert _all_down(held, (900.0, 1800.0)) == pytest.approx(20 / 61)
    short = _deployed((), (1200.0, 1245.0))  # down 45 s: three samples, no outage
    assert _all_down(short, (900.0, 1800.0)) == 0.0
    # At 60 s scrapes read at 15 s, one failed scrape reads down for a minute: no outage;
    # two in a row (two minutes) are one, as the recording rules count them.
    minute = _deployed((), (1200.0, 1260.0))
    assert _all_down(minute, (900.0, 1800.0)) > 0
    minute.scrape = 60.0
    assert _all_down(minute, (900.0, 1800.0)) == 0.0
    two = _deployed((), (1200.0, 1320.0))
    two.scrape = 60.0
    assert _all_down(two, (900.0, 1800.0)) == pytest.approx(8 / 61)


def test_one_restart_the_platform_explains_is_no_deploy_its_downtime_counts(site):
    from diagnoser.diagnosis.health import assess

    oom = "the kernel's OOM killer killed 1 process on its host at 00:17 (node-exporter)"
    span, base = (900.0, 1800.0), (0.0, 900.0)
    h = assess(site, _deployed((1080.0,), (1020.0, 1080.0)), span, base, oom)
    assert h.verdict == "healthy" and h.reasons == []  # back, and calm at the window's end
    assert h.notes[0] == f"a target was down 7% of the window: {oom}, none at its end"
    assert h.slis[0].good == pytest.approx(0.934, abs=0.001)  # a deploy's would read 100%
    long_down = assess(site, _deployed((1620.0,), (1260.0, 1620.0)), span, base, oom)
    assert long_down.reasons[0] == f"a target was down 39% of the window: {oom}"


def test_the_probes_failed_requests_count_against_availability_once(site):
    """Where the synthetic probe runs, what it saw fail outside the time every target was
    down counts against availability (the servers never counted a refused connection); its
    failures while every target was down are that downtime's, counted once."""
    from diagnoser.diagnosis.health import assess
    from diagnoser.plumbing.source import Series

    span, base = (900.0, 1800.0), (0.0, 900.0)
    data = _deployed((), (1200.0, 1500.0))  # every target down 1200..1485: 20 of 61 samples
    t = data.series["request_rate"].t
    down = (t >= 1200.0) & (t < 1500.0)
    alone = assess(site, data, span, base).slis[0].good
    assert alone == pytest.approx(1 - 20 / 61)
    data.series["probe_error_share"] = Series({}, t, down.astype(float))
    assert assess(site, data, span, base).slis[0].good == pytest.approx(alone)
    data.series["probe_error_share"] = Series({}, t, np.where(down, 1.0, 0.1))
    h = assess(site, data, span, base)
    assert h.probe_error_share == pytest.approx(0.1)
    assert h.slis[0].good == pytest.approx(0.9 * (1 - 20 / 61))


def test_an_eviction_whose_target_left_at_once_is_said_with_the_platforms_reason(site):
    """An evicted pod's target leaves service discovery at once (its replacement serves
    elsewhere): no downtime or restart carries the platform's reason, a note of its own
    does, and a reason where it is still going on at the window's end."""
    from diagnoser.diagnosis.health import assess

    evicted = "evicted by its node under memory pressure at 00:20 (kube-state-metrics)"
    span, base = (900.0, 1800.0), (0.0, 900.0)
    h = assess(site, _deployed((), (0.0, 0.0)), span, base, evicted)
    assert h.notes == [f"a server's target left service discovery at once: {evicted}"]
    assert h.verdict == "healthy"
    briefly = assess(site, _deployed((), (1200.0, 1245.0)), span, base, evicted)
    assert briefly.notes == [f"a target was down 45 s: {evicted}"]
    now = assess(site, _deployed((), (1785.0, 1800.0)), span, base, evicted)
    assert f"a target was down 15 s: {evicted}" in now.reasons


def test_a_restart_down_longer_than_a_model_load_or_with_slos_broken_is_unhealthy(site):
    # Four minutes down, back up in the window's last minutes: the state at its end decides.
    long_down = _assess(site, _deployed((1620.0,), (1260.0, 1620.0)))
    assert long_down.verdict == "unhealthy" and long_down.notes == []
    # Its one target down is unavailable time: the availability SLI says so.
    down, availability = long_down.reasons
    assert down == "a target was down 39% of the window"
    assert availability.startswith("availability 81.25% at the window's end")
    # Down as long, but nine minutes before the window's end: what it went through.
    recovered = _assess(site, _deployed((1260.0,), (1020.0, 1260.0)))
    assert recovered.verdict == "healthy" and recovered.reasons == []
    assert recovered.notes[0] == "a target was down 26% of the window, none at its end"
    assert all(n.endswith("recovered") for n in recovered.notes[1:])
    slow = _assess(site, _deployed((1080.0,), (1020.0, 1080.0), ttft_good=0.9))
    assert slow.verdict == "unhealthy"
    assert slow.reasons[0] == "a target was down 7% of the window"
    assert any("TTFT" in r for r in slow.reasons) and slow.notes == []


def test_two_restarts_in_a_short_window_are_unhealthy(site):
    h = _assess(site, _deployed((1080.0, 1500.0), (1020.0, 1080.0)))
    assert h.restarts == 2 and h.verdict == "unhealthy"
    assert "2 restarts in the window" in h.reasons
    assert h.notes == [
        "availability 93.44% over the window, availability 100.00% at its end: recovered"
    ]


def test_a_target_that_never_served_goes_to_the_one_model_whose_targets_left_its_job():
    from diagnoser.diagnosis.fetch import Fetched
    from diagnoser.diagnosis.health import Health
    from diagnoser.diagnosis.match import ScopeData
    from diagnoser.diagnosis.run import _heirs
    from diagnoser.diagnosis.targets import Served

    def fetched(owners: dict) -> Fetched:
        f = Fetched(owners=owners)
        for key in (*owners, ("vllm", "new-0:8000"), ("other", "new-1:8000")):
            f.targets[key] = ScopeData({"job": key[0], "instance": key[1]})
        return f

    by = ("model_name",)
    gone = Health({"model_name": "a"}, targets_gone_at=100.0)
    serving = Health({"model_name": "b"})
    one = fetched({("vllm", "old-0:8000"): Served(("a",), 90.0)})
    assert {t: s.model for t, s in _heirs(one, [gone, serving], by).items()} == {
        ("vllm", "new-0:8000"): ("a",)  # the other job's new target is not its heir
    }
    assert _heirs(one, [Health({"model_name": "a"}), serving], by) == {}  # nothing left
    two = fetched(
        {("vllm", "old-0:8000"): Served(("a",), 90.0), ("vllm", "old-1:8000"): Served(("b",), 90.0)}
    )
    gone_too = Health({"model_name": "b"}, targets_gone_at=100.0)
    assert _heirs(two, [gone, gone_too], by) == {}  # two models left the job: anyone's guess
