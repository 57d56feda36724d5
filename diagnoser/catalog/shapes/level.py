"""above, below: the level of *now*, or the share of its samples past the level (``held``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from diagnoser.catalog.shapes.base import (
    MIN_POINTS,
    STATS,
    ConditionLike,
    Data,
    Periods,
    Shape,
    Verdict,
    finite,
    share_margin,
    subject,
    value_text,
    values,
)


def level(shape: str, threshold: float, now: np.ndarray, stat: str, held: float | None) -> Verdict:
    v = finite(now)
    if v.size < MIN_POINTS:
        return Verdict.undecided("too few samples (now)")
    ok = v >= threshold if shape == "above" else v <= threshold
    if held is not None:
        share = float(ok.mean())
        return Verdict(
            share >= held, {"share": share, "now": float(np.median(v))}, share_margin(share, held)
        )
    s = float(STATS[stat](v))
    holds = s >= threshold if shape == "above" else s <= threshold
    scale = abs(threshold) or 1.0
    margin = (s - threshold) / scale if shape == "above" else (threshold - s) / scale
    return Verdict(holds, {"now": s}, float(np.clip(margin, 0, 1)))


class _Level(Shape):
    modifiers: ClassVar[frozenset[str]] = frozenset({"held"})

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        return level(self.name, float(cond.value), values(data, cond, p.now), cond.stat, cond.held)

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        unit = "" if cond.over else unit
        now = value_text(numbers.get("now"), unit)
        share = numbers.get("share")
        if share is None:
            return f"{subject(cond)} at {now}"
        return f"{subject(cond)} at {now}, {share:.0%} of the time"


class Above(_Level):
    name = "above"
    value_schema: ClassVar[dict[str, Any]] = {"type": "number", "description": "now >= value"}

    def describe(self, cond: ConditionLike) -> str:
        return f">= {cond.value}"


class Below(_Level):
    name = "below"
    value_schema: ClassVar[dict[str, Any]] = {"type": "number", "description": "now <= value"}

    def describe(self, cond: ConditionLike) -> str:
        return f"<= {cond.value}"
