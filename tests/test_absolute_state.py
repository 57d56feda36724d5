"""A playbook's absolute state against the window's change, and restarts counted as restarts:
synthetic series with known answers, judged as diagnose judges them."""

from __future__ import annotations

import numpy as np
import pytest

from diagnoser.catalog.loader import with_param
from diagnoser.diagnosis.match import ScopeData, evaluate, evaluate_absolute
from diagnoser.plumbing.source import Series

STEP = 15.0
BASELINE, WINDOW = (0.0, 900.0), (900.0, 1800.0)  # a 15-minute window and its baseline
grid = np.arange(0.0, 1800.0 + STEP, STEP)
SCOPE = {"model_name": "m"}
# The state stands: found, alone or with a look-alike it cannot be told from here.
STANDS = ("matched", "contested")


def series(before: float, after: float, at: float = 1000.0) -> Series:
    return Series(dict(SCOPE), grid, np.where(grid < at, before, after))


def data(**signals: Series) -> ScopeData:
    return ScopeData(dict(SCOPE), dict(signals))


def judge(pb, d: ScopeData):
    change = evaluate(pb, d, WINDOW, BASELINE, STEP)
    return change, evaluate_absolute(pb, d, WINDOW, change)


# --- the absolute state and the change that contradicts it ------------------------------------


def truncated(tokens_after: float, length_before: float = 0.02) -> ScopeData:
    """Answers cut at max_tokens from t=1000: the length share 2% -> 84%, with output tokens
    per request going from 135 to ``tokens_after``."""
    return data(
        finished_length_share=series(length_before, 0.84),
        generation_tokens_per_request=series(135.0, tokens_after),
        max_tokens_per_request=series(2048.0, 16.0),
    )


def test_an_absolute_state_is_ruled_out_when_the_change_that_began_it_contradicts_it(catalog):
    """Clients lowered max_tokens to 16: most answers end on length, but they got ten times
    shorter, where stop-token-mismatch requires them to grow."""
    pb = catalog["stop-token-mismatch"]
    change, state = judge(pb, truncated(tokens_after=15.0))
    assert change.status == "not_matched"
    assert state.status == "ruled_out" and state.basis == "absolute"
    assert state.contradiction is not None
    assert state.contradiction.condition.signal == "generation_tokens_per_request"
    assert "contradicts" in state.reason and "135 -> 15" in state.reason
    # --explain shows the absolute state that held and the required change that contradicts it.
    groups = {(r.group, r.verdict.holds) for r in state.results}
    assert ("absolute", True) in groups and ("all", False) in groups
    # Without the window's verdict (no change known) the state alone is still reported
    # (contested: answers at the cap point to max-tokens-truncation as well).
    assert evaluate_absolute(pb, truncated(tokens_after=15.0), WINDOW).status in STANDS


def test_a_change_too_small_or_absent_does_not_contradict_the_state(catalog):
    pb = catalog["stop-token-mismatch"]
    for after in (135.0, 150.0):  # flat, or up but less than 1.5x: not the other way
        change, state = judge(pb, truncated(tokens_after=after))
        assert change.status == "not_matched"
        assert state.status in STANDS and state.contradiction is None


def test_over_a_baseline_already_in_the_state_the_change_says_nothing(catalog):
    """The state held before the window too (an incident older than the window): the change
    within it compares sick with sick and does not rule the state out."""
    pb = catalog["stop-token-mismatch"]
    change, state = judge(pb, truncated(tokens_after=15.0, length_before=0.84))
    assert change.status == "not_matched"
    assert state.status in STANDS


def test_without_a_baseline_to_compare_the_state_stands(catalog):
    """Series that begin with the window: the change is undecided, never a contradiction."""
    pb = catalog["stop-token-mismatch"]
    late = grid >= WINDOW[0]
    d = ScopeData(
        dict(SCOPE),
        {
            name: Series(dict(SCOPE), s.t[late], s.v[late])
            for name, s in truncated(tokens_after=15.0).series.items()
        },
    )
    change, state = judge(pb, d)
    assert change.status != "matched"
    assert state.status in STANDS and state.contradiction is None


# --- restarts: one is a deploy, two are a loop ------------------------------------------------


def restarts(*at: float) -> Series:
    """A changes(process_start_time_seconds[5m]) count: 1 for five minutes after each."""
    v = np.zeros(grid.size)
    for t in at:
        v[(t <= grid) & (grid < t + 300)] += 1
    return Series(dict(SCOPE), grid, v)


def served(*at: float) -> ScopeData:
    zero = series(0.0, 0.0)
    down = np.zeros(grid.size)
    for t in at:
        down[(t - 60 <= grid) & (grid < t)] = 1  # down for the minute the model loads
    return data(
        engine_restarts=restarts(*at),
        targets_down=Series(dict(SCOPE), grid, down),
        http_5xx_share=zero,
        finished_error_share=zero,
        api_server_cpu=series(0.05, 0.05),
        # DCGM is scraped: the playbook requires the GPU's memory to be read at all.
        gpu_memory_used_share=series(0.5, 0.5),
    )


def test_one_restart_in_a_short_window_is_not_a_restart_loop(catalog):
    pb = catalog["gpu-memory-contention"]
    change, state = judge(pb, served(1050.0))
    assert change.status == "not_matched" and change.reason == "none of its alternatives holds"
    assert state.status == "not_matched"


def test_two_restarts_in_a_short_window_are_a_loop_whatever_the_error_counters_say(catalog):
    pb = catalog["gpu-memory-contention"]
    change, state = judge(pb, served(1050.0, 1470.0))
    assert change.status == "matched" and state.status == "matched"
    held = {(r.group, r.condition.describe()) for r in change.held()}
    assert ("any", "engine_restarts counts >= 2 events in the window") in held


def test_one_restart_that_lost_requests_is_a_crash(catalog):
    pb = catalog["gpu-memory-contention"]
    d = served(1050.0)
    d.series["http_5xx_share"] = series(0.0, 0.05)
    assert evaluate(pb, d, WINDOW, BASELINE, STEP).status == "matched"


def test_the_restart_threshold_is_one_parameter_for_the_alert_and_the_signature(catalog):
    pb = catalog["gpu-memory-contention"]
    assert pb.alert is not None and pb.alert.params["restarts"] == 2
    changed = with_param(pb, "restarts", 3)
    assert changed.signature is not None
    bound = [c for c in changed.signature.conditions() if c.param == "restarts"]
    assert [c.value for c in bound] == [3, 3]  # in `any` and in `absolute`
    assert changed.alert is not None and changed.alert.params["restarts"] == 3


@pytest.mark.parametrize("times", [(1050.0,), (1050.0, 1470.0)])
def test_restarts_are_counted_alike_by_health_and_the_playbook(site, times):
    from diagnoser.diagnosis.health import assess

    d = served(*times)
    h = assess(site, d, WINDOW, BASELINE)
    pb = site.catalog["gpu-memory-contention"]
    change = evaluate(pb, d, WINDOW, BASELINE, STEP)
    (counted,) = {r.verdict.numbers["events"] for r in change.results if r.group == "all"}
    assert h.restarts == counted == len(times)
