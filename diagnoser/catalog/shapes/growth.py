"""grows_with: how a value grows across numeric classes (e.g. TTFT by prompt length)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from diagnoser.catalog.shapes.base import (
    ConditionLike,
    Data,
    Periods,
    Shape,
    Verdict,
    sliced,
    summarise,
)
from diagnoser.metrics.buckets import class_size


def grows_with(exponent: float, classes: dict[str, float]) -> Verdict:
    """Log-log slope of a value across numeric classes (e.g. TTFT by prompt bucket)."""
    points: list[tuple[float, float]] = []
    for label, value in classes.items():
        size = class_size(label)
        if size and value > 0:
            points.append((size, value))
    if len(points) < 3:
        return Verdict.undecided("fewer than three classes with data")
    x = np.log(np.array([p[0] for p in points]))
    y = np.log(np.array([p[1] for p in points]))
    # The slope over the longest classes is what matters: superlinearity shows at length.
    order = np.argsort(x)
    x, y = x[order][-3:], y[order][-3:]
    slope = float(np.polyfit(x, y, 1)[0])
    return Verdict(
        slope >= exponent, {"exponent": slope}, float(np.clip((slope - exponent) / exponent, 0, 1))
    )


class GrowsWith(Shape):
    name = "grows_with"
    value_schema: ClassVar[dict[str, Any]] = {
        "type": "string",
        "description": "label whose numeric classes the signal is compared across "
        "(e.g. prompt_bucket)",
    }
    modifiers: ClassVar[frozenset[str]] = frozenset({"exponent"})
    required: ClassVar[frozenset[str]] = frozenset({"exponent"})
    numeric: ClassVar[bool] = False
    per_class: ClassVar[bool] = True

    def describe(self, cond: ConditionLike) -> str:
        return f"grows faster than {cond.value} (exponent >= {cond.exponent})"

    def evaluate(self, cond: ConditionLike, data: Data, p: Periods) -> Verdict:
        medians = {}
        for label, s in data.classes.get(cond.signal, {}).items():
            v = summarise(sliced(s, p.now), "median")
            if v is not None:
                medians[label] = v
        return grows_with(float(cond.exponent or 1.0), medians)

    def evidence(self, cond: ConditionLike, numbers: Mapping[str, float | None], unit: str) -> str:
        e = numbers.get("exponent")
        return f"{cond.signal} grows with exponent {e:.2f}" if e is not None else cond.signal
