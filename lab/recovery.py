"""How long after a recovery ``diagnose`` reads a window as clean, by window length.

    python -m lab.recovery batch-slot-limit-recovered --since 5m,10m,20m
    python -m lab.recovery --prometheus-url http://127.0.0.1:9090 --recovery 1793534400 \\
        --until 1793536200 --since 5m,10m,20m

A scenario (a library name or a file) is simulated and backfilled into a real Prometheus as
the benchmarks do (``lab.harness``); its recovery is the start of its last timeline change (or
``--recovery-at``, a time into the scenario); ``--extend`` runs it longer, as it was at its
end, to see a long window clear. A Prometheus URL with ``--recovery`` (epoch seconds) reads
anything else, such as a real recording backfilled with ``lab.real.record.raw_prometheus``.
For each ``--since``, windows that end every ``--every``
from the recovery to the end are diagnosed; a window is clean when no finding is current and
every model's verdict is healthy. What is printed is the time from the recovery to the first
window that is clean and stays clean to the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from diagnoser.diagnosis import Window, diagnose
from diagnoser.diagnosis.match import Match
from diagnoser.diagnosis.model import Diagnosis
from diagnoser.plumbing.durations import format_duration
from diagnoser.plumbing.source import MetricSource, PrometheusSource
from diagnoser.sim.scenario import Scenario
from diagnoser.site import Site


@dataclass(frozen=True)
class Reading:
    """What one window ending at ``end`` said."""

    end: float
    current: tuple[str, ...]  # the current findings' playbooks, likely cause first
    resolved: tuple[str, ...]
    ended_before: tuple[str, ...]
    health: tuple[str, ...]  # each model's verdict

    @property
    def clean(self) -> bool:
        return not self.current and all(v == "healthy" for v in self.health)


@dataclass(frozen=True)
class Row:
    since: float
    recovery: float
    readings: tuple[Reading, ...]

    @property
    def clean_from(self) -> Reading | None:
        """The first reading from which every reading is clean (None: never, to the end)."""
        first = None
        for r in self.readings:
            first = (first or r) if r.clean else None
        return first

    @property
    def minutes(self) -> float | None:
        first = self.clean_from
        return None if first is None else (first.end - self.recovery) / 60


def _ids(matches: Sequence[Match]) -> tuple[str, ...]:
    return tuple(m.playbook.id for m in matches)


def reading(result: Diagnosis, end: float) -> Reading:
    ids = _ids
    return Reading(
        end=end,
        current=ids(result.findings),
        resolved=ids(result.resolved),
        ended_before=ids(getattr(result, "ended_before", [])),
        health=tuple(h.verdict for h in result.health),
    )


def ends(recovery: float, until: float, every: float) -> list[float]:
    """The windows' ends: the recovery, then every ``every`` seconds up to ``until``."""
    n = int((until - recovery) // every)
    return [recovery + i * every for i in range(n + 1)]


def measure(
    source: MetricSource,
    site: Site,
    recovery: float,
    until: float,
    sinces: Sequence[float],
    every: float = 30.0,
    matchers: Sequence[str] = (),
    say: Callable[[str], None] = lambda _: None,
) -> list[Row]:
    """For each window length, a diagnosis of each window ending from the recovery to
    ``until``."""
    rows = []
    for since in sinces:
        readings = []
        for end in ends(recovery, until, every):
            result = diagnose(source, site, Window.plan(since, end), matchers)
            readings.append(reading(result, end))
        rows.append(Row(since, recovery, tuple(readings)))
        say(f"  --since {format_duration(since)}: {len(readings)} windows diagnosed")
    return rows


def table(rows: Sequence[Row]) -> list[str]:
    """One line per window length: when it read clean for good, and what it said before."""
    out = [
        f"{'--since':<8} {'windows':>7} {'clean after':>12}  "
        "at the recovery (current; resolved; ended before)"
    ]
    for row in rows:
        first = row.readings[0]
        said = "; ".join(
            ", ".join(ids) or "-" for ids in (first.current, first.resolved, first.ended_before)
        )
        minutes = row.minutes
        after = "never" if minutes is None else f"{minutes:.1f} min"
        out.append(f"{format_duration(row.since):<8} {len(row.readings):>7} {after:>12}  {said}")
    return out


def recovery_of(sc: Scenario) -> float:
    """When, into the scenario, its last timeline change begins (its recovery)."""
    changes = [c.at for m in sc.models for c in m.timeline]
    if not changes:
        raise SystemExit(f"{sc.name}: no timeline change to recover by; give --recovery-at")
    return max(changes)


def run_scenario(
    sc: Scenario, sinces: Sequence[float], every: float, recovery_at: float | None = None
) -> tuple[float, list[Row]]:
    """Simulate ``sc`` into a Prometheus and measure from its recovery to its end; returns
    the recovery (seconds into the scenario) and the rows."""
    from lab import harness
    from lab.promserver import Prometheus

    at = recovery_of(sc) if recovery_at is None else recovery_at
    with tempfile.TemporaryDirectory() as tmp:
        prepared = harness.prepare([sc], Path(tmp))[sc.name]
        start = prepared.end - sc.duration
        with Prometheus(prepared.data_dir) as prom:
            rows = measure(
                PrometheusSource(prom.url), Site.default(), start + at, prepared.end, sinces, every
            )
    return at, rows


def _durations(text: str) -> list[float]:
    """``5m,10m,20m``: window lengths, each longer than zero."""
    from lab.args import seconds

    out = [seconds()(part) for part in text.split(",") if part.strip()]
    if not out:
        raise argparse.ArgumentTypeError(f"{text!r} names no window length")
    return out


def _scenario(prog: str, name: str) -> Scenario:
    """The library scenario or scenario file ``name``, or one line naming what is wrong."""
    from diagnoser.plumbing.errors import UserError
    from diagnoser.sim import library
    from lab.args import refuse

    try:
        return library.find(name)
    except (UserError, OSError) as exc:
        refuse(prog, f"scenario {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    from diagnoser.plumbing.durations import LATEST
    from diagnoser.plumbing.limits import Limit
    from diagnoser.plumbing.source import bad_url
    from lab.args import Parser, number, seconds

    epoch = number(Limit(0, LATEST))
    p = Parser(prog="python -m lab.recovery", description=__doc__.split("\n")[0])
    p.add_argument("scenario", nargs="?", help="a library scenario's name or a scenario file")
    p.add_argument(
        "--since", type=_durations, default="5m,10m,20m", help="window lengths, comma-separated"
    )
    p.add_argument(
        "--every", type=seconds(), default="30s", help="between the windows' ends (default 30s)"
    )
    p.add_argument(
        "--recovery-at", type=seconds(zero=True), help="a scenario's recovery, as a time into it"
    )
    p.add_argument(
        "--extend", type=seconds(), help="run a scenario this much longer after its end (calm)"
    )
    p.add_argument("--prometheus-url", help="read this Prometheus instead of a scenario")
    p.add_argument("--recovery", type=epoch, help="with --prometheus-url: epoch seconds")
    p.add_argument("--until", type=epoch, help="with --prometheus-url: the last window's end")
    p.add_argument("--match", action="append", default=[], help="a series matcher (repeat)")
    args = p.parse_args(argv)
    sinces, every = args.since, args.every
    if args.prometheus_url:
        if args.scenario or args.recovery is None or args.until is None:
            p.error("--prometheus-url takes --recovery and --until, and no scenario")
        why = bad_url(args.prometheus_url.strip())
        if why:
            p.error(f"argument --prometheus-url: {why}")
        if args.until <= args.recovery:
            p.error("--until must be after --recovery")
        print(f"recovery at {args.recovery:.0f}, windows every {format_duration(every)}")
        source = PrometheusSource(args.prometheus_url.strip())
        rows = measure(source, Site.default(), args.recovery, args.until, sinces, every, args.match)
    else:
        if not args.scenario:
            p.error("give a scenario, or --prometheus-url with --recovery and --until")
        sc = _scenario(p.prog, args.scenario)
        if args.extend:
            sc = dataclasses.replace(sc, duration=sc.duration + args.extend)
        if args.recovery_at is not None and args.recovery_at >= sc.duration:
            p.error(
                f"argument --recovery-at: past the scenario's end ({format_duration(sc.duration)})"
            )
        at, rows = run_scenario(sc, sinces, every, args.recovery_at)
        print(
            f"{sc.name}: recovery {format_duration(at)} into the scenario, windows every "
            f"{format_duration(every)} to its end ({format_duration(sc.duration - at)} later)"
        )
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
