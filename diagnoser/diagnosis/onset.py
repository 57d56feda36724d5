"""When a change began: the change point of a playbook's onset signal, and the periods it
splits the data into (the baseline before it, *now* after it)."""

from __future__ import annotations

import numpy as np

from diagnoser.catalog.shapes import Periods
from diagnoser.plumbing.source import Series

MIN_SEGMENT = 8  # samples on each side of a change point
# Share of the variance (in log space) a single step must explain to count as a change. With
# hundreds of samples a clear step explains far more than noise; no healthy scenario of the
# library, or its variants, yields a finding at this threshold (make bench).
MIN_GAIN = 0.2


def change_point(s: Series, search: tuple[float, float]) -> float | None:
    """Time of the strongest shift in mean (in log space) within ``search``."""
    mask = (s.t >= search[0]) & (s.t <= search[1]) & np.isfinite(s.v)
    t, v = s.t[mask], s.v[mask]
    if v.size < 2 * MIN_SEGMENT:
        return None
    # Log space around a typical level, so a doubling counts the same at any scale. A series
    # that is mostly zero (a queue that is usually empty) takes its mean as the level: with
    # the median, every non-zero sample would look alike and the size of the change be lost.
    level = float(np.median(np.abs(v))) or float(np.mean(np.abs(v)))
    x = np.log1p(np.maximum(v, 0) / (level + 1e-12))
    csum, csum2, n = np.cumsum(x), np.cumsum(x * x), x.size
    k = np.arange(MIN_SEGMENT, n - MIN_SEGMENT + 1)
    left_sse = csum2[k - 1] - csum[k - 1] ** 2 / k
    right_sum, right_sum2 = csum[-1] - csum[k - 1], csum2[-1] - csum2[k - 1]
    right_sse = right_sum2 - right_sum**2 / (n - k)
    total = csum2[-1] - csum[-1] ** 2 / n
    gain = total - (left_sse + right_sse)
    best = int(np.argmax(gain))
    if total <= 1e-12 or gain[best] / total < MIN_GAIN:
        return None  # no clear shift
    return float(t[k[best]])


def periods_for(
    onset_series: Series | None,
    window: tuple[float, float],
    baseline: tuple[float, float],
    step: float,
) -> Periods:
    """Now = from the onset to the end; baseline = the reference period before the onset."""
    onset = None
    if onset_series is not None:
        onset = change_point(onset_series, (baseline[0], window[1] - MIN_SEGMENT * step))
    if onset is None or onset < window[0] - (window[1] - window[0]):
        return Periods(baseline, window, window, onset)
    base_end = min(baseline[1], onset - step)
    if onset_series is not None and onset > window[0] and baseline[1] >= window[0] - step:
        # A change inside the window: what came before it in the window is the reference too
        # (a window that opens with a quiet or empty baseline still compares the change with
        # the minutes before it), when the baseline runs up to the window, and either holds
        # data of its own or the window's minutes before the change are enough to stand for
        # it (series born with the window and changed a minute later have no reference).
        t = onset_series.t[np.isfinite(onset_series.v)]
        own = np.count_nonzero((t >= baseline[0]) & (t < window[0]))
        inside = np.count_nonzero((t >= window[0]) & (t <= onset - step))
        if own >= MIN_SEGMENT or inside >= 2 * MIN_SEGMENT:
            base_end = onset - step
    if base_end - baseline[0] < MIN_SEGMENT * step:  # too little clean baseline: keep it
        base_end = baseline[1]
    now_start = max(onset, window[0]) if onset >= window[0] else window[0]
    return Periods((baseline[0], base_end), (now_start, window[1]), window, onset)
