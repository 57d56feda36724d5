"""What every shape shares: its verdict, the periods it compares, the data it reads, and the
numeric helpers.

Periods: *baseline* is the reference before the change, *now* the part of the window after
it, *window* the whole diagnosis window. A shape returns a ``Verdict``: whether it holds
(``None`` when the data cannot say), the numbers that decided it, and how far past its
threshold it is (``margin``, 0..1), which feeds the confidence.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from diagnoser.plumbing.units import fmt

STATS: dict[str, Callable[[np.ndarray], float]] = {
    "median": lambda a: float(np.median(a)),
    "mean": lambda a: float(np.mean(a)),
    "max": lambda a: float(np.max(a)),
    "min": lambda a: float(np.min(a)),
    "p90": lambda a: float(np.percentile(a, 90)),
    "last": lambda a: float(a[-1]),
}
MIN_POINTS = 3  # fewer samples in a period than this and the shape is undecided
Span = tuple[float, float]


@dataclass
class Verdict:
    holds: bool | None
    numbers: dict[str, float] = field(default_factory=dict)
    margin: float = 0.0
    note: str = ""

    @classmethod
    def undecided(cls, note: str) -> Verdict:
        return cls(None, note=note)


@dataclass(frozen=True)
class Periods:
    """``now`` runs from the onset to the end of the incident: the window's end while it
    lasts, else ``end``, where the pattern stopped holding (what follows is its recovery)."""

    baseline: Span
    now: Span
    window: Span
    onset: float | None
    end: float | None = None


class ConditionLike(Protocol):
    """What a shape reads of a playbook's condition (``catalog.model.Condition`` is one): so
    the shapes name no model, and the model asks them to describe its conditions."""

    @property
    def signal(self) -> str: ...

    @property
    def value(self) -> float | str: ...

    @property
    def over(self) -> str | None: ...

    @property
    def held(self) -> float | None: ...

    @property
    def stat(self) -> str: ...

    @property
    def floor(self) -> float | None: ...

    @property
    def min_corr(self) -> float | None: ...

    @property
    def exponent(self) -> float | None: ...


class Series(Protocol):
    t: np.ndarray
    v: np.ndarray


class Data(Protocol):
    """One scope's series by signal name; per-class signals keep one series per class."""

    @property
    def series(self) -> Mapping[str, Series]: ...

    @property
    def classes(self) -> Mapping[str, Mapping[str, Series]]: ...

    @property
    def smoothing(self) -> float:
        """Seconds of the rate window the series were read with (0: unknown)."""
        ...


def finite(a: np.ndarray) -> np.ndarray:
    out: np.ndarray = a[np.isfinite(a)]
    return out


def summarise(values: np.ndarray, stat: str) -> float | None:
    v = finite(values)
    if v.size < MIN_POINTS:
        return None
    return float(STATS[stat](v))


def episodes(values: np.ndarray) -> int:
    """How many separate times the series turns from zero (or no value) to above zero: for
    a count over a sliding rate window (``changes(...[5m])``), how many distinct events it saw,
    however long each stays counted. A missing sample counts as zero."""
    if values.size == 0:
        return 0
    on = np.nan_to_num(values, nan=0.0) > 0
    return int(on[0]) + int(np.sum(on[1:] & ~on[:-1]))


def events(values: np.ndarray) -> int:
    """How many events a count over a sliding window (``changes(...[5m])``, the worst
    instance's) saw: every rise adds what it rose by, so a count that goes 1, 2, 3 saw three
    restarts, one that stays at 1 for five minutes saw one, and a count already up when the
    window opens saw that many. A missing sample (a scrape gap) repeats the one before it."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return 0
    known = np.isfinite(v)
    if not known.any():
        return 0
    idx = np.where(known, np.arange(v.size), 0)
    filled = v[np.maximum.accumulate(idx)]
    filled[: int(np.argmax(known))] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # 1e308 - (-1e308): infinitely many
        rises = np.diff(filled, prepend=0.0)
        return whole(float(np.clip(rises, 0, None).sum()))


# More events, targets or restarts than any fleet has: a count past it (a sum that overflowed
# to infinity on values of 1e308) is said as this many, not turned into an integer that fails.
MOST_COUNTED = 10**12


def whole(count: float) -> int:
    """A count read from series as a whole number: rounded, at least 0 and at most
    ``MOST_COUNTED`` (an infinite count is the most); NaN counts nothing."""
    if math.isnan(count):
        return 0
    return round(min(max(count, 0.0), float(MOST_COUNTED)))


def log_margin(ratio: float, threshold: float) -> float:
    """0 at the threshold, 1 when the ratio is the threshold squared (in log terms)."""
    if ratio <= 0 or threshold <= 0 or threshold == 1:
        return 0.0
    return float(np.clip(math.log(ratio) / math.log(threshold) - 1, 0, 1))


def share_margin(share: float, held: float) -> float:
    return float(np.clip((share - held) / max(1e-9, 1 - held), 0, 1))


def sliced(s: Series, span: Span) -> np.ndarray:
    mask = (s.t >= span[0]) & (s.t <= span[1])
    out: np.ndarray = s.v[mask]
    return out


def values(data: Data, cond: ConditionLike, span: Span) -> np.ndarray:
    """The condition's subject over ``span``: the signal, or its ratio to ``over``."""
    s = data.series[cond.signal]
    if not cond.over:
        return sliced(s, span)
    o = data.series[cond.over]
    common, ia, ib = np.intersect1d(s.t, o.t, return_indices=True)
    keep = (common >= span[0]) & (common <= span[1])
    with np.errstate(divide="ignore", invalid="ignore"):
        out: np.ndarray = s.v[ia][keep] / o.v[ib][keep]
    return out


class Shape:
    """One shape of the signature language: its schema, evaluation, description and
    evidence text together. Subclasses set the class attributes and the three methods."""

    name: ClassVar[str]
    # JSON schema of the shape's value (the number or name after its key).
    value_schema: ClassVar[dict[str, Any]]
    # Optional keys the shape accepts besides signal, over, stat, weight, why, instead, param.
    modifiers: ClassVar[frozenset[str]] = frozenset()
    required: ClassVar[frozenset[str]] = frozenset()
    # Whether the value is a threshold number (an alert parameter can be bound to it).
    numeric: ClassVar[bool] = True
    # Whether it reads one series per class (e.g. per prompt_bucket) of its signal.
    per_class: ClassVar[bool] = False
    # Whether it compares *now* with the baseline (and so needs one).
    relative: ClassVar[bool] = False

    def needs(self, cond: ConditionLike) -> tuple[str, ...]:
        """Signals the condition reads: its signal, ``over``, and any the shape names."""
        return (cond.signal, *((cond.over,) if cond.over else ()))

    def describe(self, cond: ConditionLike) -> str:
        raise NotImplementedError

    def contradicts(self, cond: ConditionLike, verdict: Verdict) -> bool:
        """Whether a verdict that fails shows the subject moving clearly the other way from
        what the condition asks (a rise required, a fall as large seen), not merely too
        little, or no change. Only a shape that compares two periods can say so."""
        return False

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        raise NotImplementedError

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        raise NotImplementedError


def subject(cond: ConditionLike) -> str:
    return f"{cond.signal} / {cond.over}" if cond.over else cond.signal


def value_text(v: float | None, unit: str) -> str:
    return fmt(v, unit)
