"""The signal vocabulary: every named PromQL signal, defined once.

Recording rules, alert expressions, dashboard panels and the diagnoser all render these
definitions, so a metric rename is handled here and nowhere else. A signal is aggregated per
``model_name`` by default (summing vLLM's data-parallel ``engine`` label); signals where the
worst instance is the point (KV usage, API-server CPU) say so in their aggregation. One module
per family of signals; the vocabulary assembles them in a fixed order (the recording rules'
order).
"""

from __future__ import annotations

from collections.abc import Iterator

from diagnoser.metrics.signals import (
    features,
    gpu,
    latency,
    platform,
    probe,
    scheduler,
    server,
    slo,
    traffic,
)
from diagnoser.metrics.signals.base import (
    DEFAULT_ITL_SLO,
    DEFAULT_TTFT_SLO,
    ITL_STALL,
    MODEL,
    STAND_IN_LABEL,
    TARGET,
    Signal,
)
from diagnoser.metrics.signals.slo import slo_attainment

__all__ = [
    "DEFAULT_ITL_SLO",
    "DEFAULT_TTFT_SLO",
    "ITL_STALL",
    "MODEL",
    "SIGNALS",
    "STAND_IN_LABEL",
    "TARGET",
    "Signal",
    "Vocabulary",
    "slo_attainment",
]


def _vocabulary(ttft_slo: float, itl_slo: float) -> list[Signal]:
    return [
        *latency.signals(),
        *traffic.signals(),
        *scheduler.signals(),
        *server.restarts(),
        *server.api_server(),
        *server.attributed(),
        *server.engines(),
        *gpu.signals(),
        *platform.signals(),
        *slo.signals(ttft_slo, itl_slo),
        *probe.signals(),
        *server.targets(),
        *features.signals(),
    ]


class Vocabulary:
    """The signals by name, rendered with one set of SLO thresholds."""

    def __init__(self, ttft_slo: float = DEFAULT_TTFT_SLO, itl_slo: float = DEFAULT_ITL_SLO):
        self.ttft_slo, self.itl_slo = ttft_slo, itl_slo
        signals = _vocabulary(ttft_slo, itl_slo)
        self._signals = {sig.name: sig for sig in signals}
        if len(self._signals) != len(signals):
            raise AssertionError("duplicate signal names")

    def __getitem__(self, name: str) -> Signal:
        try:
            return self._signals[name]
        except KeyError:
            raise KeyError(f"unknown signal {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._signals

    def __iter__(self) -> Iterator[Signal]:
        return iter(self._signals.values())

    def names(self) -> list[str]:
        return list(self._signals)


SIGNALS = Vocabulary()
