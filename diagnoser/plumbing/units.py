"""Numbers as people read them: milliseconds below a second, percentages for ratios."""

from __future__ import annotations

import math


class AtLeast(float):
    """A number known only from below: a quantile that fell in a histogram's +Inf bucket,
    which Prometheus reports as the top finite bound. Shown as ``≥ 2,000``."""


def fmt(v: float | None, unit: str) -> str:
    """``0.074`` s -> ``74 ms``; ``0.35`` ratio -> ``35.0%``; ``7494`` tokens -> ``7,494``;
    an :class:`AtLeast` with ``≥`` before it."""
    if isinstance(v, AtLeast):
        return "≥ " + fmt(float(v), unit)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if unit == "ratio":
        return f"{v:.1%}" if abs(v) < 10 else f"{v:.1f}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"
