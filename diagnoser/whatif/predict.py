"""What-if, end to end: calibrate the replay to the window, then replay each lever.

Each lever's figures are the replay at the lever's configuration, next to today's (measured)
and to today's replay; its band is the calibration's residual for that figure (relative, or
absolute for figures near zero), which is how far the replay was from the truth on the one
configuration where the truth is known. Lever replays run in parallel processes.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from diagnoser.catalog.levers import Lever, LeverError
from diagnoser.whatif.calibrate import CHECKED, Calibration, calibrate
from diagnoser.whatif.fit import Fit
from diagnoser.whatif.levers import turn
from diagnoser.whatif.replay import Config, ReplayError, Setup, baseline, replay
from diagnoser.whatif.stats import METRICS, Observed


@dataclass
class Outcome:
    """One lever's prediction, or why there is none."""

    lever: Lever
    change: str = ""
    predicted: dict[str, float | None] = field(default_factory=dict)
    band: dict[str, float | None] = field(default_factory=dict)
    error: str | None = None


@dataclass
class WhatIf:
    fit: Fit
    setup: Setup
    today: Config
    calibration: Calibration
    replayed: dict[str, float | None]
    outcomes: list[Outcome]
    slo: tuple[float, float]
    notes: list[str]
    seconds: float = 0.0


def _run(args: tuple[Fit, Setup, Config]) -> Observed:
    return replay(*args)


def band(name: str, residual: float | None, value: float | None) -> float | None:
    """The ± on a predicted figure: the calibration's residual (relative: times the figure;
    absolute for a figure compared absolutely), and never less than the figure's margin of
    noise (``calibrate.CHECKED``)."""
    margin = CHECKED.get(name)
    if margin is None or residual is None or value is None:
        return None
    spread = abs(residual * value) if abs(value) > margin else abs(residual)
    return max(spread, margin)


def what_if(
    fit: Fit,
    setup: Setup,
    levers: list[Lever],
    slo: tuple[float, float],
    workers: int | None = None,
) -> WhatIf:
    """Calibrate to ``fit`` and predict each lever (none when the calibration refuses)."""
    t0 = time.monotonic()
    today, notes = baseline(fit, setup)
    outcomes = [Outcome(lever) for lever in levers]
    # Most servers need no speed factor: today's replay and the levers' run together, and
    # the levers are replayed again only if the calibration fits a factor.
    jobs = _configs(outcomes, today, fit, setup)
    first = _replay_all(fit, setup, [today, *(c for _, c in jobs)], workers)
    done: dict[int, Observed | str] = {id(today): first[0]}

    def run(cfg: Config) -> Observed:
        got = done.pop(id(cfg), None)
        if isinstance(got, Observed):
            return got
        if isinstance(got, str):
            raise ReplayError(got)
        return replay(fit, setup, cfg)

    cal, today_obs = calibrate(today, fit.measured, run, slo)
    replayed = today_obs.figures(*slo)
    results = first[1:]
    if cal.ok and (cal.prefill_factor, cal.decode_factor) != (1.0, 1.0):
        jobs = _configs(outcomes, cal.config, fit, setup)
        results = _replay_all(fit, setup, [c for _, c in jobs], workers)
    if cal.ok:
        for (i, _), result in zip(jobs, results, strict=True):
            out = outcomes[i]
            if isinstance(result, str):
                out.error = result
                continue
            out.predicted = result.figures(*slo)
            out.band = {m: band(m, cal.residual.get(m), out.predicted.get(m)) for m in METRICS}
    return WhatIf(
        fit=fit,
        setup=setup,
        today=cal.config,
        calibration=cal,
        replayed=replayed,
        outcomes=outcomes,
        slo=slo,
        notes=[*fit.notes, *notes],
        seconds=time.monotonic() - t0,
    )


def _configs(
    outcomes: list[Outcome], cfg: Config, fit: Fit, setup: Setup
) -> list[tuple[int, Config]]:
    """Each lever's configuration from ``cfg``, by outcome; a lever that cannot be turned
    gets its reason instead."""
    jobs: list[tuple[int, Config]] = []
    for i, out in enumerate(outcomes):
        out.error = None
        try:
            turned, out.change = turn(out.lever, cfg, fit, setup)
        except LeverError as exc:
            out.error = str(exc)
            continue
        jobs.append((i, turned))
    return jobs


def _replay_all(
    fit: Fit, setup: Setup, configs: list[Config], workers: int | None
) -> list[Observed | str]:
    """Each configuration replayed, in parallel processes where there are cores for it."""
    n = min(len(configs), workers or os.cpu_count() or 1)
    args = [(fit, setup, c) for c in configs]
    out: list[Observed | str] = []
    if n <= 1:
        for a in args:
            out.append(_safe(a))
        return out
    with ProcessPoolExecutor(max_workers=n) as pool:
        return list(pool.map(_safe, args))


def _safe(args: tuple[Fit, Setup, Config]) -> Observed | str:
    try:
        return _run(args)
    except ReplayError as exc:
        return str(exc)
