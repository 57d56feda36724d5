"""Frozen counters are not data.

While an engine hangs, the API server still answers ``/metrics``, but every gauge the engine
reports stays where its last step left it and every counter stops. A rate read over the
freeze is the rate of the minutes before it; a share or a quantile of two stopped counters is
the last one seen; a waiting gauge says the queue of the moment the engine stopped. Read as
data, they keep an earlier incident alive, or start a new one, for as long as the hang lasts.

So while a scope's engines are stalled (``stalled_engines``: running requests, no token
produced), and for one rate window on each side of it (rates read across its edges mix it
with what came before and after), every signal read from the engine's stopped counters is
taken as no value. What stays is what tells a hang: the stalled engines, the running gauge,
the rates that truly are zero (nothing finishes, no token comes), the targets' health, the
API server's HTTP counters, the GPUs' exporter and the probe, which go on living.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from diagnoser.diagnosis.match import ScopeData
from diagnoser.plumbing.source import Series

KEPT = frozenset(
    {
        "stalled_engines",
        "engines",
        "requests_running",
        "request_rate",
        "generation_tokens_rate",
        "engine_restarts",
        "target_up",
        "target_served",
        "targets_down",
        "targets_total",
        "sglang_servers",
        "sglang_target_up",
    }
)
KEPT_PREFIXES = ("probe_", "http_", "gpu_", "api_server_")


def kept(signal: str) -> bool:
    return signal in KEPT or signal.startswith(KEPT_PREFIXES)


def freezes(data: ScopeData) -> list[tuple[float, float]]:
    """The spans the scope's engines were stalled, each widened by the rate window."""
    s = data.series.get("stalled_engines")
    if s is None or not s.t.size:
        return []
    on = np.nan_to_num(s.v) >= 1
    if not on.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate(([0], on.astype(np.int8), [0]))))
    pad = data.smoothing
    spans = zip(edges[::2], edges[1::2], strict=True)
    return [(float(s.t[a]) - pad, float(s.t[b - 1]) + pad) for a, b in spans]


def _masked(s: Series, spans: list[tuple[float, float]]) -> Series:
    out = s.v.astype(np.float64, copy=True)
    for a, b in spans:
        out[(s.t >= a) & (s.t <= b)] = np.nan
    return replace(s, v=out)


def thawed(data: ScopeData) -> ScopeData:
    """``data`` with what the engine's stopped counters said during a freeze taken out."""
    spans = freezes(data)
    if not spans:
        return data
    series = {k: s if kept(k) else _masked(s, spans) for k, s in data.series.items()}
    classes = {
        k: c if kept(k) else {name: _masked(s, spans) for name, s in c.items()}
        for k, c in data.classes.items()
    }
    return replace(data, series=series, classes=classes)
