"""Histograms read the same way whether Prometheus or the simulator counted them, and
log-normal lengths fitted to a histogram.

A measured window and its replay are compared through the same bounds and the same
arithmetic: ``quantile`` is Prometheus's ``histogram_quantile`` (linear within a bucket, the
top finite bound for a rank in +Inf), ``share_at_or_below`` the SLO share at the largest bound
at or below a threshold.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

_N = NormalDist()


@dataclass(frozen=True)
class Buckets:
    """A histogram over a period: finite upper bounds and cumulative counts (one more: +Inf),
    with the sum of the observations."""

    bounds: np.ndarray
    cumulative: np.ndarray
    sum: float = 0.0

    @property
    def count(self) -> float:
        return float(self.cumulative[-1]) if self.cumulative.size else 0.0

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def minus(self, before: Buckets) -> Buckets:
        return Buckets(self.bounds, self.cumulative - before.cumulative, self.sum - before.sum)

    def plus(self, other: Buckets) -> Buckets:
        return Buckets(self.bounds, self.cumulative + other.cumulative, self.sum + other.sum)


def quantile(b: Buckets, q: float) -> float | None:
    """Prometheus's ``histogram_quantile(q, ...)`` over these buckets; None when empty."""
    total = b.count
    if total <= 0 or not b.bounds.size:
        return None
    rank = q * total
    i = int(np.searchsorted(b.cumulative, rank, side="left"))
    if i >= b.bounds.size:  # in +Inf: the top finite bound, as Prometheus answers
        return float(b.bounds[-1])
    end = float(b.bounds[i])
    start = float(b.bounds[i - 1]) if i > 0 else 0.0
    below = float(b.cumulative[i - 1]) if i > 0 else 0.0
    inside = float(b.cumulative[i]) - below
    if i == 0 and end <= 0:
        return end
    return start + (end - start) * ((rank - below) / inside if inside > 0 else 1.0)


def share_at_or_below(b: Buckets, threshold: float) -> float | None:
    """The share of observations in the buckets up to the largest bound at or below
    ``threshold`` (an SLO read as the server's own bounds allow); None when empty."""
    if b.count <= 0:
        return None
    i = int(np.searchsorted(b.bounds, threshold * (1 + 1e-9), side="right")) - 1
    return float(b.cumulative[i]) / b.count if i >= 0 else 0.0


@dataclass(frozen=True)
class LogNormal:
    """Lengths: ``median`` and ``sigma`` of a log-normal, and the cap (``max_tokens``) that
    makes ``length_share`` of the requests stop on length (None: no cap seen)."""

    median: float
    sigma: float
    cap: float | None = None
    error: float = 0.0  # largest gap between the fitted and the measured CDF at a bound


def _cdf(x: np.ndarray) -> np.ndarray:
    """The standard normal CDF, vectorised (Abramowitz and Stegun 7.1.26: error < 1.5e-7)."""
    u = np.abs(np.asarray(x, dtype=np.float64)) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * u)
    poly = t * (
        0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429)))
    )
    erf = 1.0 - poly * np.exp(-u * u)
    return np.asarray(0.5 * (1.0 + np.sign(x) * erf), dtype=np.float64)


def fit_lognormal(b: Buckets, length_share: float = 0.0) -> LogNormal:
    """The log-normal (median, sigma) whose CDF at the histogram's bounds and whose mean are
    closest to the measured ones; with ``length_share`` > 0 the top of the distribution is
    capped where that share of it lies (requests that stop at max_tokens), and only the
    bounds below the cap are matched."""
    total = b.count
    mean = b.mean
    if total <= 0 or mean is None or mean <= 0:
        raise ValueError("an empty histogram")
    keep = b.bounds > 0
    bounds, cdf = b.bounds[keep], b.cumulative[:-1][keep] / total
    logs = np.log(bounds)
    sigmas = np.linspace(0.02, 2.5, 125)
    centre = math.log(mean)
    mus = np.linspace(centre - 4.0, centre + 1.0, 501)
    mu, sigma = np.meshgrid(mus, sigmas)  # shape (sigmas, mus)
    share = min(max(length_share, 0.0), 0.5)
    z_cap = _N.inv_cdf(1 - share) if share > 0 else math.inf
    log_cap = mu + sigma * z_cap
    # The model's CDF at each bound: the log-normal's below the cap, 1 at and above it.
    z = (logs[None, None, :] - mu[..., None]) / sigma[..., None]
    model = _cdf(z)
    capped = logs[None, None, :] >= log_cap[..., None]
    model = np.where(capped, 1.0, model)
    weight = np.where(capped, 0.25, 1.0)  # past the cap the bounds say little of the shape
    err_cdf = (((model - cdf[None, None, :]) ** 2) * weight).sum(axis=-1)
    # The mean of min(X, cap).
    if math.isfinite(z_cap):
        cap = np.exp(log_cap)
        below = np.exp(mu + sigma**2 / 2) * _cdf((log_cap - mu - sigma**2) / sigma)
        fitted_mean = below + cap * share
    else:
        fitted_mean = np.exp(mu + sigma**2 / 2)
    err_mean = (np.log(fitted_mean) - math.log(mean)) ** 2
    score = err_cdf + err_mean
    k = np.unravel_index(int(np.argmin(score)), score.shape)
    best_mu, best_sigma = float(mu[k]), float(sigma[k])
    cap_value = math.exp(best_mu + best_sigma * z_cap) if math.isfinite(z_cap) else None
    gap = float(np.max(np.abs(model[k] - cdf))) if cdf.size else 0.0
    return LogNormal(math.exp(best_mu), best_sigma, cap_value, gap)


# Points of a length table within each bucket (``length_table``).
TABLE_POINTS = 48


def length_table(b: Buckets, shape: LogNormal, top: float) -> tuple[np.ndarray, np.ndarray]:
    """The lengths as the server's histogram has them, as a table to draw from: cumulative
    shares and the logarithms of the lengths at them (increasing, from 0 to 1). Each bucket
    keeps its measured share of the requests, so a second class of lengths (documents among
    chat turns) that one log-normal spreads over its tail keeps its weight where it was;
    within a bucket the lengths follow ``shape`` (log-uniform where it has next to no
    mass). None lie above ``top`` (the longest a server takes): a bucket past it ends
    there."""
    total = b.count
    if total <= 0:
        raise ValueError("an empty histogram")
    mu, sigma = math.log(shape.median), max(shape.sigma, 1e-3)
    finite = [float(x) for x in b.bounds if 0 < x < top]
    edges = [min(0.5, finite[0] / 2) if finite else 0.5, *finite, float(top)]
    counts = b.cumulative[: b.bounds.size]  # the finite bounds' (the last count is +Inf's)
    below = [0.0, *[float(c) / total for c, x in zip(counts, b.bounds, strict=True) if 0 < x < top]]
    shares, logs = [np.zeros(1)], [np.array([math.log(edges[0])])]
    for k in range(len(edges) - 1):
        lo, hi = edges[k], edges[k + 1]
        start, end = below[k], below[k + 1] if k + 1 < len(below) else 1.0
        if end - start <= 0 or hi <= lo:
            continue
        x = np.linspace(math.log(lo), math.log(hi), TABLE_POINTS + 1)[1:]
        f = _cdf((x - mu) / sigma)
        f0 = float(_cdf(np.array([(math.log(lo) - mu) / sigma]))[0])
        mass = float(f[-1]) - f0
        frac = (f - f0) / mass if mass > 1e-9 else (x - math.log(lo)) / (x[-1] - math.log(lo))
        shares.append(start + (end - start) * np.clip(frac, 0.0, 1.0))
        logs.append(x)
    cum, at = np.concatenate(shares), np.concatenate(logs)
    keep = np.concatenate([[True], np.diff(cum) > 0])  # strictly increasing, for np.interp
    return cum[keep] / cum[keep][-1], at[keep]


# Each latency quantile: the histogram it is read from, and where.
QUANTILE_OF = {
    "ttft_p50": ("ttft", 0.5),
    "ttft_p95": ("ttft", 0.95),
    "itl_p50": ("itl", 0.5),
    "itl_p95": ("itl", 0.95),
}
QUANTILES = tuple(QUANTILE_OF)
# The figures a measured window and its replay are compared on, in display order.
METRICS = (
    "ttft_p50",
    "ttft_p95",
    "itl_p50",
    "itl_p95",
    "kv_usage",
    "preemptions_per_second",
    "waiting",
    "requests_per_second",
    "tokens_per_second",
    "ttft_slo_share",
    "itl_slo_share",
)


@dataclass(frozen=True)
class Observed:
    """What one model's servers did over a period (measured, or replayed)."""

    ttft: Buckets
    itl: Buckets
    kv_usage: float | None  # mean over the period and the engines, 0-1
    preemptions: float  # over the period, all servers
    waiting: float | None  # mean requests waiting, all servers together
    finished: float  # requests finished over the period
    generation_tokens: float
    seconds: float
    # Seconds from a request's first scheduling to its first token (vLLM's
    # request_prefill_time_seconds; None where the server does not export it).
    prefill: Buckets | None = None
    # A replay pooled from several draws of the window's workload: each draw apart, whose
    # spread is how far one window's figures stray by chance (``noise``).
    parts: tuple[Observed, ...] = field(default=(), repr=False)

    def either_side(self, share: float) -> dict[str, tuple[float, float]]:
        """Per latency quantile, the quantiles ``share`` below and above it (p94 and p96 for
        p95 at 0.01). Far apart, they say the figure sits on a knee of its distribution: ITL
        p95 where about 5% of the tokens wait behind a prefill step lies between a decode
        step's time and a prefill's, and a share one point off reads the other side."""
        out: dict[str, tuple[float, float]] = {}
        for name, (hist, q) in QUANTILE_OF.items():
            b: Buckets = getattr(self, hist)
            lo, hi = quantile(b, max(0.0, q - share)), quantile(b, min(1.0, q + share))
            if lo is not None and hi is not None:
                out[name] = (lo, hi)
        return out

    def noise(self, ttft_slo: float, itl_slo: float) -> dict[str, float | None]:
        """Per figure, the standard deviation over the draws of one window's length (None
        with fewer than two draws, or where a draw has no value): how far a window as long as
        the measured one strays from the pooled figure by chance alone."""
        per = [p._figures(ttft_slo, itl_slo) for p in self.parts]
        out: dict[str, float | None] = {}
        for name in METRICS:
            values = [f[name] for f in per]
            ok = len(values) >= 2 and all(v is not None for v in values)
            out[name] = float(np.std(np.array(values, dtype=np.float64), ddof=1)) if ok else None
        return out

    def figures(self, ttft_slo: float, itl_slo: float) -> dict[str, float | None]:
        """The figures; of pooled draws, each latency quantile is the median of the draws'
        (a typical window's: the pooled histogram's tail is the unluckiest draws' tail, and
        a queue that runs away runs furthest in them), the rest the pooled figure."""
        own = self._figures(ttft_slo, itl_slo)
        if len(self.parts) < 2:
            return own
        per = [p._figures(ttft_slo, itl_slo) for p in self.parts]
        for name in QUANTILES:
            values = [f[name] for f in per]
            if all(v is not None for v in values):
                own[name] = float(np.median(np.array(values, dtype=np.float64)))
        return own

    def _figures(self, ttft_slo: float, itl_slo: float) -> dict[str, float | None]:
        s = max(self.seconds, 1e-9)
        return {
            **{name: quantile(getattr(self, h), q) for name, (h, q) in QUANTILE_OF.items()},
            "kv_usage": self.kv_usage,
            "preemptions_per_second": self.preemptions / s,
            "waiting": self.waiting,
            "requests_per_second": self.finished / s,
            "tokens_per_second": self.generation_tokens / s,
            "ttft_slo_share": share_at_or_below(self.ttft, ttft_slo),
            "itl_slo_share": share_at_or_below(self.itl, itl_slo),
        }

    def speeds(self) -> dict[str, float | None]:
        """What the speed factors are fitted to, beside the medians: the mean prefill time
        and the mean inter-token latency, exact where a median is read inside a bucket (the
        ITL's 50-75 ms bucket is half as wide as its lower bound)."""
        prefill = self.prefill.mean if self.prefill is not None else None
        return {"prefill_mean": prefill, "itl_mean": self.itl.mean}


def pooled(parts: list[Observed]) -> Observed:
    """Draws of one window pooled: histograms and counts added, KV usage and the queue the
    mean of the draws' means, over the draws' seconds together."""
    if len(parts) == 1:
        return parts[0]
    prefills = [p.prefill for p in parts if p.prefill is not None]

    def mean(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return float(np.mean(known)) if known else None

    return Observed(
        ttft=functools.reduce(Buckets.plus, [p.ttft for p in parts]),
        itl=functools.reduce(Buckets.plus, [p.itl for p in parts]),
        kv_usage=mean([p.kv_usage for p in parts]),
        preemptions=sum(p.preemptions for p in parts),
        waiting=mean([p.waiting for p in parts]),
        finished=sum(p.finished for p in parts),
        generation_tokens=sum(p.generation_tokens for p in parts),
        seconds=sum(p.seconds for p in parts),
        prefill=functools.reduce(Buckets.plus, prefills) if len(prefills) == len(parts) else None,
        parts=tuple(parts),
    )
