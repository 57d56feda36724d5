"""Incidents end: the change points that split a window, the end of a finding, what a frozen
engine's counters are taken for, the state at the window's end, and rates that fit a short
window."""

import numpy as np
import pytest

from diagnoser.diagnosis.ends import judge
from diagnoser.diagnosis.frozen import freezes, thawed
from diagnoser.diagnosis.health import assess, present
from diagnoser.diagnosis.match import ScopeData
from diagnoser.diagnosis.onset import change_point, change_points
from diagnoser.diagnosis.window import Window
from diagnoser.plumbing.source import Series

rng = np.random.default_rng(3)
STEP = 15.0
T = np.arange(0, 7200, STEP)


def noisy(v: np.ndarray, sd: float = 0.05) -> np.ndarray:
    return v * (1 + sd * rng.standard_normal(v.size))


def test_a_window_with_an_incident_and_its_recovery_has_both_changes():
    v = noisy(np.where((T >= 4000) & (T < 5500), 0.1, 0.9))
    cps = change_points(Series({}, T, v), (0, 7200))
    assert len(cps) == 2
    assert cps[0] == pytest.approx(4000, abs=30) and cps[1] == pytest.approx(5500, abs=30)


def test_the_strongest_change_is_still_the_first_split():
    v = noisy(np.where(T < 5000, 600.0, 7000.0))
    s = Series({}, T, v)
    assert change_point(s, (0, 7200)) in change_points(s, (0, 7200))


def test_noise_after_a_step_is_no_second_change():
    v = noisy(np.where(T < 5000, 1.0, 3.0), sd=0.1)
    assert len(change_points(Series({}, T, v), (0, 7200))) == 1


def collapse(recovered_at: float | None) -> ScopeData:
    """A prefix cache that hit 90% and fell to 5% at 4,000 s (and came back at
    ``recovered_at``), with steady prompts."""
    hit = np.where(T >= 4000, 0.05, 0.9)
    if recovered_at is not None:
        hit = np.where(recovered_at <= T, 0.9, hit)
    series = {
        "prefix_cache_hit_rate": Series({}, T, noisy(hit, 0.02)),
        "prompt_tokens_per_request": Series({}, T, noisy(np.full(T.size, 3000.0), 0.02)),
        "request_rate": Series({}, T, noisy(np.full(T.size, 2.5), 0.02)),
    }
    return ScopeData({"model_name": "m"}, series)


def test_a_collapse_that_lasts_is_current(catalog):
    m = judge(catalog["prefix-cache-collapse"], collapse(None), (3600, 7200), (0, 3600), STEP)
    assert m.status == "matched" and m.current
    assert m.onset == pytest.approx(4000, abs=30)


def test_a_collapse_that_was_rolled_back_is_resolved_with_its_own_evidence(catalog):
    m = judge(catalog["prefix-cache-collapse"], collapse(6000), (3600, 7200), (0, 3600), STEP)
    assert m.status == "matched" and not m.current
    assert m.onset == pytest.approx(4000, abs=30) and m.end == pytest.approx(6000, abs=30)
    drop = next(r for r in m.results if r.condition.signal == "prefix_cache_hit_rate")
    # The collapse alone, not averaged with its recovery into a weaker one.
    assert drop.verdict.numbers["now"] == pytest.approx(0.05, abs=0.01)


def test_an_incident_between_baseline_and_recovery_is_found_though_the_recovery_is_larger(
    catalog,
):
    # The recovery is the strongest change of the window: the collapse is found before it.
    hit = np.where((T >= 5000) & (T < 5600), 0.3, 0.9)
    data = collapse(None)
    data.series["prefix_cache_hit_rate"] = Series({}, T, noisy(hit, 0.02))
    m = judge(catalog["prefix-cache-collapse"], data, (3600, 7200), (0, 3600), STEP)
    assert m.status == "matched"
    assert m.onset == pytest.approx(5000, abs=30) and m.end == pytest.approx(5600, abs=30)


def hung(thawed_at: float) -> ScopeData:
    """An engine frozen from 3,000 s to ``thawed_at``: its counters stop, the hit rate read
    over the freeze is what it was before, the running gauge stays at 4."""
    frozen = (T >= 3000) & (thawed_at > T)
    series = {
        "stalled_engines": Series({}, T, np.where(frozen, 1.0, 0.0)),
        "requests_running": Series({}, T, np.where(frozen, 4.0, noisy(np.full(T.size, 3.0)))),
        "prefix_cache_hit_rate": Series({}, T, np.where(frozen, 0.4, 0.9)),
        "requests_waiting": Series({}, T, np.where(frozen, 160.0, 0.0)),
    }
    data = ScopeData({"model_name": "m"}, series)
    data.smoothing = 60.0
    return data


def test_frozen_counters_are_no_data_while_the_engine_is_stopped():
    data = hung(4000)
    assert freezes(data) == [(3000 - 60, 3990 + 60)]  # the last stalled sample at 3,990 s
    out = thawed(data)
    inside = (T >= 2940) & (T <= 4050)
    assert np.isnan(out.series["prefix_cache_hit_rate"].v[inside]).all()
    assert np.isnan(out.series["requests_waiting"].v[inside]).all()
    assert not np.isnan(out.series["prefix_cache_hit_rate"].v[~inside]).any()
    # What tells a hang stays.
    for kept in ("requests_running", "stalled_engines"):
        assert np.array_equal(out.series[kept].v, data.series[kept].v)


def test_an_engine_that_never_stalled_is_read_as_it_is():
    data = hung(0)
    assert thawed(data) is data


def test_the_present_is_the_windows_last_minutes():
    assert present((0, 3600), 300) == (3000, 3600)  # two 5 m rates
    assert present((0, 360), 45) == (270, 360)  # a quarter of a short window
    assert present((0, 60), 300) == (0, 60)  # never more than the window


def test_the_verdict_is_the_state_at_the_windows_end(site):
    # TTFT met by 20% of requests for the window's first half, by all in its last minutes.
    good = np.where(T < 5400, 0.2, 1.0)
    series = {
        "request_rate": Series({}, T, np.full(T.size, 2.0)),
        "ttft_slo_attainment": Series({}, T, good),
    }
    data = ScopeData({"model_name": "m"}, series)
    data.smoothing = 300.0
    h = assess(site, data, (3600, 7200), (0, 3600))
    assert h.verdict == "healthy", h.reasons
    assert any("recovered" in n for n in h.notes)
    ttft = next(s for s in h.slis if s.name == "ttft")
    assert ttft.good == pytest.approx(0.6, abs=0.01) and ttft.now == pytest.approx(1.0)
    # Still bad at the end: unhealthy, with the window's share beside the present's.
    data.series["ttft_slo_attainment"] = Series({}, T, np.where(T < 5400, 1.0, 0.2))
    h = assess(site, data, (3600, 7200), (0, 3600))
    assert h.verdict == "unhealthy"
    assert "at the window's end" in h.reasons[0] and "over the window" in h.reasons[0]


@pytest.mark.parametrize(
    ("since", "scrape", "rate", "step"),
    [(360, 5.0, "45s", 10), (300, 5.0, "37s", 5), (600, 15.0, "75s", 15), (360, 30.0, "2m", 15),
     (3600, 5.0, "5m", 60), (1200, None, "150s", 15), (86400, 5.0, "8m", 120)],
)  # fmt: skip
def test_rates_fit_the_window_and_the_scrapes(since, scrape, rate, step):
    w = Window.plan(since, 1_700_000_000.0).fitted(scrape)
    assert (w.rate_window, w.step) == (rate, step)
    assert w.step <= float(w.rate_window[:-1]) * (60 if w.rate_window[-1] == "m" else 1) / 4
    assert Window.plan(since, 1_700_000_000.0).with_step(5).fitted(scrape).rate_window == "20s"


def test_the_lookback_reads_a_short_window_through_its_own_rates():
    from diagnoser.diagnosis.lookback import plan

    short = Window.plan(240, 1_700_000_000.0).fitted(5.0)
    assert short.rate_window == "30s"
    assert plan(short, 4200).rate_window == "1m"  # four of its 15 s steps, not five minutes
    # A day back is read a minute apart: its rates span four steps at least.
    assert plan(short, 86400).rate_window == "4m"
    hour = Window.plan(3600, 1_700_000_000.0).fitted(15.0)
    assert plan(hour, 86400).rate_window == "5m"


def test_the_health_line_says_the_end_first_where_it_disagrees_with_the_window():
    from diagnoser.diagnosis.health import Sli
    from diagnoser.report.format import _sli

    recovered = Sli("ttft", 0.613, 0.99, 1.0, (), now=1.0)
    assert _sli(recovered) == "TTFT<=1s 100.0% now, 61.3% over the window (SLO 99%)"
    steady = Sli("ttft", 0.995, 0.99, 1.0, (), now=0.993)
    assert _sli(steady) == "TTFT<=1s 99.5% (SLO 99%)"


def test_a_hang_too_short_for_a_change_point_ends_where_it_last_held(catalog):
    # Nine stalled samples in a twenty-minute window: no change point dates it, yet it held
    # a tenth of the window, and stopped eight minutes before its end.
    t = np.arange(0, 2400, STEP)
    stalled = ((t >= 1500) & (t < 1635)).astype(float)
    series = {
        "stalled_engines": Series({}, t, stalled),
        "requests_running": Series({}, t, np.full(t.size, 2.0)),
        "generation_tokens_rate": Series({}, t, np.where(stalled > 0, 0.0, 60.0)),
    }
    data = ScopeData({"model_name": "m"}, series)
    m = judge(catalog["engine-hang"], data, (1200, 2400), (0, 1200), STEP)
    assert m.status == "matched" and not m.current
    assert (m.onset, m.end) == (1500, 1635)
    assert m.lasting is not None and m.lasting.current  # what it is while still unhealthy


def test_a_diagnosis_read_from_the_recording_rules_keeps_their_five_minutes():
    w = Window.plan(1800, 1_700_000_000.0).fitted(15.0)
    assert w.rate_window == "225s" and w.rated_at_least(300).rate_window == "5m"
    hour = Window.plan(3600, 1_700_000_000.0)
    assert hour.rated_at_least(300) is hour
