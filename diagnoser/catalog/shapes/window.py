"""Shapes over the whole window: a steady drift, spikes, a plateau at a ceiling, two signals
moving together, and events that recur."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from diagnoser.catalog.shapes.base import (
    MIN_POINTS,
    ConditionLike,
    Data,
    Periods,
    Shape,
    Verdict,
    events,
    finite,
    log_margin,
    share_margin,
    subject,
    value_text,
    values,
)
from diagnoser.plumbing.durations import format_duration

# A drift is told from a step only over a window of several rate windows.
DRIFT_SPANS = 3


def drifts(threshold: float, t: np.ndarray, v: np.ndarray, floor: float | None) -> Verdict:
    """A steady trend: a line fitted over the window ends ``threshold`` times its start."""
    mask = np.isfinite(v)
    t, v = t[mask], v[mask]
    if v.size < 6:
        return Verdict.undecided("too few samples (window)")
    slope, intercept = np.polyfit(t - t[0], v, 1)
    fit = intercept + slope * (t - t[0])
    start, end = float(fit[0]), float(fit[-1])
    ss_res = float(((v - fit) ** 2).sum())
    ss_tot = float(((v - v.mean()) ** 2).sum()) or 1e-12
    r2 = 1 - ss_res / ss_tot
    denom = max(start, floor) if floor is not None else start
    ratio = end / denom if denom > 0 else (math.inf if end > 0 else 0.0)
    # A steady trend, not a step: the line must explain the data about as well as the best
    # single jump between two levels does.
    step_sse = _best_step_sse(v)
    steady = ss_res <= 1.5 * step_sse + 1e-12
    nums = {
        "start": start,
        "end": end,
        "ratio": ratio,
        "r2": r2,
        "line_vs_step": ss_res / step_sse if step_sse > 0 else math.inf,
    }
    return Verdict(ratio >= threshold and r2 >= 0.5 and steady, nums, log_margin(ratio, threshold))


def _best_step_sse(v: np.ndarray) -> float:
    """Residual sum of squares of the best two-level (one jump) fit."""
    n = v.size
    csum, csum2 = np.cumsum(v), np.cumsum(v * v)
    k = np.arange(2, n - 1)
    left = csum2[k - 1] - csum[k - 1] ** 2 / k
    right = (csum2[-1] - csum2[k - 1]) - (csum[-1] - csum[k - 1]) ** 2 / (n - k)
    return float(np.min(left + right)) if k.size else 0.0


def spikes(threshold: float, window: np.ndarray) -> Verdict:
    v = finite(window)
    if v.size < MIN_POINTS:
        return Verdict.undecided("too few samples (window)")
    med, peak = float(np.median(v)), float(v.max())
    ratio = peak / med if med > 0 else (math.inf if peak > 0 else 0.0)
    return Verdict(
        ratio >= threshold,
        {"median": med, "peak": peak, "ratio": ratio},
        log_margin(ratio, threshold),
    )


def plateau(tolerance: float, held: float, window: np.ndarray) -> Verdict:
    v = finite(window)
    if v.size < MIN_POINTS:
        return Verdict.undecided("too few samples (window)")
    top = float(v.max())
    if top <= 0:
        return Verdict(False, {"max": top, "share": 0.0})
    share = float((v >= top * (1 - tolerance)).mean())
    return Verdict(share >= held, {"max": top, "share": share}, share_margin(share, held))


def tracks(min_corr: float, a: np.ndarray, b: np.ndarray) -> Verdict:
    mask = np.isfinite(a) & np.isfinite(b)
    a, b = a[mask], b[mask]
    if a.size < 6:
        return Verdict.undecided("too few samples (window)")
    if a.std() == 0 or b.std() == 0:
        return Verdict(False, {"corr": 0.0}, note="one series is constant")
    corr = float(np.corrcoef(a, b)[0, 1])
    return Verdict(corr >= min_corr, {"corr": corr}, share_margin(corr, min_corr))


def recurs(times: float, window: np.ndarray) -> Verdict:
    """At least ``times`` events counted by a windowed count (see ``events``)."""
    if finite(window).size < MIN_POINTS:
        return Verdict.undecided("too few samples (window)")
    n = events(window)
    margin = float(np.clip((n - times) / times, 0, 1))
    return Verdict(n >= times, {"events": float(n)}, margin)


def _ratio_text(numbers: Mapping[str, float | None]) -> str:
    r = numbers.get("ratio")
    return f"x{r:.1f}" if r is not None else "x?"


class Drifts(Shape):
    name = "drifts"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 1,
        "description": "a steady trend over the window that ends at least value times where it "
        "started",
    }
    modifiers: ClassVar[frozenset[str]] = frozenset({"floor"})

    def describe(self, cond: ConditionLike) -> str:
        return f"drifts up steadily to >= {cond.value}x"

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        span = p.window[1] - p.window[0]
        if data.smoothing and span < DRIFT_SPANS * data.smoothing:
            # Read through a rate window as long as the window, a step is a straight ramp:
            # the data cannot tell a drift from a step, and saying "drift" would be a guess.
            return Verdict.undecided(
                f"a window of {format_duration(span)} read through "
                f"{format_duration(data.smoothing)} rates cannot tell a drift from a step"
            )
        s = data.series[cond.signal]
        mask = (s.t >= p.window[0]) & (s.t <= p.window[1])
        return drifts(float(cond.value), s.t[mask], values(data, cond, p.window), cond.floor)

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        unit = "" if cond.over else unit
        start, end = value_text(numbers.get("start"), unit), value_text(numbers.get("end"), unit)
        return f"{subject(cond)} drifts {start} -> {end} ({_ratio_text(numbers)})"


class Spikes(Shape):
    name = "spikes"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 1,
        "description": "short excursions: the window's peak is at least value times its median",
    }

    def describe(self, cond: ConditionLike) -> str:
        return f"spikes to >= {cond.value}x its median"

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        return spikes(float(cond.value), values(data, cond, p.window))

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        unit = "" if cond.over else unit
        peak = value_text(numbers.get("peak"), unit)
        return f"{subject(cond)} peaks at {peak} ({_ratio_text(numbers)} its median)"


class Plateau(Shape):
    name = "plateau"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 0.5,
        "description": "pinned at a ceiling: within value (relative) of the window maximum for "
        "`held` of the time",
    }
    modifiers: ClassVar[frozenset[str]] = frozenset({"held"})
    required: ClassVar[frozenset[str]] = frozenset({"held"})

    def describe(self, cond: ConditionLike) -> str:
        return f"pinned at its ceiling (within {float(cond.value):.0%})"

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        # Pinned since the change, not before it.
        return plateau(float(cond.value), float(cond.held or 0.5), values(data, cond, p.now))

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        unit = "" if cond.over else unit
        ceiling = value_text(numbers.get("max"), unit)
        share = numbers.get("share")
        held = f", {share:.0%} of the time" if share is not None else ""
        return f"{subject(cond)} pinned at its ceiling of {ceiling}{held}"


class Tracks(Shape):
    name = "tracks"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "string",
        "description": "moves with this other signal (co-occurring bursts)",
    }
    modifiers: ClassVar[frozenset[str]] = frozenset({"min_corr"})
    numeric: ClassVar[bool] = False

    def needs(self, cond: ConditionLike) -> tuple[str, ...]:
        return (*super().needs(cond), str(cond.value))

    def describe(self, cond: ConditionLike) -> str:
        return f"moves with {cond.value}"

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        this, other = data.series[cond.signal], data.series[str(cond.value)]
        common, ia, ib = np.intersect1d(this.t, other.t, return_indices=True)
        keep = (common >= p.window[0]) & (common <= p.window[1])
        return tracks(float(cond.min_corr or 0.6), this.v[ia][keep], other.v[ib][keep])

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        corr = numbers.get("corr")
        return (
            f"{cond.signal} correlates {corr:.2f} with {cond.value}"
            if corr is not None
            else (f"{cond.signal} against {cond.value}")
        )


class Recurs(Shape):
    name = "recurs"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "integer",
        "minimum": 1,
        "description": "events: a count over a sliding window (restarts in the last 5 minutes) "
        "rises by at least value in all over the window (a count that goes 1, 2 saw two "
        "restarts; one that stays at 1, however long, saw one)",
    }

    def describe(self, cond: ConditionLike) -> str:
        if float(cond.value) == 1:
            return "counts an event in the window"
        return f"counts >= {cond.value} events in the window"

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        return recurs(float(cond.value), values(data, cond, p.window))

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        n = numbers.get("events")
        if n is None:
            return subject(cond)
        return f"{subject(cond)}: {n:.0f} in the window"
