"""What-if, end to end: calibrate the replay to the window, then replay each lever.

Each lever's figures are the replay at the lever's configuration, next to today's (measured)
and to today's replay; its band is the calibration's residual for that figure (relative, or
absolute for figures near zero), which is how far the replay was from the truth on the one
configuration where the truth is known, and never less than what chance does to a window as
long (the spread of the lever's draws, for a short window). Replays run in parallel
processes, two at a time on two cores.

A latency quantile can sit on a knee of its distribution, where a point more or fewer of the
observations on the slow side moves it several times over: ITL p95 when about 5% of the
tokens wait behind a prefill step. There the figure is as uncertain as the replay's shares,
whatever the calibration matched, and the lever says so (``knee``: the quantile a point
either side).
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import BrokenExecutor, CancelledError, ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from diagnoser.catalog.levers import Lever, LeverError
from diagnoser.whatif.calibrate import (
    CHECKED,
    NOISE_Z,
    Calibration,
    Fitting,
    judge_replay,
    relative,
    seen,
    unfinished,
    with_factors,
)
from diagnoser.whatif.fit import Fit
from diagnoser.whatif.levers import turn
from diagnoser.whatif.replay import (
    Config,
    Late,
    OutOfTime,
    ReplayError,
    Setup,
    baseline,
    draws,
    replay,
)
from diagnoser.whatif.stats import METRICS, Observed, pooled


@dataclass
class Outcome:
    """One lever's prediction, or why there is none."""

    lever: Lever
    change: str = ""
    predicted: dict[str, float | None] = field(default_factory=dict)
    band: dict[str, float | None] = field(default_factory=dict)
    # Latency quantiles on a knee: their values ``SHARE`` of the observations either side.
    knee: dict[str, tuple[float, float]] = field(default_factory=dict)
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


# How far the replay's shares of slow observations are trusted to be from the server's: at
# the two levers of the lab's vLLM whose ITL p95 the replay missed by 2-3.5 times, the share
# of tokens over 0.2 s (behind a prefill step; the mechanism confirmed by a trace of the
# server's steps) was 0.8 and 0.6 points below the server's (4.8% against 5.6%, 4.3% against
# 4.9%).
SHARE = 0.01
# A quantile is on a knee when a point either side leaves this much of it (or its band).
KNEE = 0.25
# What a lever (or today's replay) not done by the deadline says instead.
LATE = str(OutOfTime())
# Seconds a worker is given to stop once told to, before it is killed; between two looks of
# a worker at whether its command is still there.
GRACE = 1.0
WATCH = 0.2
# Seconds to wait for a killed worker to be gone (only a process stuck in the kernel takes long).
REAPED = 10.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies


def band(
    name: str,
    residual: float | None,
    relative: bool,
    value: float | None,
    noise: float | None = None,
) -> float | None:
    """The ± on a predicted figure: the calibration's residual (``relative``: times the
    figure; else as it is, for a figure measured near zero), and never less than the figure's
    margin of noise (``calibrate.CHECKED``) nor than the chance a window as long as the
    measured one leaves (``NOISE_Z`` times ``noise``, the spread of the lever's draws)."""
    margin = CHECKED.get(name)
    if margin is None or residual is None or value is None:
        return None
    spread = abs(residual * value) if relative else abs(residual)
    return max(spread, margin, NOISE_Z * noise if noise else 0.0)


def what_if(
    fit: Fit,
    setup: Setup,
    levers: list[Lever],
    slo: tuple[float, float],
    workers: int | None = None,
    deadline: float | None = None,
) -> WhatIf:
    """Calibrate to ``fit`` and predict each lever (none when the calibration refuses).

    Today's replays come first, one after another while the fit goes on. Once the last one
    came near (``Fitting.near``: the next is likely the last), the spare workers replay the
    levers at the factors being tried, alongside it; a replay that moves the factors again
    drops them (those not yet started cost nothing). The levers wait for the calibration
    otherwise: on a machine shared with other work, replays that a refusal or a further step
    would throw away take the time of those that count. A replay of one draw that does not
    match is judged again beside a second draw of other requests (``calibrate.calibrate``),
    on the first worker free. A refusal replays no lever.

    ``deadline`` (``time.monotonic()``) bounds it all: a replay not done by then is stopped,
    and what it would have said is ``LATE`` (the calibration: ``late``, nothing predicted).
    The same lever given twice is replayed once."""
    t0 = time.monotonic()
    today, notes = baseline(fit, setup)
    outcomes = [Outcome(lever) for lever in unique(levers)]
    want = fit.measured.figures(*slo)
    fitting = Fitting(today, setup.gpu, seen(fit.measured, slo))
    n = max(1, min(workers or os.cpu_count() or 1, 1 + len(outcomes)))
    at = (1.0, 1.0)
    with _Replays(fit, setup, n, deadline) as pool:
        pending = pool.submit(today)
        jobs = _configs(outcomes, today, fit, setup)
        results: list[_Pending] = []
        today_obs = _observed(pool.wait(pending))
        while today_obs is not None and (step := fitting.next(at, seen(today_obs, slo))):
            for f in results:  # replays at the speed just left behind
                f.cancel()
            at = step
            cfg = with_factors(today, *at, setup.gpu)
            pending = pool.submit(cfg)
            jobs = _configs(outcomes, cfg, fit, setup)
            results = [pool.submit(c) for _, c in jobs] if fitting.near else []
            today_obs = _observed(pool.wait(pending))
        if today_obs is None:  # the deadline passed: nothing to calibrate by
            cal = unfinished(today, setup.gpu, *at, want, fitting.replays)
            for i, _ in jobs:
                outcomes[i].error = LATE
        else:
            cal = judge_replay(today, setup.gpu, at, want, fitting.replays, today_obs, slo)
            if not cal.ok and not today_obs.parts:  # one draw: how far chance moves it is unknown
                held = [f.cancel() for f in results]  # levers not started wait behind it
                again = pool.submit(with_factors(today, *at, setup.gpu), draws(fit))
                other = _observed(pool.wait(again))
                if other is not None:
                    today_obs = pooled([today_obs, other])
                    replays = fitting.replays + 1
                    cal = judge_replay(today, setup.gpu, at, want, replays, today_obs, slo)
                if cal.ok:
                    results = [
                        pool.submit(c) if cancelled else f
                        for (_, c), f, cancelled in zip(jobs, results, held, strict=True)
                    ]
            if cal.ok:
                results = results or [pool.submit(cfg) for _, cfg in jobs]
                for (i, _), f in zip(jobs, results, strict=False):
                    _predicted(outcomes[i], pool.wait(f), cal, want, slo)
    return WhatIf(
        fit=fit,
        setup=setup,
        today=cal.config,
        calibration=cal,
        replayed=dict(cal.replayed),
        outcomes=outcomes,
        slo=slo,
        notes=[*fit.notes, *notes, *_knife_edge(cal)],
        seconds=time.monotonic() - t0,
    )


def unique(levers: list[Lever]) -> list[Lever]:
    """Each lever once (by its normalised text: ``max_num_seqs=x0.75`` is
    ``max_num_seqs:x0.75``), in the order first given."""
    seen: dict[str, Lever] = {}
    for lever in levers:
        seen.setdefault(lever.text, lever)
    return list(seen.values())


def _predicted(
    out: Outcome,
    result: Observed | str,
    cal: Calibration,
    want: dict[str, float | None],
    slo: tuple[float, float],
) -> None:
    """Fill ``out`` from its lever's replay (or why there is none), banded by ``cal``."""
    if isinstance(result, str):
        out.error = result
        return
    out.predicted = result.figures(*slo)
    chance = result.noise(*slo)
    out.band = {
        m: band(
            m, cal.residual.get(m), relative(m, want.get(m)), out.predicted.get(m), chance.get(m)
        )
        for m in METRICS
    }
    out.knee = knees(out.predicted, out.band, result.either_side(SHARE))


def knees(
    predicted: dict[str, float | None],
    bands: dict[str, float | None],
    either_side: dict[str, tuple[float, float]],
) -> dict[str, tuple[float, float]]:
    """The latency quantiles on a knee: where the quantile ``SHARE`` below or above it lies
    outside the figure's band and further than ``KNEE`` of it away."""
    out = {}
    for name, (lo, hi) in either_side.items():
        v = predicted.get(name)
        if v is None:
            continue
        reach = max(bands.get(name) or 0.0, KNEE * v)
        if lo < v - reach or hi > v + reach:
            out[name] = (lo, hi)
    return out


def _knife_edge(cal: Calibration) -> list[str]:
    """A note when chance alone moves today's TTFT median by more than the median itself:
    some draws of the window queue without bound and others do not, so the load sits on the
    edge of overload, and the calibration's match and every band say little."""
    spread, value = cal.noise.get("ttft_p50"), cal.replayed.get("ttft_p50")
    if spread is None or value is None or NOISE_Z * spread <= value:
        return []
    return [
        f"the replay's draws of this window disagree: chance alone moves the TTFT median by "
        f"±{NOISE_Z * spread:.3g} s around {value:.3g} s, as a queue runs away in some draws "
        "and not in others; the load is on the edge of overload, and the calibration and "
        "every prediction carry that spread (a longer window at a steady load narrows it)"
    ]


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


def _observed(got: Observed | str) -> Observed | None:
    """Today's replay, or None when the deadline passed first; a configuration that does not
    serve cannot be calibrated."""
    if got == LATE:
        return None
    if isinstance(got, str):
        raise ReplayError(got)
    return got


# A replay's arguments: the fit, the setup, the configuration, the first draw.
_Args = tuple[Fit, Setup, Config, int]


class _Pending(Protocol):
    def result(self, timeout: float | None = None) -> Observed | str: ...

    def cancel(self) -> bool: ...


class _Later:
    """A replay in this process, run when its result is first asked for (never, once
    cancelled), stopped when ``late()``."""

    def __init__(self, args: _Args, late: Late):
        self.args: _Args | None = args
        self.late = late
        self.got: Observed | str | None = None

    def result(self, timeout: float | None = None) -> Observed | str:
        if self.got is None:
            assert self.args is not None, "a cancelled replay has no result"
            self.got = _safe(self.args, self.late)
        return self.got

    def cancel(self) -> bool:
        self.args = None
        return True


class _Replays:
    """Replays in ``n`` worker processes (in this one when ``n`` is 1, each when its result is
    asked for), as futures of what the replay observed, or why the configuration did not
    serve; none outlives ``deadline`` or the command.

    A replay past ``deadline`` stops (``LATE``), and nothing waits for one past it. On leaving
    (done, an exception, Ctrl-C) every replay still running is told to stop and the workers
    end, killed if they have not within ``GRACE``. A SIGTERM the command would die of kills
    them first. A worker also ends of itself when its parent does, however it does (SIGKILL
    included: ``_worker``), and when the deadline is ``GRACE`` behind it."""

    def __init__(self, fit: Fit, setup: Setup, n: int, deadline: float | None = None):
        self.fit, self.setup, self.deadline = fit, setup, deadline
        self.pool: ProcessPoolExecutor | None = None
        self.stop: Any = None
        self.sigterm: Any = None  # the handler replaced while the workers run
        if n > 1:
            ctx = _context()
            self.stop = ctx.Event()
            self.pool = ProcessPoolExecutor(
                max_workers=n,
                mp_context=ctx,
                initializer=_worker,
                initargs=(os.getpid(), deadline, self.stop),
            )

    def late(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def submit(self, cfg: Config, first: int = 0) -> _Pending:
        """A replay of ``cfg``, its draws from the ``first`` on (``replay``)."""
        args = (self.fit, self.setup, cfg, first)
        if self.pool is None:
            return _Later(args, self.late)
        return self.pool.submit(_safe, args)

    def wait(self, f: _Pending) -> Observed | str:
        """``f``'s result, or ``LATE`` when it has none by the deadline."""
        left = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        try:
            return f.result(left)
        except (TimeoutError, CancelledError):
            return LATE
        except BrokenExecutor:
            return LATE if self.late() else "the replay's worker process ended unexpectedly"

    def __enter__(self) -> _Replays:
        main = threading.current_thread() is threading.main_thread()
        if self.pool is not None and main and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            self.sigterm = signal.signal(signal.SIGTERM, self._terminated)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.sigterm is not None:
            signal.signal(signal.SIGTERM, self.sigterm)
            self.sigterm = None
        self.close()

    def close(self) -> None:
        """Stop the replays and end the workers (killed past ``GRACE``)."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        self.stop.set()
        workers = list((pool._processes or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        until = time.monotonic() + GRACE
        for p in workers:
            p.join(max(0.0, until - time.monotonic()))
        for p in workers:
            if p.is_alive():
                p.kill()
        for p in workers:  # a SIGKILL cannot be held off: wait for it to land (a busy
            p.join(REAPED)  # machine may take longer than GRACE to schedule the worker)

    def _terminated(self, signum: int, frame: object) -> None:
        """SIGTERM: kill the workers, then die of it as the command would have."""
        for p in list((self.pool._processes or {}).values()) if self.pool else []:
            with contextlib.suppress(OSError):
                p.kill()
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


def _context() -> Any:
    """The workers' start method: the default, unless it is ``forkserver`` (its workers are
    the server's children, and each must watch the command itself)."""
    ctx = multiprocessing.get_context()
    return multiprocessing.get_context("spawn") if ctx.get_start_method() == "forkserver" else ctx


# In a worker process: the pool's stop event and the command's deadline (``_worker``).
_STOP: Any = None
_DEADLINE: float | None = None


def _worker(parent: int, deadline: float | None, stop: Any) -> None:
    """Each worker's start: it ignores Ctrl-C (sent to the whole process group: the command
    ends its workers), dies with ``parent`` (Linux's parent-death signal, and everywhere a
    thread that sees the worker orphaned within ``WATCH``), and stops replaying at the
    deadline or when the pool's ``stop`` is set."""
    global _STOP, _DEADLINE
    _STOP, _DEADLINE = stop, deadline
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="parent-watch").start()


def _watch(parent: int) -> None:
    """End this worker once ``parent`` has (it is orphaned: another process adopts it), or
    once its replay has overrun the deadline by ``GRACE`` (the command no longer waits)."""
    while True:
        if os.getppid() != parent:
            os._exit(1)
        if _DEADLINE is not None and time.monotonic() > _DEADLINE + 2 * GRACE:
            os._exit(1)
        time.sleep(WATCH)


def _late_here() -> bool:
    """In a worker: whether its replay must stop."""
    if _STOP is not None and _STOP.is_set():
        return True
    return _DEADLINE is not None and time.monotonic() >= _DEADLINE


def _safe(args: _Args, late: Late | None = None) -> Observed | str:
    fit, setup, cfg, first = args
    try:
        return replay(fit, setup, cfg, late or _late_here, first)
    except ReplayError as exc:
        return str(exc)
