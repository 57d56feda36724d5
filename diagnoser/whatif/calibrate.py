"""The simulator fitted to this server: two speed factors, and whether the replay matches.

The replay at today's configuration is compared with what was measured. Two factors are
fitted, no more: prefill speed (the share of peak FLOP/s, ``mfu``) from the mean prefill time
(``vllm:request_prefill_time_seconds``, from a request's scheduling to its first token; the
TTFT median where the server lacks it), and decode speed (the share of peak bandwidth, and
the host's costs per step and per sequence) from the mean inter-token latency. Means, not
medians: a histogram's sum is exact where a median is read inside a bucket, and the ITL's
50-75 ms bucket is half as wide as its lower bound, while a queue near saturation turns a
few percent of decode speed into a factor of two in TTFT. First each factor is the ratio of
replayed to measured mean, then secant steps follow, replaying again until both means are
within 3% (at most six replays).

Then every figure compared (TTFT and ITL p50 and p95, KV usage, preemptions, the queue) must
be within 30% of the measured one, or within a small absolute margin for figures near zero,
or within twice the spread of the replay's own draws of a window as long (``NOISE_Z``): the
measured window is one draw too, and a p95 read off a few hundred requests strays further
than 30% by chance. A replay of one draw (a window of many requests) has no such spread of
its own: before it refuses, a second draw of other requests at the same speeds is replayed
and the two judged together, since near overload one draw's queue can be twice another's.
Otherwise the calibration refuses and nothing is predicted. What is left (the residual of
each figure) is the uncertainty every prediction carries.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnoser.hardware.presets import GpuSpec
from diagnoser.whatif.replay import Config
from diagnoser.whatif.stats import Observed, pooled

TOLERANCE = 0.30
CLOSE_ENOUGH = 0.03  # means this close need no factor
# Figures compared, with the absolute margin under which a difference is noise.
CHECKED: dict[str, float] = {
    "ttft_p50": 0.005,
    "ttft_p95": 0.02,
    "itl_p50": 0.002,
    "itl_p95": 0.004,
    "kv_usage": 0.05,
    "preemptions_per_second": 0.02,
    "waiting": 1.0,
}
# Standard deviations of one window's draws within which a difference is chance.
NOISE_Z = 2.0
# The speed factors stay where a GPU can be: a factor that would take the efficiency past
# the peak, or below a quarter of the preset's, says the GPU or the model is not what was
# assumed.
LOWEST, HIGHEST = 0.25, 4.0
# Replays of today the fit may take (the first at the preset's speed).
MAX_REPLAYS = 6
# Means this close after a replay: the next replay is likely the fit's last (its levers are
# worth replaying beside it).
NEAR = 0.05


@dataclass
class Calibration:
    ok: bool
    reason: str | None
    prefill_factor: float
    decode_factor: float
    config: Config  # today's configuration with the fitted factors
    measured: dict[str, float | None]
    replayed: dict[str, float | None]
    residual: dict[str, float | None] = field(default_factory=dict)  # relative, or absolute
    replays: int = 0
    # Per figure, the standard deviation of one window-long draw of the replay (None: one
    # draw, a window long enough for chance to matter little).
    noise: dict[str, float | None] = field(default_factory=dict)
    # Not finished: the deadline passed before today's replays did (nothing is predicted).
    late: bool = False


def relative(name: str, measured: float | None) -> bool:
    """Whether a figure's residual is relative to the measured figure (else absolute: a
    figure measured within its margin of noise of zero)."""
    return measured is not None and abs(measured) > CHECKED.get(name, 0.0)


def gap(
    name: str, replayed: float | None, measured: float | None, noise: float | None = None
) -> tuple[float | None, bool]:
    """The residual of one figure (relative to the measured one; absolute under the figure's
    margin) and whether it is within the tolerance (or within ``NOISE_Z`` times ``noise``, the
    spread of one window's draws)."""
    if replayed is None or measured is None:
        return None, True
    margin = max(CHECKED.get(name, 0.0), NOISE_Z * noise if noise else 0.0)
    diff = replayed - measured
    if relative(name, measured):
        rel = diff / abs(measured)
        return rel, abs(rel) <= TOLERANCE or abs(diff) <= margin
    return diff, abs(diff) <= margin


def with_factors(cfg: Config, prefill: float, decode: float, gpu: GpuSpec) -> Config:
    """``cfg`` on an engine ``prefill`` times as fast at prefill (FLOP/s) and ``decode`` times
    as fast at decode: the bandwidth, and the host's costs of a step and of a sequence in it,
    which are most of a decode step on a host-bound device (vLLM's CPU build)."""
    base = cfg.engine
    if (prefill, decode) == (1.0, 1.0):
        return dataclasses.replace(cfg, engine=dataclasses.replace(base))
    overhead, per_seq = base.step_costs(gpu)
    engine = dataclasses.replace(
        base,
        mfu=base.mfu * prefill,
        mbu=base.mbu * decode,
        step_overhead=overhead / decode,
        step_overhead_per_seq=per_seq / decode,
    )
    return dataclasses.replace(cfg, engine=engine)


class Fitting:
    """The two speed factors, fitted replay by replay: after each replay of today, ``next``
    gives the factors to replay at next, or None when the means match (within
    ``CLOSE_ENOUGH``) or ``MAX_REPLAYS`` are spent. The first step takes each factor as the
    ratio of replayed to measured mean (a step time proportional to the speed); the next
    ones are secant steps on the logarithms, since under load the mean answers more than in
    proportion (a queue that forms or goes) and the ratio alone overshoots."""

    def __init__(self, today: Config, gpu: GpuSpec, want: dict[str, float | None]):
        self.want = want
        e, host = today.engine, gpu.host_bound  # a CPU's peak is no bound its preset knows
        self.high = (
            HIGHEST if host else min(HIGHEST, 1.0 / e.mfu),
            HIGHEST if host else min(HIGHEST, 1.0 / e.mbu),
        )
        self.tried: list[tuple[tuple[float, float], tuple[float, float]]] = []

    @property
    def replays(self) -> int:
        return len(self.tried)

    @property
    def near(self) -> bool:
        """Whether the last replay's means were within ``NEAR`` of the measured ones."""
        return bool(self.tried) and all(abs(r - 1) <= NEAR for r in self.tried[-1][1])

    def next(
        self, at: tuple[float, float], got: dict[str, float | None]
    ) -> tuple[float, float] | None:
        prefill, decode = self._targets(got)
        ratios = (_ratio(got.get(prefill), self.want.get(prefill)),
                  _ratio(got.get(decode), self.want.get(decode)))  # fmt: skip
        self.tried.append((at, ratios))
        if all(abs(r - 1) <= CLOSE_ENOUGH for r in ratios) or self.replays >= MAX_REPLAYS:
            return None
        new = tuple(_clamp(self._step(k), self.high[k]) for k in range(2))
        if new == at:  # held at a bound: another replay would give the same
            return None
        return new[0], new[1]

    def _targets(self, got: dict[str, float | None]) -> tuple[str, str]:
        """The figures the two factors are fitted to: the mean prefill time where both the
        server and the replay have it (else the TTFT median), and the ITL's mean."""
        known = got.get("prefill_mean") and self.want.get("prefill_mean")
        return ("prefill_mean" if known else "ttft_p50"), "itl_mean"

    def _step(self, k: int) -> float:
        (f1, r1) = self.tried[-1][0][k], self.tried[-1][1][k]
        if abs(r1 - 1) <= CLOSE_ENOUGH / 2:
            return f1
        slope = -1.0  # d log(replayed mean) / d log(factor) when the step time is all
        if len(self.tried) > 1:
            f0, r0 = self.tried[-2][0][k], self.tried[-2][1][k]
            if f0 != f1:
                s = (math.log(r1) - math.log(r0)) / (math.log(f1) - math.log(f0))
                if -8.0 <= s <= -0.25:  # the means fall as the speed rises; else keep -1
                    slope = s
        return f1 * math.exp(-math.log(r1) / slope)


def _clamp(factor: float, high: float) -> float:
    return round(min(max(factor, LOWEST), high), 4)


def judge(
    today: Config,
    gpu: GpuSpec,
    prefill: float,
    decode: float,
    got: dict[str, float | None],
    want: dict[str, float | None],
    replays: int,
    noise: dict[str, float | None] | None = None,
) -> Calibration:
    """The calibration: ``got``, the replay at today's configuration with the factors, against
    ``want``; it refuses when any figure is off by more than the tolerance and by more than
    chance (``noise``: each figure's spread over the replay's draws)."""
    noise = noise or {}
    residual: dict[str, float | None] = {}
    off, missed = [], []
    for name in CHECKED:
        r, within = gap(name, got[name], want[name], noise.get(name))
        residual[name] = r
        if not within:
            chance = noise.get(name)
            by = f", chance ±{NOISE_Z * chance:.3g}" if chance else ""
            rel = f" ({r:+.0%})" if r is not None and relative(name, want[name]) else ""
            off.append(
                f"{name.replace('_', ' ')} {_show(got[name])} against {_show(want[name])}{rel}{by}"
            )
            missed.append(name)
    reason = None
    if off:
        reason = (
            f"the replay does not match the window within {TOLERANCE:.0%} after fitting "
            f"prefill x{prefill:.2f} and decode x{decode:.2f}: " + "; ".join(off)
        )
        reason += "; what may let it match: " + "; ".join(remedies(missed))
    return Calibration(
        ok=not off,
        reason=reason,
        prefill_factor=prefill,
        decode_factor=decode,
        config=with_factors(today, prefill, decode, gpu),
        measured=want,
        replayed=got,
        residual=residual,
        replays=replays,
        noise={name: noise.get(name) for name in CHECKED},
    )


# What may let a replay match the window, by the figure it missed (the first of a kind said).
REMEDIES = {
    "ttft_p50": "queue",
    "ttft_p95": "queue",
    "waiting": "queue",
    "kv_usage": "cache",
    "preemptions_per_second": "cache",
    "itl_p50": "decode",
    "itl_p95": "decode",
}
REMEDY = {
    "queue": "a steadier period (--since/--until around the incident's plateau, or a longer "
    "--since): the servers ran near what they serve, where a few percent of speed is a "
    "factor in the queue",
    "cache": "the engine's flags as the servers run them (--max-num-seqs, "
    "--max-num-batched-tokens, --max-model-len) and the model's shape and --gpu, which size "
    "the KV cache replayed",
    "decode": "the model's shape, --dtype, --gpu and --tensor-parallel as served (the decode "
    "step's cost), or a window without a change of load inside it",
}


def remedies(missed: list[str]) -> list[str]:
    """What may let the replay match, for the figures it ``missed``, each said once."""
    kinds = dict.fromkeys(REMEDIES[name] for name in missed if name in REMEDIES)
    return [REMEDY[k] for k in kinds]


def unfinished(
    today: Config,
    gpu: GpuSpec,
    prefill: float,
    decode: float,
    want: dict[str, float | None],
    replays: int,
) -> Calibration:
    """The calibration the deadline cut short: not ok, nothing replayed to judge by."""
    return Calibration(
        ok=False,
        reason="the deadline passed before the calibration finished (--timeout bounds the "
        "whole command: give it longer, or a shorter --since)",
        prefill_factor=prefill,
        decode_factor=decode,
        config=with_factors(today, prefill, decode, gpu),
        measured=want,
        replayed=dict.fromkeys(want),
        residual=dict.fromkeys(CHECKED),
        replays=replays,
        noise=dict.fromkeys(CHECKED),
        late=True,
    )


def judge_replay(
    today: Config,
    gpu: GpuSpec,
    at: tuple[float, float],
    want: dict[str, float | None],
    replays: int,
    obs: Observed,
    slo: tuple[float, float],
) -> Calibration:
    """``judge`` of a replay of today at the factors ``at``: its figures against ``want``,
    with their spread over the replay's draws as chance."""
    return judge(today, gpu, *at, obs.figures(*slo), want, replays, obs.noise(*slo))


def calibrate(
    today: Config,
    gpu: GpuSpec,
    measured: Observed,
    run: Callable[[Config], Observed],
    slo: tuple[float, float],
    again: Callable[[Config], Observed] | None = None,
) -> tuple[Calibration, Observed]:
    """Fit the two factors with ``run`` (a replay at a configuration), one replay after
    another; the calibration and the replay of today that the predictions are compared
    with. A replay of one draw that does not match is judged again with a second draw
    (``again``: the same configuration, other requests) beside it, so that chance has a
    measure before the calibration refuses. (``predict`` runs the same steps with the
    levers' replays alongside.)"""
    want = measured.figures(*slo)
    fitting = Fitting(today, gpu, seen(measured, slo))
    at = (1.0, 1.0)
    got_obs = run(today)
    while (step := fitting.next(at, seen(got_obs, slo))) is not None:
        at = step
        got_obs = run(with_factors(today, *at, gpu))
    cal = judge_replay(today, gpu, at, want, fitting.replays, got_obs, slo)
    if not cal.ok and again is not None and not got_obs.parts:
        got_obs = pooled([got_obs, again(with_factors(today, *at, gpu))])
        cal = judge_replay(today, gpu, at, want, fitting.replays + 1, got_obs, slo)
    return cal, got_obs


def seen(obs: Observed, slo: tuple[float, float]) -> dict[str, float | None]:
    """What the fit looks at in a window or a replay: its figures and its speeds."""
    return {**obs.figures(*slo), **obs.speeds()}


def _ratio(replayed: float | None, measured: float | None) -> float:
    """How much faster the server is than the replay (replayed / measured); 1 unknown."""
    if not replayed or not measured or not math.isfinite(replayed / measured):
        return 1.0
    return replayed / measured


def _show(value: float | None) -> str:
    return "none" if value is None else f"{value:.3g}"
