"""The live workload and engine of one model, fitted from a Prometheus window.

From vLLM's own series over the window: the arrival rate at each step (requests finished in
the step plus the change in requests inside the servers, so a queue that builds counts as
arrivals), prompt and output lengths as log-normals fitted to the token histograms (and the
histograms themselves, whose buckets' shares the replay keeps), the share
stopping on length (which places the ``max_tokens`` cap), the prefix-cache hit rate, the
number of servers and engines, and the engine's KV cache from ``vllm:cache_config_info``.
The window's own latencies, KV usage, preemptions and queue are kept as what was measured,
to calibrate the replay against.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from diagnoser.kvbudget.live import read_live
from diagnoser.metrics import engines as registry
from diagnoser.metrics import families as F
from diagnoser.plumbing.durations import format_duration
from diagnoser.plumbing.errors import UserError
from diagnoser.plumbing.printable import printable
from diagnoser.plumbing.source import MAX_POINTS, MetricSource, SourceError
from diagnoser.whatif.stats import Buckets, LogNormal, Observed, fit_lognormal

# Fewer finished requests than this, and the length histograms and latency quantiles are
# too coarse to fit or to calibrate against.
MIN_REQUESTS = 200
RATE_STEP = 60.0  # seconds per point of the arrival rate (Poisson noise ~5% at 5 req/s)
# The longest window fitted: its arrival rate, a point a minute, is one range query, which
# Prometheus answers with at most ``MAX_POINTS`` points a series (and every replay replays
# the whole window).
MAX_WINDOW = 7 * 86400.0
assert MAX_WINDOW / RATE_STEP <= MAX_POINTS
# The longest part of the window calibrated on and replayed: every replay simulates it whole,
# so an hour's window costs four times a quarter's, and a steady quarter of an hour at the
# incident's load is what a fix would change (an hour's window mixes the peak with its
# build-up and its easing, whose queues a replay matches only by luck).
SPAN = 900.0
# The parts of the window the span is chosen among: those at least this share of the busiest
# one's load (the incident's, not a quiet stretch before it).
BUSY = 0.8


class FitError(UserError):
    """The window cannot be fitted; ``str()`` says why and what would do."""


def check_window(seconds: float) -> None:
    """``FitError`` for a window longer than what-if fits (``MAX_WINDOW``), naming the limit
    and the options that choose the window."""
    if seconds > MAX_WINDOW:
        raise FitError(
            f"--since {format_duration(seconds)}: what-if fits at most "
            f"{format_duration(MAX_WINDOW)} of traffic (its arrival rate is read a point a "
            f"minute, at most {MAX_POINTS} points a series); give a shorter --since, and "
            "--until for a window further back"
        )


@dataclass(frozen=True)
class EngineCache:
    """The KV cache one engine reports in ``vllm:cache_config_info``."""

    num_gpu_blocks: int
    block_size: int
    gpu_memory_utilization: float
    cache_dtype: str
    enable_prefix_caching: bool


@dataclass
class Fit:
    """One model's workload and engine over a window, and what its servers did."""

    model: str
    start: float
    end: float
    rate_step: float
    rates: np.ndarray  # requests/s arriving in each step of the window
    prompt: LogNormal
    output: LogNormal
    length_share: float
    prefix_hit: float | None  # share of prompt tokens found in the prefix cache
    instances: int
    engines: int  # data-parallel engines per server
    cache: EngineCache
    measured: Observed
    notes: list[str] = field(default_factory=list)
    # Requests waiting in the servers' queues at ``start`` (a part of the window only): a
    # queue the part begins with.
    backlog: float = 0.0
    # The whole window fitted, when the replay covers only its steadiest busy part
    # (``start``-``end``); None when it covers all of it.
    window: tuple[float, float] | None = None
    # The window's prompt and output token histograms: the replay draws each bucket's share
    # of the lengths from them (None: from the log-normals alone).
    prompt_hist: Buckets | None = None
    output_hist: Buckets | None = None

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def mean_rate(self) -> float:
        return float(self.rates.mean()) if self.rates.size else 0.0


def _sel(selector: tuple[str, ...], extra: str = "") -> str:
    parts = [*selector, *([extra] if extra else [])]
    return "{" + ", ".join(parts) + "}"


def _either(names: tuple[str, ...], selector: tuple[str, ...], suffix: str = "") -> str:
    """A family under any of its names (renamed ones), within ``selector``."""
    alt = "|".join(n + suffix for n in names)
    return _sel(selector, f'__name__=~"{alt}"')


def _scalar(source: MetricSource, expr: str, at: float) -> float | None:
    found = source.query(expr, at)
    if not found or not len(found[0].v):
        return None
    value = float(found[0].v[-1])
    return value if math.isfinite(value) else None


def read_buckets(
    source: MetricSource, names: tuple[str, ...], selector: tuple[str, ...], span: str, at: float
) -> Buckets:
    """A histogram's increase over ``span`` up to ``at``, summed over the servers;
    ``SourceError`` for a bucket whose bound (``le``) is not a number."""
    bucket = _either(names, selector, "_bucket")
    by_le: dict[float, float] = {}
    for s in source.query(f"sum by (le) (increase({bucket}[{span}]))", at):
        if len(s.v) and math.isfinite(float(s.v[-1])):
            by_le[_bound(names[0], s.labels.get("le", ""))] = float(s.v[-1])
    total = _scalar(source, f"sum(increase({_either(names, selector, '_sum')}[{span}]))", at)
    finite = sorted(k for k in by_le if math.isfinite(k))
    cum = np.array([by_le[k] for k in finite] + [by_le.get(math.inf, 0.0)], dtype=np.float64)
    cum = np.maximum.accumulate(cum) if cum.size else cum  # extrapolation can disorder them
    return Buckets(np.array(finite, dtype=np.float64), cum, total or 0.0)


def _bound(name: str, le: str) -> float:
    """A bucket's upper bound, as Prometheus writes it (``0.5``, ``+Inf``)."""
    try:
        return float(le)
    except ValueError:
        raise SourceError(
            f"the answer for {name}'s histogram has a bucket le={printable(le)[:60]!r}, "
            "which is no bound: the histogram cannot be read"
        ) from None


def measure(source: MetricSource, selector: tuple[str, ...], start: float, end: float) -> Observed:
    """What the servers did over ``[start, end]``."""
    span = f"{int(end - start)}s"

    def total(name: str) -> float:
        return _scalar(source, f"sum(increase({name}{_sel(selector)}[{span}]))", end) or 0.0

    kv = _scalar(source, f"avg(avg_over_time({_either(F.KV_USAGE_NAMES, selector)}[{span}]))", end)
    prefill = read_buckets(source, (F.PREFILL.name,), selector, span, end)
    waiting = _scalar(source, f"sum(avg_over_time({F.WAITING.name}{_sel(selector)}[{span}]))", end)
    return Observed(
        ttft=read_buckets(source, (F.TTFT.name,), selector, span, end),
        itl=read_buckets(source, F.ITL_NAMES[:1], selector, span, end)
        if _has(source, F.ITL_NAMES[0], selector, end, span)
        else read_buckets(source, F.ITL_NAMES[1:], selector, span, end),
        kv_usage=kv,
        preemptions=total(F.PREEMPTIONS.name),
        waiting=waiting,
        finished=total(F.SUCCESS.name),
        generation_tokens=total(F.GENERATION_TOKENS.name),
        seconds=end - start,
        prefill=prefill if prefill.count > 0 else None,
    )


def _has(source: MetricSource, name: str, selector: tuple[str, ...], at: float, span: str) -> bool:
    return bool(source.query(f"count(last_over_time({name}_count{_sel(selector)}[{span}]))", at))


def arrival_rates(
    source: MetricSource, selector: tuple[str, ...], start: float, end: float, step: float
) -> tuple[np.ndarray, np.ndarray]:
    """Requests/s arriving in each ``step`` of ``(start, end]``: those finished in it plus the
    change in those inside the servers (running or waiting); and those inside at each step's
    bounds (one more value than steps)."""
    sel = _sel(selector)
    w = f"{int(step)}s"
    ended = f"sum(increase({F.SUCCESS.name}{sel}[{w}]))"
    done = source.query_range(ended, start + step, end, step)
    inside = source.query_range(
        f"sum({F.WAITING.name}{sel}) + sum({F.RUNNING.name}{sel})", start, end, step
    )
    n = round((end - start) / step)
    grid = start + step * np.arange(n + 1)
    finished = _on(grid[1:], done)
    held = _on(grid, inside)
    held = np.where(np.isnan(held), 0.0, held)
    arrived = np.nan_to_num(finished) + np.diff(held)
    return np.asarray(np.maximum(arrived, 0.0) / step, dtype=np.float64), held


def steady_part(rates: np.ndarray, held: np.ndarray, step: float) -> tuple[int, int]:
    """The steps ``[lo, hi)`` of the window to calibrate on and replay: ``SPAN`` seconds (the
    whole window when it is no longer) at the incident's load (at least ``BUSY`` of the
    busiest part's mean rate) where the load is steadiest: the least spread of the arrival
    rate, plus the change in the requests inside the servers over it as a share of the
    requests that arrived (a queue that builds or drains). The latest of equals."""
    k = max(1, round(SPAN / step))
    n = rates.size
    if n <= k:
        return 0, n
    windows = np.lib.stride_tricks.sliding_window_view(rates, k)
    means = windows.mean(axis=1)
    spread = windows.std(axis=1) / np.maximum(means, 1e-9)
    arrived = np.maximum(means * k * step, 1.0)
    drift = np.abs(held[k:] - held[: n - k + 1]) / arrived
    score = np.where(means >= BUSY * means.max(), spread + drift, np.inf)
    lo = int(n - k - np.argmin(score[::-1]))
    return lo, lo + k


def _on(grid: np.ndarray, found: list) -> np.ndarray:  # type: ignore[type-arg]
    out = np.full(grid.size, np.nan)
    if found:
        s = found[0]
        idx = np.searchsorted(grid, np.asarray(s.t, dtype=np.float64) - 1e-6)
        ok = idx < grid.size
        out[idx[ok]] = np.asarray(s.v, dtype=np.float64)[ok]
    return out


def fit_window(
    source: MetricSource,
    model: str,
    start: float,
    end: float,
    selector: tuple[str, ...] = (),
) -> Fit:
    """Fit ``model``'s workload and engine over ``[start, end]`` (``selector``: the site's
    matchers; the model's is added here)."""
    from diagnoser.metrics.promql import matcher

    check_window(end - start)
    scope = (*selector, matcher("model_name", model))
    span = f"{int(end - start)}s"
    shown = printable(model)
    live = [
        e for e in read_live(source, end, None, None, selector).engines if e.model_name == model
    ]
    if not live:
        for other in registry.others():
            families = '__name__=~"' + re.escape(other.prefix) + '.+"'
            if source.query(f"count({_sel(scope, families)})", end):
                raise FitError(
                    f"{shown} is served by {other.title}: what-if replays vLLM's engine, and its "
                    "levers (gpu_memory_utilization, max_num_seqs, ...) are vLLM flags "
                    f"{other.title} does not have"
                )
        raise FitError(
            f"no vllm:cache_config_info for {shown} at the window's end: what-if needs the "
            "engine's KV cache as vLLM reports it (a vLLM server, scraped at the time)"
        )
    cache = _cache(live[0], shown)
    step = RATE_STEP if end - start >= 4 * RATE_STEP else max(15.0, (end - start) / 4)
    rates, held = arrival_rates(source, scope, start, end, step)
    lo, hi = steady_part(rates, held, step)
    part = None  # the part replayed, measured; the whole window is measured only without one
    if hi - lo < rates.size:
        part = measure(source, scope, start + lo * step, start + hi * step)
        if part.finished < MIN_REQUESTS or part.ttft.count < MIN_REQUESTS:
            part = None
    measured = part or measure(source, scope, start, end)
    if measured.finished < MIN_REQUESTS or measured.ttft.count < MIN_REQUESTS:
        minutes = (end - start) / 60
        raise FitError(
            f"{shown} finished {measured.finished:.0f} requests in the {minutes:.0f}-minute "
            f"window; fitting the workload needs at least {MIN_REQUESTS} (a longer --since, "
            f"or a busier period: at least {MIN_REQUESTS / (end - start):.2g} req/s here)"
        )
    reasons = {
        s.labels.get("finished_reason", ""): float(s.v[-1])
        for s in source.query(
            f"sum by (finished_reason) (increase({F.SUCCESS.name}{_sel(scope)}[{span}]))", end
        )
        if len(s.v)
    }
    length_share = reasons.get("length", 0.0) / max(1.0, sum(reasons.values()))
    prompt_b = read_buckets(source, (F.PROMPT.name,), scope, span, end)
    output_b = read_buckets(source, (F.GENERATION.name,), scope, span, end)
    try:
        prompt = fit_lognormal(prompt_b)
        output = fit_lognormal(output_b, length_share)
    except ValueError:
        raise FitError(
            f"{shown}: no prompt or output token histogram in the window "
            f"({F.PROMPT.name}, {F.GENERATION.name}); the lengths cannot be fitted"
        ) from None
    hit = _either(F.PREFIX_HITS_NAMES, scope)
    hits = _scalar(source, f"sum(increase({hit}[{span}]))", end)
    queries = _scalar(
        source, f"sum(increase({_either(F.PREFIX_QUERIES_NAMES, scope)}[{span}]))", end
    )
    prefix = hits / queries if hits is not None and queries else None
    counted = source.query(f"count by (job, instance, engine) ({F.RUNNING.name}{_sel(scope)})", end)
    servers = {(s.labels.get("job", ""), s.labels.get("instance", "")) for s in counted}
    instances = max(1, len(servers))
    engines = max(1, round(len(counted) / instances))
    notes = []
    window = None
    if part is not None:
        window = (start, end)
        start, end, rates = start + lo * step, start + hi * step, rates[lo:hi]
    if prompt.error > 0.1 or output.error > 0.1:
        notes.append(
            "the lengths are not log-normal (CDF off by up to "
            f"{max(prompt.error, output.error):.0%} at a bound): the replay's mix is approximate"
        )
    backlog = 0.0  # a window as chosen is replayed from empty queues, as it always was
    if window is not None:
        backlog = _scalar(source, f"sum({F.WAITING.name}{_sel(scope)})", start) or 0.0
    return Fit(
        model=model,
        start=start,
        end=end,
        rate_step=step,
        rates=rates,
        prompt=prompt,
        output=output,
        length_share=length_share,
        prefix_hit=prefix,
        instances=instances,
        engines=engines,
        cache=cache,
        measured=measured,
        notes=notes,
        window=window,
        backlog=backlog,
        prompt_hist=prompt_b,
        output_hist=output_b,
    )


def _cache(engine: object, shown: str) -> EngineCache:
    blocks = getattr(engine, "num_gpu_blocks", None)
    size = getattr(engine, "block_size", None)
    try:
        gmu = float(getattr(engine, "gpu_memory_utilization", ""))
    except ValueError:
        gmu = math.nan
    if not blocks or not size or not 0 < gmu <= 1:
        raise FitError(
            f"{shown}: vllm:cache_config_info lacks num_gpu_blocks, block_size or "
            "gpu_memory_utilization (an engine that has not profiled its memory yet?)"
        )
    return EngineCache(
        num_gpu_blocks=int(blocks),
        block_size=int(size),
        gpu_memory_utilization=gmu,
        cache_dtype=str(getattr(engine, "cache_dtype", "auto")) or "auto",
        enable_prefix_caching=str(getattr(engine, "enable_prefix_caching", "")) == "True",
    )


def models_with_traffic(
    source: MetricSource, selector: tuple[str, ...], start: float, end: float
) -> list[str]:
    """The models that finished requests in the window, busiest first."""
    span = f"{int(end - start)}s"
    found = source.query(
        f"sum by (model_name) (increase({F.SUCCESS.name}{_sel(selector)}[{span}])) > 0", end
    )
    ranked = sorted(found, key=lambda s: -float(s.v[-1]) if len(s.v) else 0.0)
    return [s.labels.get("model_name", "") for s in ranked]
