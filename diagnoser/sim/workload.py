"""Who sends what: arrival rates over time, prompt and output lengths, misbehaving clients.

Lengths are log-normal (median and spread), optionally mixed with a second, long-tailed
class (retrieval documents, batch jobs). Rates follow a curve (steady, diurnal, bursts) with
multiplicative noise, and arrivals within a tick are Poisson.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Lengths:
    median: float
    sigma: float = 0.6  # log-normal spread (0 = every request the same)
    min: int = 1
    max: int = 10**7
    # A second class: share of requests drawn from median_long / sigma_long instead.
    long_share: float = 0.0
    long_median: float = 0.0
    long_sigma: float = 0.3

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        out = (
            rng.lognormal(math.log(self.median), self.sigma, n)
            if self.sigma > 0
            else np.full(n, float(self.median))
        )
        if self.long_share > 0 and self.long_median > 0:
            long = rng.random(n) < self.long_share
            k = int(long.sum())
            if k:
                out[long] = rng.lognormal(math.log(self.long_median), self.long_sigma, k)
        return np.clip(np.rint(out), self.min, self.max).astype(np.int64)


@dataclass
class Rate:
    """Requests per second over time."""

    mean: float
    shape: str = "steady"  # steady | diurnal
    amplitude: float = 0.5  # diurnal: peak = mean * (1 + amplitude)
    peak_hour: float = 14.0  # diurnal: hour of day of the peak
    # diurnal: the hour of day at which the scenario starts. The curve follows the scenario's
    # own clock, so a scenario looks the same whenever it is simulated.
    start_hour: float = 0.0
    noise: float = 0.05  # relative sd of a slowly varying multiplicative noise
    burst_every: float = 0.0  # seconds between bursts (0: none)
    burst_length: float = 60.0
    burst_factor: float = 3.0

    def at(self, t: float, noise: float = 0.0) -> float:
        """Requests per second ``t`` seconds after the scenario started."""
        r = self.mean
        if self.shape == "diurnal":
            hour = (self.start_hour + t / 3600.0) % 24
            r *= 1 + self.amplitude * math.cos(2 * math.pi * (hour - self.peak_hour) / 24)
        if self.burst_every > 0 and (t % self.burst_every) < self.burst_length:
            r *= self.burst_factor
        return max(0.0, r * (1 + noise))


@dataclass
class Workload:
    rate: Rate
    prompt: Lengths
    output: Lengths
    max_tokens: int = 2048
    # Share of requests whose end-of-turn token the server does not treat as a stop: they
    # generate until max_tokens.
    stop_failure_share: float = 0.0
    # Share of requests whose prompt the client miscounted: longer than max_model_len, so the
    # server answers 400 before the engine sees them.
    overlong_share: float = 0.0
    # Share of each prompt that repeats a prefix other recent requests sent (a system prompt,
    # tool definitions, a shared document): what the prefix cache can serve. A template that
    # puts something unique (a timestamp, a request id) ahead of it makes it 0.
    prefix_share: float = 0.0
    # With speculative decoding: how often the drafter's next token is the one the target
    # model would give, each given the ones before it matched (alpha). Text that repeats its
    # context (code edits, extraction, templated answers) drafts well; open chat does not.
    draft_acceptance: float = 0.7
    # Share of the requests the router sends to the model's first live server (0: spread
    # evenly): session affinity on a few heavy tenants, a hash ring out of balance, a router
    # that does not look at load.
    hot_share: float = 0.0
    # LoRA: the number of adapters the requests name (0: all go to the base model), and how
    # unevenly they are used (Zipf exponent: 0 even, 1 the first adapter twice the second's).
    adapters: int = 0
    adapter_skew: float = 0.0
    _noise: float = field(default=0.0, repr=False)

    def step_noise(self, rng: np.random.Generator, dt: float) -> float:
        """A slowly varying noise term (Ornstein-Uhlenbeck, ~5 min correlation)."""
        theta = dt / 300.0
        sd = self.rate.noise
        self._noise += -theta * self._noise + sd * math.sqrt(2 * theta) * rng.standard_normal()
        return self._noise
