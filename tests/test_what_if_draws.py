"""A short window replayed with several draws: pooled figures, their chance spread, and the
calibration and bands that take it into account; the speed fit's targets (means)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from diagnoser.whatif import replay as rp
from diagnoser.whatif.calibrate import (
    NOISE_Z,
    REMEDY,
    TOLERANCE,
    Fitting,
    calibrate,
    gap,
    judge,
)
from diagnoser.whatif.fit import EngineCache, Fit
from diagnoser.whatif.predict import band
from diagnoser.whatif.stats import (
    QUANTILES,
    Buckets,
    LogNormal,
    Observed,
    fit_lognormal,
    pooled,
    quantile,
)
from lab.real import whatif as lab

BOUNDS = np.array([0.1, 0.2, 0.5, 1.0, 2.0, 5.0])
SLO = (1.0, 0.1)


def _observed(ttft_counts: list[float], kv: float, preemptions: float) -> Observed:
    """A window of 100 s whose TTFTs fall in the buckets as counted (the last: over 5 s)."""
    cum = np.cumsum(np.array(ttft_counts, dtype=np.float64))
    ttft = Buckets(BOUNDS, cum, float(cum[-1]) * 0.4)
    itl = Buckets(BOUNDS, np.cumsum([50.0, 40, 10, 0, 0, 0, 0]), 8.0)
    prefill = Buckets(BOUNDS, np.cumsum([5.0, 5, 0, 0, 0, 0, 0]), 1.5)
    return Observed(ttft, itl, kv, preemptions, 0.0, 10.0, 500.0, 100.0, prefill)


def test_pooled_draws_add_up_and_a_quantile_is_the_median_of_the_draws():
    calm = _observed([0, 5, 5, 0, 0, 0, 0], 0.3, 0.0)
    calm2 = _observed([0, 4, 6, 0, 0, 0, 0], 0.4, 1.0)
    stormy = _observed([0, 0, 2, 2, 2, 2, 2], 0.5, 8.0)  # a queue that ran away in this draw
    both = pooled([calm, calm2, stormy])
    assert both.seconds == 300.0 and both.finished == 30.0
    assert both.ttft.count == 30 and both.preemptions == 9.0
    assert both.kv_usage == pytest.approx(0.4)
    assert both.prefill is not None and both.prefill.count == 30
    figures = both.figures(*SLO)
    # The TTFT p95 is the median draw's, not the pooled tail (the stormy draw's alone).
    per = sorted(quantile(p.ttft, 0.95) or 0.0 for p in (calm, calm2, stormy))
    assert figures["ttft_p95"] == pytest.approx(per[1])
    assert quantile(both.ttft, 0.95) > 2 * figures["ttft_p95"]
    # Rates are pooled: 9 preemptions in 300 s.
    assert figures["preemptions_per_second"] == pytest.approx(0.03)
    # The chance spread is the draws' standard deviation, for every figure with a value.
    noise = both.noise(*SLO)
    assert noise["ttft_p95"] == pytest.approx(float(np.std(per, ddof=1)))
    assert noise["kv_usage"] == pytest.approx(0.1)
    assert set(noise) >= set(QUANTILES)


def test_one_draw_is_itself_and_has_no_spread():
    one = _observed([0, 5, 5, 0, 0, 0, 0], 0.3, 0.0)
    assert pooled([one]) is one
    assert all(v is None for v in one.noise(*SLO).values())


def _fit(finished: float, seconds: float = 300.0) -> Fit:
    measured = dataclasses.replace(_observed([0, 5, 5, 0, 0, 0, 0], 0.3, 0.0), finished=finished)
    return Fit(
        model="tiny-llama", start=0.0, end=seconds, rate_step=60.0,
        rates=np.full(int(seconds // 60), finished / seconds),
        prompt=LogNormal(32, 0.3), output=LogNormal(150, 0.3), length_share=0.0,
        prefix_hit=None, instances=1, engines=1,
        cache=EngineCache(100, 32, 0.1, "auto", True), measured=measured,
    )  # fmt: skip


def test_a_window_of_few_requests_is_drawn_again_until_enough_are_replayed():
    assert rp.draws(_fit(200)) == rp.MAX_DRAWS  # 200 requests: 10 draws wanted, 8 at most
    assert rp.draws(_fit(500)) == 4
    assert rp.draws(_fit(rp.DRAW_REQUESTS)) == 1
    assert rp.draws(_fit(0)) == rp.MAX_DRAWS


def test_a_short_windows_replay_pools_its_draws_each_from_the_same_warm_up():
    setup = lab.setup(lab.find("kv-room"))
    fit = _fit(250)
    cfg, _ = rp.baseline(fit, setup)
    got = rp.replay(fit, setup, cfg)
    assert len(got.parts) == rp.draws(fit) == 8
    assert got.seconds == pytest.approx(8 * fit.seconds)
    # The draws differ (other arrivals and lengths), and each is a whole window.
    finished = [p.finished for p in got.parts]
    assert len(set(finished)) > 1 and all(150 < f < 350 for f in finished)
    # Replaying again gives the same draws: two configurations see the same requests.
    again = rp.replay(fit, setup, cfg)
    assert [p.finished for p in again.parts] == finished


def test_chance_widens_the_calibrations_tolerance_and_no_further():
    # 2.0 against 3.4 is 70% off: beyond the tolerance, within twice a spread of 1.0.
    assert gap("ttft_p95", 3.4, 2.0) == (pytest.approx(0.7), False)
    assert gap("ttft_p95", 3.4, 2.0, noise=1.0) == (pytest.approx(0.7), True)
    assert gap("ttft_p95", 3.4, 2.0, noise=0.6) == (pytest.approx(0.7), False)
    assert NOISE_Z == 2.0 and TOLERANCE == 0.30


def test_a_refusal_says_how_far_chance_reaches():
    setup = lab.setup(lab.find("kv-room"))
    cfg, _ = rp.baseline(_fit(250), setup)
    figures = {"ttft_p50": 0.2, "ttft_p95": 0.5, "itl_p50": 0.05, "itl_p95": 0.1,
               "kv_usage": 0.4, "preemptions_per_second": 0.0, "waiting": 0.0}  # fmt: skip
    got = {**figures, "ttft_p95": 3.0}
    noise = {name: None for name in figures} | {"ttft_p95": 0.4}
    cal = judge(cfg, setup.gpu, 1.0, 1.0, got, figures, 1, noise)
    assert not cal.ok
    assert "ttft p95 3 against 0.5 (+500%), chance ±0.8" in (cal.reason or "")
    assert (cal.reason or "").endswith("what may let it match: " + REMEDY["queue"])
    assert cal.noise["ttft_p95"] == 0.4
    ok = judge(cfg, setup.gpu, 1.0, 1.0, {**figures, "ttft_p95": 1.2}, figures, 1, noise)
    assert ok.ok, ok.reason


def test_a_predictions_band_is_never_narrower_than_chance():
    assert band("ttft_p95", 0.1, True, 10.0) == pytest.approx(1.0)
    assert band("ttft_p95", 0.1, True, 10.0, noise=2.0) == pytest.approx(4.0)
    assert band("ttft_p95", 0.1, True, 10.0, noise=0.1) == pytest.approx(1.0)


def test_the_speed_fit_follows_the_mean_prefill_time_where_the_server_has_it():
    setup = lab.setup(lab.find("kv-room"))
    cfg, _ = rp.baseline(_fit(250), setup)
    want = {"ttft_p50": 0.2, "prefill_mean": 0.10, "itl_mean": 0.05}
    fitting = Fitting(cfg, setup.gpu, want)
    # The TTFT medians agree, but the replay prefills 1.5 times as slowly: prefill is fitted.
    step = fitting.next((1.0, 1.0), {"ttft_p50": 0.2, "prefill_mean": 0.15, "itl_mean": 0.05})
    assert step == (1.5, 1.0)
    # Without the server's prefill time the TTFT median is all there is (here: agreed).
    alone = Fitting(cfg, setup.gpu, {"ttft_p50": 0.2, "prefill_mean": None, "itl_mean": 0.05})
    assert alone.next((1.0, 1.0), {"ttft_p50": 0.2, "prefill_mean": 0.15, "itl_mean": 0.05}) is None


def test_a_window_on_the_edge_of_overload_says_so():
    from diagnoser.whatif.predict import _knife_edge

    setup = lab.setup(lab.find("kv-room"))
    cfg, _ = rp.baseline(_fit(250), setup)
    figures = {"ttft_p50": 1.0, "ttft_p95": 5.0, "itl_p50": 0.05, "itl_p95": 0.1,
               "kv_usage": 0.8, "preemptions_per_second": 0.5, "waiting": 3.0}  # fmt: skip
    calm = judge(cfg, setup.gpu, 1.0, 1.0, figures, figures, 1, {"ttft_p50": 0.2})
    assert _knife_edge(calm) == []
    edge = judge(cfg, setup.gpu, 1.0, 1.0, figures, figures, 1, {"ttft_p50": 9.0})
    (note,) = _knife_edge(edge)
    assert "±18 s around 1 s" in note and "edge of overload" in note


# vLLM's ITL bounds from a decode step's time to a prefill's.
ITL_BOUNDS = np.array([0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0])


def _tokens(slow_share: float) -> Observed:
    """10,000 tokens of decode steps (50-75 ms), ``slow_share`` of them behind a prefill step
    (0.5-0.75 s), as the lab's server gave them under KV pressure."""
    slow = 10_000 * slow_share
    itl = Buckets(ITL_BOUNDS, np.cumsum([0, 0, 10_000 - slow, 0, 0, 0, 0, 0, 0, slow, 0, 0.0]))
    ttft = Buckets(BOUNDS, np.cumsum([10.0, 20, 40, 20, 10, 0, 0]))
    return Observed(ttft, itl, 0.5, 0.0, 0.0, 250.0, 10_000.0, 360.0)


def test_a_quantile_on_a_knee_says_how_far_a_point_of_slow_tokens_moves_it():
    from diagnoser.whatif.figures import knee_lines
    from diagnoser.whatif.predict import SHARE, knees

    # The replay's 4.8% of slow tokens read ITL p95 off a decode step; the server's 5.4% off a
    # prefill step: seven times as long, for 0.6 points of the tokens.
    replayed, server = _tokens(0.048), _tokens(0.054)
    p, truth = replayed.figures(*SLO)["itl_p95"], server.figures(*SLO)["itl_p95"]
    assert p is not None and truth is not None
    assert p <= 0.075 and truth >= 0.5
    lo, hi = replayed.either_side(SHARE)["itl_p95"]
    assert lo <= p and hi >= truth
    predicted, bands = replayed.figures(*SLO), {"itl_p95": 0.01, "ttft_p95": 0.1}
    on = knees(predicted, bands, replayed.either_side(SHARE))
    assert on["itl_p95"] == (lo, hi)
    # The TTFTs spread evenly over their buckets, and one slow token in a hundred: no knee.
    calm = _tokens(0.01)
    assert knees(calm.figures(*SLO), bands, calm.either_side(SHARE)) == {}
    # Said in words; and a measured figure between the knee's values is within what was said.
    (line,) = knee_lines({"itl_p95": [lo, hi]}, "num_gpu_blocks:x0.3")
    assert line.startswith("ITL p95 of num_gpu_blocks:x0.3 sits on a knee: ")
    c = lab.Compared("x", "", {"itl_p95": p}, {"itl_p95": truth}, None, {"itl_p95": 0.01})
    assert c.in_band("itl_p95") is False
    c.knee = {"itl_p95": [lo, hi]}
    assert c.in_band("itl_p95") is True


def test_a_one_draw_replay_that_misses_is_judged_beside_a_second_draw():
    setup = lab.setup(lab.find("kv-room"))
    today, _ = rp.baseline(_fit(250), setup)
    measured = _observed([0, 5, 5, 0, 0, 0, 0], 0.3, 0.0)
    stormy = _observed([0, 0, 2, 2, 2, 2, 2], 0.3, 0.0)  # the same speeds, a queue that ran away

    # Another draw as calm as the window: chance alone spans the miss, and it is no refusal.
    cal, got = calibrate(today, setup.gpu, measured, lambda _: stormy, SLO, lambda _: measured)
    assert cal.ok and cal.replays == 2 and len(got.parts) == 2
    assert cal.noise["ttft_p95"] and cal.noise["ttft_p95"] > 0
    # Another draw as stormy: chance does not reach the window, and the refusal says so.
    cal, _ = calibrate(today, setup.gpu, measured, lambda _: stormy, SLO, lambda _: stormy)
    assert not cal.ok and cal.replays == 2 and "ttft p95" in (cal.reason or "")
    # A replay that matches at once is not drawn again.
    cal, _ = calibrate(today, setup.gpu, measured, lambda _: measured, SLO, lambda _: stormy)
    assert cal.ok and cal.replays == 1


def _two_classes(n: int, seed: int) -> Buckets:
    """Lengths of chat turns of about 500 tokens with one in five a document of about 2,500,
    counted into vLLM's 1-2-5 buckets."""
    rng = np.random.default_rng(seed)
    x = rng.lognormal(np.log(500), 0.5, n)
    docs = rng.random(n) < 0.2
    x[docs] = rng.lognormal(np.log(2500), 0.25, int(docs.sum()))
    bounds = np.array([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000], float)
    cum = np.array([(x <= b).sum() for b in bounds] + [n], dtype=np.float64)
    return Buckets(bounds, cum, float(x.sum()))


def test_lengths_a_log_normal_fits_only_loosely_are_drawn_in_the_histograms_shares():
    hist = _two_classes(20_000, seed=4)
    shape = fit_lognormal(hist)
    assert shape.error > 0.03  # one log-normal, a few points off at a bound
    drawn = rp.lengths(shape, hist, top=8191)
    assert isinstance(drawn, rp.Measured)
    x = drawn.sample(np.random.default_rng(0), 50_000)
    alone = rp.Lengths(shape.median, shape.sigma).sample(np.random.default_rng(0), 50_000)
    docs = float(hist.cumulative[11] - hist.cumulative[10]) / hist.count  # (2000, 5000]
    assert np.mean((x > 2000) & (x <= 5000)) == pytest.approx(docs, abs=0.01)
    assert abs(np.mean((alone > 2000) & (alone <= 5000)) - docs) > 0.05  # the tail it spreads
    assert np.mean(x) == pytest.approx(hist.mean, rel=0.03)
    assert x.max() <= 8191  # none past the longest the server takes
    # A log-normal within chance of its histogram is the lengths replayed, as it was.
    few = _two_classes(150, seed=5)
    assert type(rp.lengths(fit_lognormal(few), few, top=8191)) is rp.Lengths
