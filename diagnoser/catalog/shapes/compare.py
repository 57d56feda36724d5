"""rises, falls, flat, rises_by, falls_by: a summary of *now* against one of the *baseline*."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from diagnoser.catalog.shapes.base import (
    ConditionLike,
    Data,
    Periods,
    Shape,
    Verdict,
    log_margin,
    subject,
    summarise,
    value_text,
    values,
)


def compare(
    shape: str, threshold: float, base: np.ndarray, now: np.ndarray, stat: str, floor: float | None
) -> Verdict:
    b, n = summarise(base, stat), summarise(now, stat)
    if b is None or n is None:
        which = "baseline" if b is None else "now"
        return Verdict.undecided(f"too few samples ({which})")
    nums = {"baseline": b, "now": n}
    if shape == "rises_by":
        delta = n - b
        nums["delta"] = delta
        return Verdict(delta >= threshold, nums, float(np.clip(delta / threshold - 1, 0, 1)))
    if shape == "falls_by":
        drop = b - n
        nums["delta"] = -drop
        return Verdict(drop >= threshold, nums, float(np.clip(drop / threshold - 1, 0, 1)))
    denom = max(b, floor) if floor is not None else b
    if denom <= 0:
        if shape == "rises":
            return Verdict(n > 0, nums, 1.0 if n > 0 else 0.0, "from zero")
        if shape == "flat":
            return Verdict(n <= 0, nums, 1.0 if n <= 0 else 0.0)
        return Verdict(False, nums, note="nothing to fall from")
    ratio = n / denom
    nums["ratio"] = ratio
    if shape == "rises":
        return Verdict(ratio >= threshold, nums, log_margin(ratio, threshold))
    if shape == "falls":
        inverse = 1 / ratio if ratio > 0 else math.inf
        return Verdict(ratio <= threshold, nums, log_margin(inverse, 1 / threshold))
    if shape == "flat":
        dev = abs(ratio - 1)
        return Verdict(dev <= threshold, nums, float(np.clip(1 - dev / threshold, 0, 1)))
    raise ValueError(shape)


def opposite(
    shape: str, threshold: float, numbers: Mapping[str, float], floor: float | None
) -> bool:
    """The change went the other way by as much as the condition asks for: a fall to
    1/value or below where a rise of value is required (and the reverse), a drop of value or
    more where a rise by value is. Below ``floor`` a level counts as the floor (noise)."""
    b, n = numbers.get("baseline"), numbers.get("now")
    if b is None or n is None:
        return False
    if shape == "rises_by":
        return n - b <= -threshold
    if shape == "falls_by":
        return n - b >= threshold
    if floor is not None:
        b, n = max(b, floor), max(n, floor)
    if b <= 0:
        return False  # from zero nothing falls, and a rise from zero is no contradiction
    if shape == "rises":
        return n <= b / threshold
    if shape == "falls":
        return n >= b / threshold
    return False  # flat has no direction


class _Compare(Shape):
    modifiers: ClassVar[frozenset[str]] = frozenset({"floor"})
    relative: ClassVar[bool] = True

    def contradicts(self, cond: ConditionLike, verdict: Verdict) -> bool:
        if verdict.holds is not False:
            return False
        return opposite(self.name, float(cond.value), verdict.numbers, cond.floor)

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        base, now = values(data, cond, p.baseline), values(data, cond, p.now)
        return compare(self.name, float(cond.value), base, now, cond.stat, cond.floor)

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        name, unit = (subject(cond), "") if cond.over else (cond.signal, unit)
        r = numbers.get("ratio")
        # A now that is a lower bound (a quantile in the +Inf bucket) makes a lower bound of
        # the ratio too.
        at_least = "≥ " if type(numbers.get("now")).__name__ == "AtLeast" else ""
        ratio = f" ({at_least}x{r:.1f})" if r not in (None, 0) else ""
        base, now = value_text(numbers.get("baseline"), unit), value_text(numbers.get("now"), unit)
        return f"{name} {base} -> {now}{ratio}"


class Rises(_Compare):
    name = "rises"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 1,
        "description": "now / baseline >= value",
    }

    def describe(self, cond: ConditionLike) -> str:
        return f"rises >= {cond.value}x"


class Falls(_Compare):
    name = "falls"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 0,
        "exclusiveMaximum": 1,
        "description": "now / baseline <= value",
    }

    def describe(self, cond: ConditionLike) -> str:
        return f"falls to <= {cond.value}x"


class Flat(_Compare):
    name = "flat"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 1,
        "description": "|now / baseline - 1| <= value",
    }

    def describe(self, cond: ConditionLike) -> str:
        return f"stays within \u00b1{float(cond.value):.0%}"


class RisesBy(_Compare):
    name = "rises_by"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "now - baseline >= value (absolute, for shares)",
    }

    def describe(self, cond: ConditionLike) -> str:
        return f"rises by >= {cond.value}"


class FallsBy(_Compare):
    name = "falls_by"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "baseline - now >= value (absolute, for shares)",
    }

    def describe(self, cond: ConditionLike) -> str:
        return f"falls by >= {cond.value}"
