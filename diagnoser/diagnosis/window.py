"""The diagnosis window: the period asked about, its baseline, and the query resolution."""

from __future__ import annotations

import math
from dataclasses import dataclass

MAX_STEP_POINTS = 1500  # per series per query: plenty for shapes, far below Prometheus's cap
MIN_STEP = 15.0
# The step is fitted to the window: at least this many points inside it (onsets dated to a
# sixtieth of the window, and a phase of eight steps is enough to see), and no coarser than a
# quarter of the rate window, so that consecutive rates overlap and no sample goes unread.
# A 15 s step under 5 m rates makes the store read every sample twenty times; an hour's window
# at 60 s reads each about five times, a quarter of the samples, for the same curves.
MIN_WINDOW_POINTS = 60


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    baseline_start: float
    baseline_end: float
    step: float
    rate_window: str

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
        rate = max(300, int(4 * step))
        fitted = math.floor(min(since / MIN_WINDOW_POINTS, rate / 4) / MIN_STEP) * MIN_STEP
        step = max(step, fitted)
        return cls(
            start, end, b_start, b_end, step, f"{rate // 60}m" if rate % 60 == 0 else f"{rate}s"
        )

    def with_step(self, step: float) -> Window:
        """This window at another resolution, rates over four steps (for fast scrapes and
        windows of minutes, where the planned 15 s step and 5 m rates are too coarse)."""
        from dataclasses import replace

        return replace(self, step=step, rate_window=f"{max(2, round(4 * step))}s")

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
