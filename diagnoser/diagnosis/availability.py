"""The availability SLI's parts: the time every target of a model was down, counted in
stretches long enough to be an outage (``DOWN_HELD``, ``DOWN_SCRAPES``), the synthetic
probe's failed share outside that time, and the two put together with the servers' own
failed share (``available``). ``health.assess`` reads them."""

from __future__ import annotations

import numpy as np

from diagnoser.diagnosis.match import ScopeData
from diagnoser.metrics.signals.server import DOWN_HELD, DOWN_SCRAPES
from diagnoser.plumbing.durations import parse_seconds


def step_of(data: ScopeData, name: str) -> float:
    """The interval between the samples of ``name``'s series (0: fewer than two)."""
    s = data.series.get(name)
    if s is None or s.t.size < 2:
        return 0.0
    return float(np.median(np.diff(s.t)))


def all_down(data: ScopeData, span: tuple[float, float]) -> float | None:
    """The share of ``span``'s samples with every target of the scope down, in stretches
    that lasted ``DOWN_HELD`` or more and ``DOWN_SCRAPES`` scrapes or more (one failed scrape
    among good ones is no outage, also at 60 s scrapes read at a finer step; None: no target
    series). Read afterwards, a stretch counts whole; the recording rules, which cannot wait
    to see how long it lasts, count it from its first failed minute (and scrape) on."""
    every = _every_down(data)
    if every is None:
        return None
    t, on = every
    inside = (t >= span[0]) & (t <= span[1])
    if not inside.any():
        return None
    least = max(parse_seconds(DOWN_HELD), DOWN_SCRAPES * data.scrape)
    held = _lasting(t, on, least, step_of(data, "targets_total"))
    return float(np.mean(held[inside]))


def _every_down(data: ScopeData) -> tuple[np.ndarray, np.ndarray] | None:
    """The times of the scope's target series, and whether every target was down at each
    (None: no target series)."""
    total, down = data.series.get("targets_total"), data.series.get("targets_down")
    if total is None or down is None or total.t.size != down.t.size:
        return None
    t, d = np.nan_to_num(total.v), np.nan_to_num(down.v)
    return total.t, (t > 0) & (d >= t)


def probe_errors(data: ScopeData, span: tuple[float, float]) -> float | None:
    """The synthetic probe's failed share of its requests over ``span`` (the mean of its
    samples; None where no probe runs), outside the time every target was down and the rate
    window after it (that time is counted already, as unavailable time): what the clients
    saw fail that the servers may never have counted - a connection refused by a server that
    is down while others serve, a gateway's 502, a stream cut off."""
    s = data.series.get("probe_error_share")
    if s is None:
        return None
    keep = (s.t >= span[0]) & (s.t <= span[1]) & np.isfinite(s.v)
    every = _every_down(data)
    if every is not None:
        downs = every[0][every[1]]
        lo = np.searchsorted(downs, s.t - max(data.smoothing, step_of(data, "targets_total")))
        keep &= np.searchsorted(downs, s.t, side="right") == lo
    return float(np.mean(s.v[keep])) if keep.any() else None


def _lasting(t: np.ndarray, on: np.ndarray, least: float, step: float) -> np.ndarray:
    """``on`` in the stretches that lasted ``least`` seconds or more, each sample standing
    for its ``step``."""
    edges = np.diff(np.concatenate(([0], on.astype(np.int8), [0])))
    out = np.zeros_like(on)
    for first, after in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1), strict=True):
        if t[after - 1] - t[first] + step >= least - 1e-9:
            out[first:after] = True
    return out


def available(
    error_share: float | None, all_down: float | None, probe: float | None = None
) -> float | None:
    """The availability SLI: the requests served without an error, over the time anything
    could be served (time with every target down is unavailable, whatever was counted). The
    failed share is the servers' count or, where a probe runs and saw more fail outside that
    time, the probe's (it sees the servers' errors too: the larger, not the sum)."""
    failed = max((e for e in (error_share, probe) if e is not None), default=None)
    if failed is None and not all_down:
        return None
    return (1 - (failed or 0.0)) * (1 - (all_down or 0.0))
