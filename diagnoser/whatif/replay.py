"""The fitted workload replayed through the simulator, read off its histograms directly.

A replay builds one model's scenario from a ``Fit`` (the arrival rate step by step, the
lengths in the shares of the server's histograms, the prefix-cache hits, the servers and
their engine) and runs the simulator's servers without writing any series: after a warm-up
at the window's first rates, the histograms and counters are read at the window's start and
end, and KV usage and the queue are sampled at every scrape interval, as Prometheus would
have. Every replay of one fit uses the same random draws, so two configurations see the same
requests.

A window of few requests is replayed several times over, each time with other draws of
arrivals and lengths, and the draws pooled: a p95 read off 200 requests rests on ten of them,
and one draw's TTFT p95 strays by a third either way. The pooled figures estimate what the
configuration does on average; the draws' spread says how far any one window of that length,
the measured one included, may stray from it by chance.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from diagnoser.hardware.presets import (
    GB,
    KV_CACHE_DTYPES,
    GpuSpec,
    ModelSpec,
    kv_capacity_tokens,
)
from diagnoser.kvbudget.budget import kv_value_bytes
from diagnoser.metrics import families as F
from diagnoser.metrics.exposition import Recorder
from diagnoser.sim.engine import EngineConfig
from diagnoser.sim.labels import Expectation
from diagnoser.sim.run import Simulation
from diagnoser.sim.scenario import Change, Client, ModelScenario, Probe, Scenario
from diagnoser.sim.server import ApiServerConfig, Fault
from diagnoser.sim.workload import Lengths, Rate, Workload
from diagnoser.whatif.fit import Fit
from diagnoser.whatif.stats import Buckets, LogNormal, Observed, length_table, pooled

WARMUP = 180.0  # seconds replayed at the window's first rates before it is read
RUSH = 60.0  # the warm-up's last seconds, in which the queue the window began with arrives
SCRAPE = 15.0  # seconds between samples of KV usage and the queue
TICK = 1.0
SEED = 2026
SMOOTH = 300.0  # seconds the measured arrival rate is averaged over
# Departures from that average this many times what counting explains are bursts, and kept.
BURSTY = 2.0
# Steps of rates it takes to tell bursts from chance (a few steps' spread is itself noise).
BURST_STEPS = 10
# Requests a replay serves over its draws together: a window with fewer is replayed again with
# other draws, up to MAX_DRAWS times (a draw costs as much as the window's requests).
DRAW_REQUESTS = 2000
MAX_DRAWS = 8
# A log-normal this close to a length histogram's CDF at every bound (or as close as chance
# lets the histogram be) is the lengths replayed; further, the histogram's buckets are.
LOGNORMAL_GAP = 0.02
# Simulated seconds between two looks at whether the replay is late (a few milliseconds of
# work at the busiest loads replayed).
LOOK = 30


@dataclass(frozen=True)
class Setup:
    """What the series do not say about the servers: the model's shape, the GPU, the
    scheduler's limits (vLLM's defaults unless the site says), the longest sequence."""

    spec: ModelSpec
    gpu: GpuSpec
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int | None = None
    tensor_parallel: int = 1


@dataclass(frozen=True)
class Config:
    """One configuration to replay: the engine, the servers, the output cap."""

    engine: EngineConfig
    instances: int
    max_tokens: int


def baseline(fit: Fit, setup: Setup) -> tuple[Config, list[str]]:
    """Today's configuration as the fit and the setup describe it, and notes on it. The
    runtime overhead is solved from the blocks the engine reports, so the replay's KV cache
    holds exactly as many blocks as the live one, and a change of memory or KV dtype moves
    it as vLLM's profiler would."""
    spec, g, c = setup.spec, setup.gpu, fit.cache
    tp = setup.tensor_parallel
    kv_bytes = kv_dtype_bytes(c.cache_dtype, spec)
    per_token = spec.kv_bytes_per_token(kv_bytes, tp)
    tokens = c.num_gpu_blocks * c.block_size
    overhead = g.memory_bytes * c.gpu_memory_utilization - spec.weight_bytes / tp
    overhead -= (tokens + 0.5) * per_token
    notes = []
    if overhead < 0:
        notes.append(
            f"the engine reports {tokens:,} KV tokens, more than {g.name} at "
            f"{c.gpu_memory_utilization:g} holds after {spec.name}'s weights: check --gpu "
            "and the model's shape"
        )
    longest = setup.max_model_len or spec.max_position
    if longest > tokens:
        notes.append(
            f"max_model_len taken as the KV capacity ({tokens:,} tokens), below the "
            f"model's {longest:,}: give --max-model-len"
        )
        longest = tokens
    cap = fit.output.cap
    max_tokens = round(cap) if cap is not None else longest
    engine = EngineConfig(
        max_num_seqs=setup.max_num_seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens,
        gpu_memory_utilization=c.gpu_memory_utilization,
        max_model_len=longest,
        block_size=c.block_size,
        kv_cache_dtype_bytes=kv_bytes,
        tensor_parallel=tp,
        enable_prefix_caching=c.enable_prefix_caching,
        prefix_hit_share=(fit.prefix_hit or 0.0) if c.enable_prefix_caching else 0.0,
        runtime_overhead_gb=overhead / GB,
    )
    got = engine.num_gpu_blocks(spec, g)
    assert abs(got - c.num_gpu_blocks) <= 1, (got, c.num_gpu_blocks)
    return Config(engine, fit.instances, max(1, max_tokens)), notes


def kv_dtype_bytes(cache_dtype: str, spec: ModelSpec) -> int:
    """Bytes per KV value of the type ``vllm:cache_config_info`` names, as the KV planner
    counts them (``auto``: the model's own type); every fp8 variant one."""
    if cache_dtype.startswith("fp8"):  # fp8_inc, fp8_ds_mla: not in the planner's table
        return 1
    known = cache_dtype if cache_dtype in KV_CACHE_DTYPES else "auto"
    return kv_value_bytes(known, spec.dtype)


def capacity_tokens(setup: Setup, engine: EngineConfig) -> int:
    return kv_capacity_tokens(
        setup.spec,
        setup.gpu,
        engine.gpu_memory_utilization,
        engine.runtime_overhead_gb * GB,
        engine.kv_cache_dtype_bytes,
        engine.tensor_parallel,
    )


def api_server(g: GpuSpec) -> ApiServerConfig:
    """The API server in front of the engine: a host-bound device's measured cost of a
    request before the engine sees it (its API server shares the engine's cores)."""
    if g.request_overhead is None:
        return ApiServerConfig()
    return ApiServerConfig(cpu_per_request=g.request_overhead)


def smooth(rates: np.ndarray, step: float, seconds: float = SMOOTH) -> np.ndarray:
    """The rates with their counting noise taken out. A step's measured count carries its
    own Poisson noise, and the replay draws Poisson arrivals again: replayed as measured, the
    load would be burstier than the measured one (twice the variance per step). So each rate
    is drawn towards its average over ``seconds``, by the share of its departure from that
    average that counting noise explains: all of it on a steady load, little of it where the
    load comes in bursts (which a replay at the average would never queue behind). Judged on
    ``BURST_STEPS`` steps or more; fewer are averaged, as the window's noise is."""
    k = max(1, round(seconds / step))
    if k == 1 or rates.size <= k:
        return rates
    padded = np.pad(rates, (k // 2, k - 1 - k // 2), mode="edge")
    base = np.convolve(padded, np.ones(k) / k, mode="valid")
    left = rates - base
    spread = float(np.mean(left**2))
    counting = float(np.mean(np.maximum(base, 0.0))) / step  # a count's variance is its mean
    bursty = rates.size >= BURST_STEPS and spread > BURSTY * counting
    keep = 1.0 - counting / spread if bursty else 0.0
    return np.asarray(base + keep * left, dtype=np.float64)


def lognormal_fits(shape: LogNormal, count: float) -> bool:
    """Whether the log-normal's largest gap to the CDF of ``count`` measured lengths is within
    chance (twice a CDF's standard error at its widest, ``1/sqrt(count)``), or within
    ``LOGNORMAL_GAP`` however many there are."""
    return shape.error <= max(LOGNORMAL_GAP, 1.0 / math.sqrt(max(count, 1.0)))


@dataclass
class Measured(Lengths):
    """Lengths drawn from a table of cumulative shares and log-lengths (``length_table``):
    the server's histogram, bucket by bucket."""

    shares: np.ndarray = dataclasses.field(default_factory=lambda: np.array([0.0, 1.0]))
    logs: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(2))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        drawn = np.exp(np.interp(rng.random(n), self.shares, self.logs))
        return np.asarray(np.clip(np.rint(drawn), self.min, self.max), dtype=np.int64)


def lengths(shape: LogNormal, hist: Buckets | None, top: int) -> Lengths:
    """What the replay draws lengths from: the log-normal where it is as close to the
    histogram as chance lets a histogram be (``lognormal_fits``), else the histogram's
    buckets in their measured shares, shaped within each by the log-normal
    (``length_table``). A log-normal a few points off the buckets' CDF can hold a second
    class of long prompts (documents among chat turns) at a fraction of its weight, and long
    prompts are what fill a KV cache and make it preempt."""
    if hist is None or hist.count <= 0 or lognormal_fits(shape, hist.count):
        return Lengths(median=shape.median, sigma=shape.sigma)
    shares, logs = length_table(hist, shape, max(2, top))
    return Measured(median=shape.median, sigma=shape.sigma, shares=shares, logs=logs)


def scenario(fit: Fit, setup: Setup, cfg: Config, seed: int = SEED) -> Scenario:
    """The fit as a one-model scenario: a warm-up, then the window's rates step by step
    (the scenario's objects are its own: the simulation changes them as it runs)."""
    rates = smooth(fit.rates, fit.rate_step) if fit.rates.size else np.array([fit.mean_rate])
    first = float(rates[: max(1, int(300 / fit.rate_step))].mean())
    # The queue the servers began the window with arrives in the warm-up's last ``RUSH``
    # seconds, over the first rates: as long at the window's start, where the servers serve
    # no faster than the load (and drained by then where they do, as it would have been).
    timeline = [
        Change(at=WARMUP + k * fit.rate_step, set={"workload.rate.mean": float(r)})
        for k, r in enumerate(rates)
    ]
    if fit.backlog >= 1:
        rushed = first + fit.backlog / RUSH
        timeline.insert(0, Change(at=WARMUP - RUSH, set={"workload.rate.mean": rushed}))
    workload = Workload(
        rate=Rate(mean=first, noise=0.0),
        prompt=lengths(fit.prompt, fit.prompt_hist, cfg.engine.max_model_len - 1),
        output=lengths(fit.output, fit.output_hist, cfg.engine.max_model_len),
        max_tokens=cfg.max_tokens,
    )
    m = ModelScenario(
        name=fit.model,
        spec=setup.spec,
        gpu=setup.gpu,
        engine=dataclasses.replace(cfg.engine),
        api=api_server(setup.gpu),
        workload=workload,
        client=Client(),
        probe=Probe(),
        fault=Fault(),
        instances=cfg.instances,
        engines=fit.engines,
        dcgm=False,
        timeline=timeline,
    )
    return Scenario(
        name="what-if",
        description="a fitted window",
        duration=WARMUP + fit.seconds,
        scrape_interval=SCRAPE,
        seed=seed,
        models=[m],
        labels=Expectation(),
    )


@dataclass
class _Tally:
    ttft: Buckets
    itl: Buckets
    prefill: Buckets
    preemptions: float
    finished: float
    tokens: float


def _tally(run: object) -> _Tally | None:
    """The model's histograms and counters summed over its servers and engines."""
    hists: dict[str, Buckets] = {}
    pre = fin = tok = 0.0
    for server in getattr(run, "servers", []):
        if not server.up:
            continue
        for em in server.em:
            for name in (F.TTFT.name, F.ITL.name, F.PREFILL.name):
                h = em.h[name]
                b = Buckets(h.bounds, h.cumulative(), h.sum)
                hists[name] = hists[name].plus(b) if name in hists else b
            pre += em.counters[F.PREEMPTIONS]
            fin += sum(em.finished.values())
            tok += em.counters[F.GENERATION_TOKENS]
    if len(hists) < 3:
        return None
    return _Tally(hists[F.TTFT.name], hists[F.ITL.name], hists[F.PREFILL.name], pre, fin, tok)


class ReplayError(RuntimeError):
    """The replayed servers did not serve (the configuration does not start)."""


class OutOfTime(ReplayError):
    """The replay was stopped: its command's deadline passed (or its command ended)."""

    def __init__(self) -> None:
        super().__init__("the deadline passed")


def draws(fit: Fit) -> int:
    """Draws of the window a replay pools: enough for ``DRAW_REQUESTS`` requests."""
    return max(1, min(MAX_DRAWS, math.ceil(DRAW_REQUESTS / max(1.0, fit.measured.finished))))


Late = Callable[[], bool]


def replay(
    fit: Fit, setup: Setup, cfg: Config, late: Late | None = None, first: int = 0
) -> Observed:
    """Replay the fit at ``cfg``; what the servers did over the window's span, pooled over
    ``draws(fit)`` draws, each from the same warm-up (a queue that runs away grows as long in
    each as it would in the window), the draws ``first`` onwards. ``OutOfTime`` once
    ``late()`` says so."""
    seeds = range(SEED + first, SEED + first + draws(fit))
    return pooled([observe(scenario(fit, setup, cfg, seed), WARMUP, late) for seed in seeds])


def observe(sc: Scenario, skip: float, late: Late | None = None) -> Observed:
    """Simulate ``sc`` (its first model) and read what it did after the first ``skip``
    seconds, without writing any series; ``OutOfTime`` once ``late()`` (asked every ``LOOK``
    simulated seconds) says the replay's time is up."""
    sim = Simulation(sc, Recorder(history=False), 0.0)
    run = sim.runs[0]
    if not all(s.up for s in run.servers):
        raise ReplayError("the engine does not start at this configuration")
    kv: list[float] = []
    waiting: list[float] = []
    start: _Tally | None = None
    t, next_scrape = 0.0, skip + SCRAPE
    end = sc.duration
    ticks = 0
    while t < end - 1e-9:
        ticks += 1
        if late is not None and ticks % LOOK == 0 and late():
            raise OutOfTime()
        run.step(t, TICK)
        t += TICK
        if start is None and t >= skip - 1e-9:
            run._collect()
            start = _tally(run)
        if t >= next_scrape - 1e-9:
            next_scrape += SCRAPE
            engines = [e for s in run.servers if s.up for e in s.engines]
            kv.append(float(np.mean([e.kv_usage() for e in engines])) if engines else 0.0)
            waiting.append(float(sum(sum(1 for r in e.waiting if r.ready <= t) for e in engines)))
    run._collect()
    last = _tally(run)
    if start is None or last is None:
        raise ReplayError("the replayed servers went down")
    return Observed(
        ttft=last.ttft.minus(start.ttft),
        itl=last.itl.minus(start.itl),
        kv_usage=float(np.mean(kv)) if kv else None,
        preemptions=last.preemptions - start.preemptions,
        waiting=float(np.mean(waiting)) if waiting else None,
        finished=last.finished - start.finished,
        generation_tokens=last.tokens - start.tokens,
        seconds=end - skip,
        prefill=last.prefill.minus(start.prefill),
    )
