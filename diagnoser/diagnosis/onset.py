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
    found = _split(s, search)
    return None if found is None else found[0]


def _split(
    s: Series, search: tuple[float, float], level: float | None = None
) -> tuple[float, float, float] | None:
    """The strongest shift in mean within ``search``: (its time, the share of the variance
    it explains, the shift of the mean in log space); None when no clear one. ``level``:
    the typical level to read the log space around (by default the searched samples')."""
    mask = (s.t >= search[0]) & (s.t <= search[1]) & np.isfinite(s.v)
    t, v = s.t[mask], s.v[mask]
    if v.size < 2 * MIN_SEGMENT:
        return None
    # Log space around a typical level, so a doubling counts the same at any scale. A series
    # that is mostly zero (a queue that is usually empty) takes its mean as the level: with
    # the median, every non-zero sample would look alike and the size of the change be lost.
    if level is None:
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
    kb = int(k[best])
    shift = float(right_sum[best] / (n - kb) - csum[kb - 1] / kb)
    return float(t[kb]), float(gain[best] / total), shift


# A later change must move the mean by this much in log space (about a third of the typical
# level) to count: within a period that already changed once, the strongest split of what is
# left is often noise that explains a fifth of a small variance.
MIN_SHIFT = 0.3


def change_points(s: Series, search: tuple[float, float], most: int = 4) -> list[float]:
    """The times the series' mean shifted within ``search``, in time order: the strongest
    change, then the strongest within each side of it, and so on (binary segmentation), at
    most ``most``. Each side is read around the whole series' level, so a quiet stretch's
    noise does not count as a change of its own."""
    mask = (s.t >= search[0]) & (s.t <= search[1]) & np.isfinite(s.v)
    v = s.v[mask]
    if v.size < 2 * MIN_SEGMENT:
        return []
    level = float(np.median(np.abs(v))) or float(np.mean(np.abs(v)))
    found: list[float] = []
    spans = [search]
    while spans and len(found) < most:
        splits = [(span, _split(s, span, level)) for span in spans]
        spans = []
        for span, split in splits:
            if split is None or (found and abs(split[2]) < MIN_SHIFT):
                continue
            found.append(split[0])
            step = _step_before(s, split[0])
            spans += [(span[0], split[0] - step), (split[0], span[1])]
    return sorted(found[:most])


def _step_before(s: Series, t: float) -> float:
    i = int(np.searchsorted(s.t, t))
    return float(s.t[i] - s.t[i - 1]) if 0 < i < s.t.size else 0.0


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
