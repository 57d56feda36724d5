"""The diagnosis window: the period asked about, its baseline, and the query resolution."""

from __future__ import annotations

import math
from dataclasses import dataclass

from diagnoser.plumbing.durations import parse_seconds

MAX_STEP_POINTS = 1500  # per series per query: plenty for shapes, far below Prometheus's cap
MIN_STEP = 15.0
# The step is fitted to the window: at least this many points inside it (onsets dated to a
# sixtieth of the window, and a phase of eight steps is enough to see), and no coarser than a
# quarter of the rate window, so that consecutive rates overlap and no sample goes unread.
# A 15 s step under 5 m rates makes the store read every sample twenty times; an hour's window
# at 60 s reads each about five times, a quarter of the samples, for the same curves.
MIN_WINDOW_POINTS = 60
# Rates and quantiles are read over an eighth of the window, five minutes at most and a few
# scrapes at least (as Grafana's $__rate_interval): a window of minutes after an incident
# reads its own minutes, not five minutes that reach back into the incident. Windows of 40
# minutes and more keep five minutes, where a quiet server's quantiles have requests enough.
RATE_SHARE, MAX_RATE = 8, 300
SCRAPES_PER_RATE = 4
DEFAULT_SCRAPE = 15.0  # seconds, where the data does not say
MIN_STEP_FITTED = 1.0  # a window fitted to fast scrapes may be read finer than ``MIN_STEP``


def rate_seconds(since: float, step: float, scrape: float | None = None) -> int:
    """The rate window for a window ``since`` long read every ``step`` seconds."""
    lo = SCRAPES_PER_RATE * (scrape or DEFAULT_SCRAPE)
    return int(max(4 * step, min(MAX_RATE, max(lo, since / RATE_SHARE))))


def rate_text(seconds: int) -> str:
    return f"{seconds // 60}m" if seconds % 60 == 0 else f"{seconds}s"


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    baseline_start: float
    baseline_end: float
    step: float
    rate_window: str
    # The rate window was given (``with_step``), not fitted to the window and its scrapes.
    rate_given: bool = False
    # The targets' scrape interval in seconds, once read (``fitted``).
    scrape: float | None = None

    @classmethod
    def plan(cls, since: float, end: float, baseline_offset: float | None = None) -> Window:
        """The window ``[end - since, end]`` and its baseline.

        By default the baseline is the period of the same length just before the window; with
        ``baseline_offset`` (e.g. one day) it is the window shifted back by that much.
        """
        start = end - since
        if baseline_offset:
            b_start, b_end = start - baseline_offset, end - baseline_offset
        else:
            b_start, b_end = start - since, start
        total = end - min(b_start, start)
        step = max(MIN_STEP, math.ceil(total / MAX_STEP_POINTS / MIN_STEP) * MIN_STEP)
        rate = rate_seconds(since, step)
        fitted = math.floor(min(since / MIN_WINDOW_POINTS, rate / 4) / MIN_STEP) * MIN_STEP
        step = max(step, fitted)
        return cls(start, end, b_start, b_end, step, rate_text(rate))

    def fitted(self, scrape: float | None) -> Window:
        """This window with its rates fitted to the scrape interval (seconds; None: unknown),
        unless they were given."""
        from dataclasses import replace

        if self.rate_given or scrape is None:
            return self if scrape is None else replace(self, scrape=scrape)

        since, step = self.end - self.start, self.step
        rate = rate_seconds(since, step, scrape)
        fine = rate_seconds(since, MIN_STEP_FITTED, scrape)
        if step <= MIN_STEP and fine < rate:
            # A short window over fast scrapes: read finer, on the scrapes' grid, so that
            # consecutive rates still overlap. The step is whole seconds: an interval read
            # from a count of samples (300 s / 21) is a fraction, which Prometheus refuses.
            step = float(max(MIN_STEP_FITTED, round(max(scrape, fine / 4 // scrape * scrape))))
            rate = max(fine, int(4 * step))
        return replace(self, step=step, rate_window=rate_text(rate), scrape=scrape)

    def rated_at_least(self, seconds: float) -> Window:
        """This window with rates over ``seconds`` at least (a recording rule's five
        minutes), unless they were given."""
        if self.rate_given or seconds <= parse_seconds(self.rate_window):
            return self
        from dataclasses import replace

        return replace(self, rate_window=rate_text(int(seconds)))

    def with_step(self, step: float) -> Window:
        """This window at another resolution, rates over four steps (for fast scrapes and
        windows of minutes, where the planned 15 s step and 5 m rates are too coarse)."""
        from dataclasses import replace

        return replace(self, step=step, rate_window=f"{max(2, round(4 * step))}s", rate_given=True)

    @property
    def span(self) -> tuple[float, float]:
        return (self.start, self.end)

    @property
    def baseline(self) -> tuple[float, float]:
        return (self.baseline_start, self.baseline_end)

    @property
    def first(self) -> float:
        """The earliest time the diagnosis reads: the baseline's or the window's start, moved
        back onto the grid of steps that ends at ``end``. A range query is evaluated at
        ``first``, ``first + step``, ...; on this grid its last point is the window's end,
        where otherwise (a long window's step of hours) it could fall a step short and miss
        data that ends there."""
        earliest = min(self.baseline_start, self.start)
        steps = math.ceil((self.end - earliest) / self.step - 1e-9)
        return self.end - steps * self.step
