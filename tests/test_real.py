"""Incidents reproduced on a real vLLM server (vLLM's CPU build, ``fixtures/real/``), as
recorded by ``make real-record`` into ``tests/data/real/``: ``diagnose`` must name each
incident's playbook first over its last phase, give the verdict it names, and find nothing
over the baseline before it. The answers are replayed, so this runs in seconds; one test
backfills an incident's raw samples into a real Prometheus and diagnoses it again, so the
recording holds what Prometheus scraped and not only what was asked of it."""

from __future__ import annotations

import pytest

from lab.real import incident as incidents
from lab.real.outcome import summary
from lab.real.record import DATA
from lab.real.replayed import provenance, recorded, replayed

RECORDED = [d.name for d in recorded()]
# Incidents whose files exist but which no run has recorded yet: make real-record records
# them (about 17 minutes each on two cores). Listed, so that none drops out unseen.
NOT_YET_RECORDED: set[str] = set()
# Recorded incidents that diagnose still gets wrong, with why. Each is a strict xfail: when a
# change fixes it, the test fails until it is taken off this list.
KNOWN_MISSES: dict[str, str] = {}


def _known(name: str) -> object:
    reason = KNOWN_MISSES.get(name)
    return (
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else name
    )


def test_every_incident_is_recorded_or_listed_as_not_yet():
    assert sorted({*RECORDED, *NOT_YET_RECORDED}) == incidents.names()
    assert not NOT_YET_RECORDED & set(RECORDED), "recorded now: take it off the list"
    assert set(KNOWN_MISSES) <= set(RECORDED)


@pytest.mark.parametrize("name", RECORDED)
def test_the_recording_keeps_its_provenance(name):
    prov = provenance(DATA / name)
    inc = incidents.find(name)
    assert prov["vllm"].startswith("0.32"), prov["vllm"]
    assert prov["expect"] == (inc.expect or "none") and prov["health"] == inc.health
    assert prov["scrape_interval"] == "5s"
    assert [p["name"] for p in prov["phases"]] == [p.name for p in inc.phases]
    assert all(p["start"].endswith("Z") and p["end"].endswith("Z") for p in prov["phases"])
    assert "--load-format" in prov["vllm_args"] and prov["startup_seconds"]
    idle = (DATA / name / "metrics-idle.txt").read_text()
    assert "vllm:num_requests_running" in idle and "vllm:cache_config_info" in idle


@pytest.mark.parametrize("name", [_known(n) for n in RECORDED])
def test_diagnose_names_the_incident_first(name, site):
    inc = incidents.find(name)
    first, confidence, verdict, reasons = summary(replayed(DATA / name, "incident", site))
    assert first == inc.expect, f"{name}: first finding {first} ({confidence}), {reasons}"
    if inc.health != "any":
        assert verdict == inc.health, f"{name}: {verdict}: {reasons}"
    if inc.health_reason:
        assert any(inc.health_reason in r for r in reasons), f"{name}: {reasons}"


@pytest.mark.parametrize("name", RECORDED)
def test_the_baseline_before_it_has_no_finding(name, site):
    result = replayed(DATA / name, "baseline", site)
    inc = incidents.find(name)
    built_in = inc.baseline_expect
    if built_in is None:
        assert [f.playbook.id for f in result.findings] == []
        if inc.baseline_health != "any":
            verdicts = [h.verdict for h in result.health]
            assert verdicts == [inc.baseline_health], [h.reasons for h in result.health]
    else:  # the finding its traffic is built to give, alone, and no worse
        assert [f.playbook.id for f in result.findings] == [built_in]
        reasons = [r for h in result.health for r in h.reasons]
        assert all(r.startswith(("abnormal state", "a known pattern")) for r in reasons), reasons


@pytest.mark.parametrize("name", RECORDED)
def test_a_status_never_answered_is_a_share_of_zero_not_missing_data(name, site):
    """vLLM's API server creates ``http_requests_total{status="4xx"}`` at its first 4xx: on
    a server that never refused anything the family is there (2xx) and the 4xx share is 0, so
    context-length-rejections is decided, never undecided for want of a series."""
    for which in ("baseline", "incident"):
        result = replayed(DATA / name, which, site)
        undecided = {u.playbook.id: u.reason for u in result.undecided}
        assert "context-length-rejections" not in undecided, (which, undecided)


@pytest.mark.promtool
def test_the_raw_samples_diagnose_the_same_in_a_real_prometheus(tmp_path, site):
    """The recorded samples, backfilled with promtool into a real Prometheus, give the first
    finding the recorded answers give (a steady incident: there a crash's samples would linger
    for the lookback)."""
    import shutil

    from lab.real.outcome import diagnosed
    from lab.real.record import raw_prometheus
    from lab.replay import Replay

    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    name = "prompt-length-shift" if "prompt-length-shift" in RECORDED else RECORDED[0]
    meta = Replay(DATA / name / "incident.json.gz").meta
    with raw_prometheus(DATA / name, tmp_path) as prom:
        result, _ = diagnosed(prom.url, site, meta["since"], meta["end"])
    assert summary(result)[0] == summary(replayed(DATA / name, "incident", site))[0]


@pytest.mark.promtool
def test_a_change_in_the_second_half_of_a_long_window_is_found(tmp_path, site):
    """max_tokens 512 -> 16 over the window's last five minutes, the warm-up and a healthy
    baseline before it inside the window (and nothing before the window): the minutes before
    the change are its reference, so the truncation is found whatever the window's length."""
    import shutil

    from lab.real.outcome import diagnosed
    from lab.real.record import raw_prometheus
    from lab.replay import Replay

    if not shutil.which("promtool"):
        pytest.skip("promtool is not installed")
    name = "max-tokens-truncation"
    end = Replay(DATA / name / "incident.json.gz").meta["end"]
    with raw_prometheus(DATA / name, tmp_path) as prom:
        for since in (600.0, 1200.0):
            result, _ = diagnosed(prom.url, site, since, end)
            first, _, verdict, reasons = summary(result)
            assert (first, verdict) == (name, "unhealthy"), (since, first, reasons)
