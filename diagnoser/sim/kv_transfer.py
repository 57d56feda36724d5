"""What a NixlConnector exposes (``nixl/stats.py``, vLLM 0.12 and later), and a KV consumer's
count of waiting requests by stage of their KV load (0.33).

The decode side of a disaggregated pair pulls each prompt's KV from a prefill instance. Each
completed transfer is one observation of its duration, post time, bytes and descriptors
(one per KV block); a failed one counts in ``nixl_num_failed_transfers`` and, under vLLM's
default ``kv_load_failure_policy`` ("fail"), ends its request with ``finished_reason=
"error"``. The connector registers the same families on the prefill side (a KV producer),
where no transfer is pulled: they stay at 0 there (KV expiry, counted on that side, is not
simulated).
"""

from __future__ import annotations

import numpy as np

from diagnoser.metrics import families as F
from diagnoser.metrics.exposition import Histogram, Labels, Recorder, labels_of
from diagnoser.sim.engine import Engine
from diagnoser.sim.engine_stats import EngineStats

COUNTERS = (F.NIXL_FAILED, F.NIXL_FAILED_NOTIFICATIONS, F.NIXL_EXPIRED, F.NIXL_AFTER_EXPIRY)
HISTOGRAMS = (F.NIXL_XFER_TIME, F.NIXL_POST_TIME, F.NIXL_BYTES, F.NIXL_DESCRIPTORS)
POST_SECONDS = 0.002  # posting a transfer's descriptors (the handshake was done at start-up)


class NixlMetrics:
    def __init__(self) -> None:
        self.h = {f: Histogram(f.bucket_bounds(0)) for f in HISTOGRAMS}
        self.counters = dict.fromkeys(COUNTERS, 0.0)

    def absorb(self, st: EngineStats, block_bytes: float) -> None:
        if st.transfers:
            seconds, sizes = np.array(st.transfers, dtype=np.float64).T
            self.h[F.NIXL_XFER_TIME].observe(seconds)
            self.h[F.NIXL_POST_TIME].observe(np.full(seconds.size, POST_SECONDS))
            self.h[F.NIXL_BYTES].observe(sizes)
            self.h[F.NIXL_DESCRIPTORS].observe(np.ceil(sizes / max(block_bytes, 1.0)))
        self.counters[F.NIXL_FAILED] += len(st.errors)  # each failed load ended its request

    def record(self, rec: Recorder, t: float, lb: Labels, loading: float | None) -> None:
        """The connector's families, and the stage gauge with ``loading`` requests in transfer
        (None: the profile's vLLM has no such gauge)."""
        for fam, hist in self.h.items():
            rec.sample_histogram(fam.name, fam.help, lb, t, hist)
        for fam, value in self.counters.items():
            rec.sample(fam.name, fam.type, fam.help, lb, t, value)
        if loading is not None:
            fam = F.KV_FETCH_BY_STAGE
            for stage, value in zip(fam.values, (0.0, loading, 0.0), strict=True):
                labels = labels_of(**dict(lb), stage=stage)
                rec.sample(fam.name, fam.type, fam.help, labels, t, value)


def in_transfer(engine: Engine, t: float) -> int:
    """Requests whose KV is on its way: the scheduler holds them, waiting and deferred."""
    return sum(1 for r in engine.waiting if r.fetch_start >= 0 and r.fetch_start <= t < r.ready)
