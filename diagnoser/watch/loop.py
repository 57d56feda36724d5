"""The cycles of ``servediag watch``: one diagnosis over ``[now - since, now]`` every ``every``
seconds, what it found folded into the served findings (``state.Findings``), how it went
counted for ``/metrics``.

A cycle is the ``Request`` and ``run`` that ``diagnose`` uses, so it names what ``diagnose``
over the same window names; recording rules are read wherever the site deploys them and they
cover the window (per signal; the rest from the servers' series, as ``--recorded-rules``
does). A cycle that fails (the source down or answering garbage, its deadline passed, or
a bug) changes no finding: the last good cycle's are served, marked stale. Nothing a cycle
raises ends the service.

The clock is injectable (``now``) and ``cycle(at)`` runs one cycle whose window ends at
``at``: a test steps through a backfilled incident cycle by cycle without sleeping.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from diagnoser.diagnosis.model import Diagnosis
from diagnoser.plumbing.source import PrometheusSource, Series, SourceError
from diagnoser.request import Request, Scope, run
from diagnoser.site import Site
from diagnoser.watch.exposition import Status, render
from diagnoser.watch.reuse import Reuse
from diagnoser.watch.state import Findings

log = logging.getLogger("servediag.watch")

MIN_EVERY = 10.0  # seconds between two cycles, at least
DEFAULT_TIMEOUT = 60.0  # a cycle's deadline, at most (--timeout; and at most --every)
POLL = 0.2  # seconds between two looks at whether the service is asked to stop


class Stop(Protocol):
    """Whether the service is asked to stop (``threading.Event``, ``webhook.stop.SignalStop``)."""

    def is_set(self) -> bool: ...


@dataclass
class Tally:
    """Queries sent and samples their answers held, over every cycle (shared by the copies
    a source makes of itself for each operation)."""

    queries: int = 0
    samples: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, series: list[Series]) -> list[Series]:
        n = sum(int(s.t.size) for s in series)
        with self.lock:
            self.queries += 1
            self.samples += n
        return series


class Tallied(PrometheusSource):
    """A Prometheus source that counts its queries and their samples into ``tally``, and
    reads of a range query only what its last answer (kept in ``reuse``) does not hold."""

    tally: Tally
    reuse: Reuse

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        return self.reuse.read(
            expr,
            start,
            end,
            step,
            lambda since: self._read(expr, since, end, step),
            lambda: not self.warnings,
        )

    def _read(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        return self.tally.add(super().query_range(expr, start, end, step))

    def query(self, expr: str, at: float) -> list[Series]:
        return self.tally.add(super().query(expr, at))


def tallied(source: PrometheusSource, reuse: Reuse) -> Tallied:
    """``source``, its queries counted (its settings, auth and memory budget as they are),
    its range answers kept in ``reuse`` for the next cycle (``Reuse(max_points=0)`` keeps
    none: every query read whole)."""
    out = Tallied.__new__(Tallied)
    out.__dict__.update(vars(source))
    out.tally = Tally()
    out.reuse = reuse
    return out


@dataclass
class Outcome:
    """One cycle: ``ok``, or the kind of error (source, timeout, internal) and its message."""

    at: float
    kind: str
    seconds: float
    message: str = ""


class Watch:
    """The diagnoses of ``scope`` over the last ``since`` seconds, one per ``cycle``; the
    findings served after hysteresis (``clear_after``: seconds a finding must be absent to
    leave). ``timeout``: each cycle's deadline (its queries and the work on their answers).
    ``now``: the wall clock (Unix seconds)."""

    def __init__(
        self,
        source: PrometheusSource,
        site: Site,
        since: float,
        every: float = 60.0,
        clear_after: float = 300.0,
        timeout: float | None = None,
        scope: Scope | None = None,
        lookback: float = 86400.0,
        baseline: float | None = None,
        version: str = "unknown",
        now: Callable[[], float] = time.time,
        reuse: bool = True,
    ):
        # Without reuse, nothing is kept (every range query read whole), and still counted.
        self.source = tallied(source, Reuse() if reuse else Reuse(max_points=0))
        self.site = site
        self.every = every
        self.timeout = min(DEFAULT_TIMEOUT, every) if timeout is None else timeout
        self.request = Request(
            self.source,
            site,
            since,
            baseline=baseline,
            scope=scope or Scope(),
            lookback=lookback,
            recorded_rules=True,
            timeout=self.timeout,
        )
        self.findings = Findings(clear_after, site.config.by)
        self.now = now
        self.version = version
        self.cycles: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.last: Outcome | None = None
        self.last_success: float | None = None
        self.latest: Diagnosis | None = None  # the last good cycle's diagnosis
        self.lock = threading.Lock()

    def cycle(self, at: float | None = None) -> Outcome:
        """Diagnose the window ending at ``at`` (default: now) and take what it found."""
        at = self.now() if at is None else at
        t0 = time.monotonic()
        q0, s0 = self.source.tally.queries, self.source.tally.samples
        r0 = self.source.reuse.counts.reused
        kind, message = "ok", ""
        self.source.reuse.begin()
        try:
            result = run(replace(self.request, until=self.window_end(at)))
        except SourceError as exc:
            timed_out = time.monotonic() - t0 >= self.timeout * 0.99
            kind, message = ("timeout" if timed_out else "source"), str(exc)
            log.error("cycle at %s failed (%s): %s", _iso(at), kind, message)
        except Exception as exc:  # a bug, or an answer nothing expected: the service goes on
            kind, message = "internal", f"{type(exc).__name__}: {exc}"[:500]
            log.error(
                "cycle at %s failed with an internal error: %s", _iso(at), message, exc_info=True
            )
        self.source.reuse.end(kind == "ok")
        seconds = time.monotonic() - t0
        outcome = Outcome(at, kind, seconds, message)
        with self.lock:
            if kind == "ok":
                self.findings.update(result, at)
                self.latest = result
                self.last_success = at
                self.cycles["ok"] = self.cycles.get("ok", 0) + 1
            else:
                self.errors[kind] = self.errors.get(kind, 0) + 1
                self.cycles["error"] = self.cycles.get("error", 0) + 1
            self.last = outcome
        if kind == "ok":
            served = len(self.findings.served())
            log.info(
                "cycle at %s: %d finding(s), %d served, in %.1f s (%d queries, %d samples; "
                "%d taken from the last cycle)",
                _iso(at),
                len(result.findings),
                served,
                seconds,
                self.source.tally.queries - q0,
                self.source.tally.samples - s0,
                self.source.reuse.counts.reused - r0,
            )
        return outcome

    def window_end(self, at: float) -> float:
        """Where the window of a cycle at ``at`` ends: on the last whole step of the window's
        resolution, so that every cycle's range queries are on one grid of steps and the
        next reads only its new steps (``reuse``); a step (a minute for an hour's window)
        at most before ``at``."""
        step = self.request.window(at).step
        return math.floor(at / step) * step

    def recent(self, scope: dict[str, str], begun: float | None) -> Diagnosis | None:
        """The last good cycle's diagnosis of ``scope`` (a model's labels, as an alert about
        it carries them), when it is as good as a diagnosis run now: the last cycle was good
        (nothing is stale), it began at most two turns ago, its window ends at or after
        ``begun`` (the alert's start: the cycle saw what raised it) and its scope holds the
        model. None otherwise: the caller diagnoses anew."""
        if "model_name" not in scope:
            return None  # a target's alert: its diagnosis is scoped to the target
        with self.lock:
            latest, at, stale = self.latest, self.last_success, self.stale
        if latest is None or at is None or stale or self.now() - at > 2 * self.every:
            return None
        if begun is not None and latest.window.end < begun:
            return None
        mine = latest.within(scope)
        return mine if mine.scopes else None

    @property
    def stale(self) -> bool:
        """Whether the last cycle failed (what is served is an older cycle's)."""
        return self.last is not None and self.last.kind != "ok"

    def render(self, now: float | None = None) -> str:
        """The ``/metrics`` text, as of ``now`` (default: the clock)."""
        counts = self.source.reuse.counts
        with self.lock:
            status = Status(
                version=self.version,
                cycles=dict(self.cycles),
                errors=dict(self.errors),
                queries=self.source.tally.queries,
                samples=self.source.tally.samples,
                range_reads={"full": counts.full, "partial": counts.partial},
                reused_points=counts.reused,
                cycle_seconds=self.last.seconds if self.last else None,
                last_success=self.last_success,
                stale=self.stale,
            )
            return render(self.site, self.findings, status, self.now() if now is None else now)

    def health(self) -> str:
        """``/healthz``'s body: serving, and how the last cycle went."""
        last = self.last
        if last is None:
            return "ok: serving; no cycle has ended yet\n"
        if last.kind == "ok":
            return f"ok: serving; the last cycle ({_iso(last.at)}) was good\n"
        return (
            f"ok: serving; the last cycle ({_iso(last.at)}) failed ({last.kind}): the findings "
            "served are the last good cycle's (stale)\n"
        )

    def run(self, stop: Stop, sleep: Callable[[float], None] = time.sleep) -> None:
        """A cycle every ``every`` seconds until ``stop`` is set; a cycle that overruns its
        turn is followed by the next at once, and the turns it overran are skipped."""
        due = time.monotonic()
        while not stop.is_set():
            self.cycle()
            due += self.every
            late = time.monotonic() - due
            if late > 0:
                due += (late // self.every + 1) * self.every
            while not stop.is_set() and (left := due - time.monotonic()) > 0:
                sleep(min(POLL, left))


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
