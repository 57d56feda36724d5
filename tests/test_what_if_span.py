"""What part of a window what-if replays, and how its arrivals are replayed: the steadiest
quarter hour at the incident's load, the bursts the counts show kept, counting noise taken
out; and what a refusal says may let the replay match."""

from __future__ import annotations

import numpy as np

from diagnoser.whatif.calibrate import REMEDY, remedies
from diagnoser.whatif.fit import SPAN, steady_part
from diagnoser.whatif.replay import smooth

STEP = 60.0
K = round(SPAN / STEP)


def test_the_span_is_the_steadiest_quarter_hour_at_the_incidents_load():
    rng = np.random.default_rng(5)
    # 20 quiet minutes, a 10-minute ramp, 30 minutes at the peak; the queue builds through
    # the ramp and the peak's first minutes, then holds.
    rates = np.concatenate([np.full(20, 2.0), np.linspace(2, 8, 10), np.full(30, 8.0)])
    rates = rates + rng.normal(0, 0.1, rates.size)
    held = np.concatenate([np.full(30, 50.0), np.linspace(50, 900, 10), np.full(21, 900.0)])
    lo, hi = steady_part(rates, held, STEP)
    assert hi - lo == K and lo >= 40  # at the peak, after the queue stopped building
    # The quiet start is the steadiest of all, and not the incident: never chosen.
    assert steady_part(np.concatenate([np.full(30, 2.0), rates[30:]]), held, STEP)[0] >= 30
    # A window no longer than the span is replayed whole.
    assert steady_part(rates[:K], held[: K + 1], STEP) == (0, K)


def test_bursts_the_counts_show_are_kept_and_counting_noise_is_taken_out():
    rng = np.random.default_rng(7)
    steady = rng.poisson(5.0 * STEP, 60) / STEP
    assert np.std(smooth(steady, STEP)) < 0.5 * np.std(steady)
    # Twice the rate for two minutes in seven: the counts' spread is far beyond chance.
    burst = np.where(np.arange(60) % 7 < 2, 10.0, 5.0)
    bursty = rng.poisson(burst * STEP) / STEP
    kept = smooth(bursty, STEP)
    assert np.corrcoef(kept, burst)[0, 1] > 0.95 and kept.max() > 9.0
    # Four steps cannot tell bursts from chance: averaged, as before.
    few = smooth(bursty[:4], 90.0)
    assert np.ptp(few) < np.ptp(bursty[:4])


def test_what_may_let_a_refused_replay_match_is_said_once_for_each_kind_of_figure():
    assert remedies(["ttft_p95", "waiting"]) == [REMEDY["queue"]]
    assert remedies(["kv_usage", "preemptions_per_second", "itl_p95"]) == [
        REMEDY["cache"],
        REMEDY["decode"],
    ]
