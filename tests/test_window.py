"""The query resolution a diagnosis window plans: what the store is asked to read."""

import pytest

from diagnoser.diagnosis.window import MAX_STEP_POINTS, MIN_WINDOW_POINTS, Window

END = 1_700_000_000.0
SPANS = [300, 600, 1200, 1800, 2700, 3600, 2 * 3600, 6 * 3600, 86400, 3 * 86400, 30 * 86400]


def seconds(rate_window: str) -> float:
    return float(rate_window[:-1]) * (60 if rate_window.endswith("m") else 1)


@pytest.mark.parametrize("since", SPANS)
@pytest.mark.parametrize("offset", [None, 86400.0])
def test_every_sample_is_read_and_the_window_keeps_its_points(since, offset):
    w = Window.plan(since, END, offset)
    rate = seconds(w.rate_window)
    assert w.step % 15 == 0 and w.step >= 15
    assert w.step <= rate / 4  # consecutive rates overlap: no sample falls between them
    if offset is None:  # (a baseline a day back puts the day between in the query's range)
        assert since / w.step >= min(MIN_WINDOW_POINTS, since / 15)  # onsets dated finely
    assert (w.end - w.first) / w.step <= MAX_STEP_POINTS + 1


def test_an_hour_is_read_at_a_minute_and_short_windows_at_the_scrape_step():
    # An hour and its baseline at 15 s steps under 5 m rates read every sample twenty times;
    # at 60 s steps five times, for the same 5 m curves.
    assert (Window.plan(3600, END).step, Window.plan(3600, END).rate_window) == (60.0, "5m")
    assert Window.plan(1200, END).step == 15.0
    assert Window.plan(600, END).step == 15.0
    assert Window.plan(86400, END).rate_window == "8m"  # long windows keep their rate


def test_a_step_asked_for_overrides_the_plan():
    w = Window.plan(3600, END).with_step(5)
    assert (w.step, w.rate_window) == (5, "20s")


def test_a_short_window_fitted_to_a_measured_scrape_interval_is_read_at_whole_seconds():
    # 15 s scrapes counted over 5 minutes: 21 samples, an interval of 14.29 s.
    w = Window.plan(300, END).fitted(300 / 21)
    assert w.step == 14.0 and f"{w.step:g}s" == "14s"
    assert w.step <= seconds(w.rate_window) / 4
