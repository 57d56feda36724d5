"""Signature shapes and the onset search, on synthetic series with known answers."""

from __future__ import annotations

import numpy as np
import pytest

from diagnoser.catalog.shapes.base import episodes, events
from diagnoser.catalog.shapes.compare import compare, opposite
from diagnoser.catalog.shapes.growth import grows_with
from diagnoser.catalog.shapes.level import level
from diagnoser.catalog.shapes.window import drifts, plateau, recurs, spikes, tracks
from diagnoser.diagnosis.onset import change_point, periods_for
from diagnoser.metrics.buckets import class_size
from diagnoser.plumbing.source import Series

rng = np.random.default_rng(0)


def noisy(level: float, n: int = 60, sd: float = 0.02) -> np.ndarray:
    return level * (1 + sd * rng.standard_normal(n))


def test_rises_falls_flat_compare_medians():
    assert compare("rises", 1.5, noisy(1.0), noisy(2.0), "median", None).holds
    assert not compare("rises", 1.5, noisy(1.0), noisy(1.2), "median", None).holds
    assert compare("falls", 0.5, noisy(60), noisy(8), "median", None).holds
    assert compare("flat", 0.3, noisy(0.025), noisy(0.027), "median", None).holds
    assert not compare("flat", 0.3, noisy(0.025), noisy(0.06), "median", None).holds


def test_a_floor_keeps_a_near_zero_baseline_from_inflating_a_ratio():
    base, now = noisy(0.001), noisy(0.004)
    assert compare("rises", 2, base, now, "median", None).holds
    assert not compare("rises", 2, base, now, "median", 0.01).holds


def test_rises_by_is_absolute():
    v = compare("rises_by", 0.1, noisy(0.01), noisy(0.35), "median", None)
    assert v.holds and v.numbers["delta"] == pytest.approx(0.34, abs=0.02)


def test_falls_by_is_absolute():
    v = compare("falls_by", 0.2, noisy(0.9), noisy(0.03), "median", None)
    assert v.holds and v.numbers["delta"] == pytest.approx(-0.87, abs=0.03)
    # Two thirds of a small hit rate is no absolute fall.
    assert not compare("falls_by", 0.2, noisy(0.03), noisy(0.01), "median", None).holds
    assert opposite("falls_by", 0.2, {"baseline": 0.3, "now": 0.6}, None)


def test_too_few_samples_is_undecided_not_false():
    v = compare("rises", 1.5, np.array([1.0]), noisy(2.0), "median", None)
    assert v.holds is None


def test_held_counts_the_share_of_samples_past_a_level():
    now = np.array([0.95] * 6 + [0.5] * 4)
    assert level("above", 0.9, now, "median", 0.5).holds
    assert not level("above", 0.9, now, "median", 0.7).holds


def test_a_steady_drift_is_a_drift_and_a_step_is_not():
    t = np.arange(240) * 60.0
    ramp = 2000 + 18000 * t / t[-1] + 200 * rng.standard_normal(240)
    step = np.where(t < t[120], 2000.0, 20000.0) + 200 * rng.standard_normal(240)
    assert drifts(2, t, ramp, None).holds
    assert not drifts(2, t, step, None).holds


def test_spikes_and_plateau():
    calm = noisy(0.03, 100)
    spiky = calm.copy()
    spiky[40:43] = 0.4
    assert spikes(4, spiky).holds and not spikes(4, calm).holds
    pinned = np.minimum(noisy(300, 100, 0.3), 256)
    assert plateau(0.05, 0.5, pinned).holds
    assert not plateau(0.05, 0.5, noisy(100, 100, 0.3)).holds


def test_recurs_counts_events_not_the_time_a_count_stays_up():
    # A 15-minute window at 15 s: one restart holds a 5-minute changes() count at 1 for 20
    # samples, a third of the window, which a level held for a quarter took for a loop.
    one = np.zeros(60)
    one[8:28] = 1
    assert level("above", 1, one, "median", 0.25).holds
    assert events(one) == 1
    assert recurs(1, one).holds and not recurs(2, one).holds
    two = one.copy()
    two[36:56] = 1
    v = recurs(2, two)
    assert v.holds and v.numbers == {"events": 2.0}
    # A crash loop faster than the rate window: the worst server's count climbs 1, 2, 3 and
    # never returns to zero; three restarts, not one long episode.
    loop = np.zeros(60)
    loop[5:], loop[15:], loop[25:] = 1, 2, 3
    loop[45:] = 2
    assert events(loop) == 3 and episodes(loop) == 1
    # A rolling deploy: each server restarts once, so the worst server's count stays at 1.
    rolling = one.copy()
    rolling[28:40] = 1
    assert events(rolling) == 1
    # A count already up when the window opens counts; a scrape gap repeats the sample before.
    assert events(np.array([1.0, 1, 0, np.nan, 1, 1])) == 2
    assert events(np.array([1.0, 1, np.nan, 1, 2])) == 2
    assert events(np.array([np.nan, np.nan])) == 0
    assert recurs(1, np.array([1.0])).holds is None


def test_a_change_the_other_way_contradicts_a_required_change():
    fell = {"baseline": 135.0, "now": 15.0, "ratio": 15 / 135}
    assert opposite("rises", 1.5, fell, None)
    assert not opposite("rises", 1.5, {"baseline": 135.0, "now": 120.0}, None)  # too little
    assert not opposite("rises", 1.5, {"baseline": 135.0, "now": 180.0}, None)  # right way
    assert opposite("falls", 0.5, {"baseline": 10.0, "now": 25.0}, None)
    assert opposite("rises_by", 0.1, {"baseline": 0.3, "now": 0.15}, None)
    assert not opposite("rises_by", 0.1, {"baseline": 0.3, "now": 0.25}, None)
    assert not opposite("flat", 0.3, {"baseline": 1.0, "now": 0.1}, None)
    # Under its floor a level is noise: 10 ms to 1 ms is no fall for a floor of 50 ms.
    assert not opposite("rises", 2, {"baseline": 0.01, "now": 0.001}, 0.05)
    assert not opposite("rises", 2, {"baseline": 0.0, "now": 0.0}, None)


def test_tracks_is_correlation():
    a = rng.random(100)
    assert tracks(0.6, a, 3 * a + 0.1 * rng.random(100)).holds
    assert not tracks(0.6, a, rng.random(100)).holds


def test_grows_with_fits_the_long_classes():
    linear = {"128": 0.05, "1k": 0.1, "4k": 0.4, "16k": 1.6}
    superlinear = {"128": 0.05, "1k": 0.1, "4k": 0.45, "16k": 3.2}
    assert not grows_with(1.2, linear).holds
    assert grows_with(1.2, superlinear).holds
    assert class_size("16k") == 16384 and class_size("x") is None


def test_the_onset_is_the_change_point():
    t = np.arange(0, 7200, 15.0)
    v = np.where(t < 5000, 600.0, 7000.0) * (1 + 0.05 * rng.standard_normal(t.size))
    onset = change_point(Series({}, t, v), (0, 7200))
    assert onset == pytest.approx(5000, abs=30)
    p = periods_for(Series({}, t, v), window=(3600, 7200), baseline=(0, 3600), step=15)
    # The window's part before the change is part of the reference, with the baseline.
    assert p.now[0] == pytest.approx(5000, abs=30) and p.baseline == (0, p.now[0] - 15)


def test_no_change_point_in_noise():
    t = np.arange(0, 7200, 15.0)
    assert change_point(Series({}, t, noisy(1.0, t.size, 0.05)), (0, 7200)) is None


def test_each_scope_keeps_its_own_findings(catalog):
    from diagnoser.diagnosis.match import Match
    from diagnoser.diagnosis.rank import rank

    pb = catalog["kv-cache-pressure"]
    a = Match(pb, {"model_name": "a"}, "matched", confidence=0.9)
    b = Match(pb, {"model_name": "b"}, "matched", confidence=0.8)
    crowding = Match(
        catalog["long-context-crowding"], {"model_name": "b"}, "matched", confidence=0.85
    )
    ranked = rank([a, b, crowding], catalog.advisory())
    assert [(m.playbook.id, m.scope["model_name"]) for m in ranked] == [
        ("kv-cache-pressure", "a"),
        ("long-context-crowding", "b"),
        ("kv-cache-pressure", "b"),
    ]
    assert a.explained_by is None and b.explained_by == "long-context-crowding"
    assert b.confidence == 0.4


@pytest.mark.parametrize(
    ("kv_onset", "prefix_onset", "first"),
    [
        (1000.0, 1600.0, "kv-cache-pressure"),  # the cache filled, then evicted the prefixes
        (1600.0, 1000.0, "prefix-cache-collapse"),  # the hits fell, then the cache filled
        (None, 1000.0, "kv-cache-pressure"),  # no order of events: the stronger
    ],
)
def test_of_two_that_explain_each_other_the_one_that_began_first_is_the_cause(
    catalog, kv_onset, prefix_onset, first
):
    from diagnoser.catalog.shapes.base import Periods
    from diagnoser.diagnosis.match import Match
    from diagnoser.diagnosis.rank import rank

    def match(pid, onset, confidence):
        periods = Periods((0.0, 900.0), (900.0, 3600.0), (0.0, 3600.0), onset)
        return Match(catalog[pid], {"model_name": "m"}, "matched", confidence, periods)

    kv = match("kv-cache-pressure", kv_onset, 0.8)
    prefix = match("prefix-cache-collapse", prefix_onset, 0.7)
    ranked = rank([kv, prefix], catalog.advisory())
    assert ranked[0].playbook.id == first
    assert ranked[1].explained_by == first and ranked[0].explained_by is None


# --- contested exclusions (diagnose.rank.resolve) ----------------------------------------------


def _contested_match(catalog, pid, confidence, excluded_by=None):
    """A match of ``pid`` whose exclusions pointing at ``excluded_by`` (if any) hold."""
    from diagnoser.catalog.shapes import Verdict
    from diagnoser.diagnosis.match import ConditionResult, Match

    pb = catalog[pid]
    results = []
    for cond in pb.signature.none:
        holds = excluded_by is not None and excluded_by in cond.instead
        results.append(ConditionResult(cond, "none", Verdict(holds)))
    status = "contested" if any(r.verdict.holds for r in results) else "matched"
    return Match(pb, {"model_name": "m"}, status, confidence=confidence, results=results)


def test_a_contested_exclusion_rules_out_only_when_its_alternative_is_found(catalog):
    from diagnoser.diagnosis.rank import resolve

    # prefill-interference's KV exclusion points at kv-cache-pressure
    alone = _contested_match(catalog, "prefill-interference", 0.8, "kv-cache-pressure")
    resolve([alone])
    assert alone.status == "matched" and alone.confidence == 0.6
    assert alone.caveats and "kv-cache-pressure" in alone.caveats[0]

    pi = _contested_match(catalog, "prefill-interference", 0.8, "kv-cache-pressure")
    kv = _contested_match(catalog, "kv-cache-pressure", 0.85)
    resolve([pi, kv])
    assert pi.status == "ruled_out" and "kv-cache-pressure matched" in pi.reason
    assert kv.status == "matched" and kv.confidence == 0.85

    weaker = _contested_match(catalog, "prefill-interference", 0.8, "kv-cache-pressure")
    resolve([weaker, _contested_match(catalog, "kv-cache-pressure", 0.6)])
    assert weaker.status == "matched"  # the look-alike it points at is the weaker reading
    assert weaker.caveats[0].endswith("but kv-cache-pressure matched less strongly")


def test_an_exclusion_whose_alternative_could_not_be_decided_leaves_the_match_undecided(catalog):
    """A queue that longer prompts may have made, on a server whose prompt lengths could not
    be read: queue-saturation is no likely cause, but undecided for prompt-length-shift's
    reason (the same exclusion with prompt-length-shift decided and absent is a caveat)."""
    from diagnoser.diagnosis.match import Match
    from diagnoser.diagnosis.rank import rank

    queue = _contested_match(catalog, "queue-saturation", 0.9, "prompt-length-shift")
    why = "no series"
    open_ = Match(catalog["prompt-length-shift"], {"model_name": "m"}, "undecided", reason=why)
    open_.missing = ["prompt_tokens_p50"]
    assert rank([queue, open_], catalog.advisory()) == []
    assert queue.status == "undecided" and queue.missing == ["prompt_tokens_p50"]
    assert "prompt-length-shift could not be decided: no series" in queue.reason


def test_two_playbooks_pointing_at_each_other_leave_the_stronger(catalog):
    from diagnoser.diagnosis.rank import resolve

    pi = _contested_match(catalog, "prefill-interference", 0.9, "long-request-in-batch")
    lr = _contested_match(catalog, "long-request-in-batch", 0.7, "prefill-interference")
    resolve([pi, lr])
    assert (pi.status, lr.status) == ("matched", "ruled_out")
