"""The shapes a signature tests, on plain arrays of (time, value).

Each function returns a ``Verdict``: whether the shape holds (``None`` when the data cannot
say), the numbers that decided it, and how far past its threshold it is (``margin``, 0..1),
which feeds the confidence. Periods: *baseline* is the reference before the change, *now* the
part of the window after it, *window* the whole diagnosis window.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

STATS: dict[str, Callable[[np.ndarray], float]] = {
    "median": lambda a: float(np.median(a)),
    "mean": lambda a: float(np.mean(a)),
    "max": lambda a: float(np.max(a)),
    "min": lambda a: float(np.min(a)),
    "p90": lambda a: float(np.percentile(a, 90)),
    "last": lambda a: float(a[-1]),
}
MIN_POINTS = 3  # fewer samples in a period than this and the shape is undecided


@dataclass
class Verdict:
    holds: bool | None
    numbers: dict[str, float] = field(default_factory=dict)
    margin: float = 0.0
    note: str = ""

    @classmethod
    def undecided(cls, note: str) -> Verdict:
        return cls(None, note=note)


def _finite(a: np.ndarray) -> np.ndarray:
    out: np.ndarray = a[np.isfinite(a)]
    return out


def summarise(values: np.ndarray, stat: str) -> float | None:
    v = _finite(values)
    if v.size < MIN_POINTS:
        return None
    return float(STATS[stat](v))


def _log_margin(ratio: float, threshold: float) -> float:
    """0 at the threshold, 1 when the ratio is the threshold squared (in log terms)."""
    if ratio <= 0 or threshold <= 0 or threshold == 1:
        return 0.0
    return float(np.clip(math.log(ratio) / math.log(threshold) - 1, 0, 1))


def compare(
    shape: str, threshold: float, base: np.ndarray, now: np.ndarray, stat: str, floor: float | None
) -> Verdict:
    """rises, falls, flat, rises_by: a summary of ``now`` against one of ``base``."""
    b, n = summarise(base, stat), summarise(now, stat)
    if b is None or n is None:
        which = "baseline" if b is None else "now"
        return Verdict.undecided(f"too few samples ({which})")
    nums = {"baseline": b, "now": n}
    if shape == "rises_by":
        delta = n - b
        nums["delta"] = delta
        return Verdict(delta >= threshold, nums, float(np.clip(delta / threshold - 1, 0, 1)))
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
        return Verdict(ratio >= threshold, nums, _log_margin(ratio, threshold))
    if shape == "falls":
        inverse = 1 / ratio if ratio > 0 else math.inf
        return Verdict(ratio <= threshold, nums, _log_margin(inverse, 1 / threshold))
    if shape == "flat":
        dev = abs(ratio - 1)
        return Verdict(dev <= threshold, nums, float(np.clip(1 - dev / threshold, 0, 1)))
    raise ValueError(shape)


def level(shape: str, threshold: float, now: np.ndarray, stat: str, held: float | None) -> Verdict:
    """above / below: the level of ``now`` (or the share of its samples, with ``held``)."""
    v = _finite(now)
    if v.size < MIN_POINTS:
        return Verdict.undecided("too few samples (now)")
    ok = v >= threshold if shape == "above" else v <= threshold
    if held is not None:
        share = float(ok.mean())
        return Verdict(
            share >= held,
            {"share": share, "now": float(np.median(v))},
            float(np.clip((share - held) / max(1e-9, 1 - held), 0, 1)),
        )
    s = float(STATS[stat](v))
    holds = s >= threshold if shape == "above" else s <= threshold
    scale = abs(threshold) or 1.0
    margin = (s - threshold) / scale if shape == "above" else (threshold - s) / scale
    return Verdict(holds, {"now": s}, float(np.clip(margin, 0, 1)))


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
    return Verdict(ratio >= threshold and r2 >= 0.5 and steady, nums, _log_margin(ratio, threshold))


def _best_step_sse(v: np.ndarray) -> float:
    """Residual sum of squares of the best two-level (one jump) fit."""
    n = v.size
    csum, csum2 = np.cumsum(v), np.cumsum(v * v)
    k = np.arange(2, n - 1)
    left = csum2[k - 1] - csum[k - 1] ** 2 / k
    right = (csum2[-1] - csum2[k - 1]) - (csum[-1] - csum[k - 1]) ** 2 / (n - k)
    return float(np.min(left + right)) if k.size else 0.0


def spikes(threshold: float, window: np.ndarray) -> Verdict:
    v = _finite(window)
    if v.size < MIN_POINTS:
        return Verdict.undecided("too few samples (window)")
    med, peak = float(np.median(v)), float(v.max())
    ratio = peak / med if med > 0 else (math.inf if peak > 0 else 0.0)
    return Verdict(
        ratio >= threshold,
        {"median": med, "peak": peak, "ratio": ratio},
        _log_margin(ratio, threshold),
    )


def plateau(tolerance: float, held: float, window: np.ndarray) -> Verdict:
    v = _finite(window)
    if v.size < MIN_POINTS:
        return Verdict.undecided("too few samples (window)")
    top = float(v.max())
    if top <= 0:
        return Verdict(False, {"max": top, "share": 0.0})
    share = float((v >= top * (1 - tolerance)).mean())
    return Verdict(
        share >= held,
        {"max": top, "share": share},
        float(np.clip((share - held) / max(1e-9, 1 - held), 0, 1)),
    )


def tracks(min_corr: float, a: np.ndarray, b: np.ndarray) -> Verdict:
    mask = np.isfinite(a) & np.isfinite(b)
    a, b = a[mask], b[mask]
    if a.size < 6:
        return Verdict.undecided("too few samples (window)")
    if a.std() == 0 or b.std() == 0:
        return Verdict(False, {"corr": 0.0}, note="one series is constant")
    corr = float(np.corrcoef(a, b)[0, 1])
    return Verdict(
        corr >= min_corr,
        {"corr": corr},
        float(np.clip((corr - min_corr) / max(1e-9, 1 - min_corr), 0, 1)),
    )


def class_size(label: str) -> float | None:
    """``128`` -> 128, ``4k`` -> 4096, ``1m`` -> 1048576; None when not a size."""
    text = label.strip().lower()
    mult = {"k": 1024, "m": 1024**2}.get(text[-1:], 1)
    digits = text[:-1] if mult > 1 else text
    try:
        return float(digits) * mult
    except ValueError:
        return None


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
