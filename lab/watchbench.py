"""``servediag watch`` stepped through backfilled data, a cycle a minute, without sleeping.

Four figures: how long after an incident's onset its finding is served on ``/metrics``
(cycles and seconds, three incidents of the library); what one cycle costs on a fleet (time,
queries, samples read), the first cycle and a later one that reads only its new steps, with
and without the site's recording rules; what the process holds after many cycles (RSS and
Python's allocations, which must not grow); and the findings served over a healthy fleet
(none expected).

``python -m lab.bench watch`` runs this part of ``make bench`` alone; ``python -m
lab.watchbench --help`` for the fleet's shape and the number of cycles.
"""

from __future__ import annotations

import resource
import shutil
import tempfile
import time
import tracemalloc
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from diagnoser.plumbing.durations import parse_seconds
from diagnoser.plumbing.limits import Limit
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.site import Site
from diagnoser.watch.loop import Watch
from lab import fleet
from lab.fleetstore import PromStore

EVERY = 60.0  # seconds between two cycles, as --every 1m
SINCE = 3600.0  # each cycle's window, as --since 1h
# Three incidents whose cause begins inside the data, with the playbook that names each.
INCIDENTS = (
    ("batch-slot-limit", "batch-slot-limit"),
    ("kv-cache-pressure", "kv-cache-pressure"),
    ("queue-saturation", "queue-saturation"),
)
MAX_WAIT = 1800.0  # seconds after the onset a finding is waited for, at most


def watch(url: str, reuse: bool = True, lookback: float = 0.0) -> Watch:
    source = PrometheusSource(url, timeout=120.0)
    return Watch(
        source, Site.load(None), SINCE, EVERY, lookback=lookback, timeout=120.0, reuse=reuse
    )


def served(w: Watch, at: float) -> list[str]:
    """The playbooks of the findings ``/metrics`` serves after the cycle at ``at``."""
    w.render(now=at)
    return sorted({h.playbook for h, _ in w.findings.served()})


@contextmanager
def scenario_prometheus(name: str) -> Iterator[tuple[str, float, float]]:
    """A Prometheus serving a copy of the library scenario ``name``: its URL, the Unix time
    its simulation began and its first change (the onset)."""
    from diagnoser.sim import library
    from diagnoser.sim.scenario import load_scenario
    from lab.harness import ScenarioCache
    from lab.promserver import Prometheus

    cache = ScenarioCache(fleet.cache_root() / "watch-scenarios")
    prepared = cache[name]
    sc = load_scenario(library.scenario_dir() / f"{name}.yaml")
    begin = prepared.end - sc.duration
    onset = begin + min(c.at for m in sc.models for c in m.timeline)
    with tempfile.TemporaryDirectory(prefix="servediag-watchbench-") as tmp:
        data = Path(tmp) / "tsdb"
        shutil.copytree(prepared.data_dir, data)
        prom = Prometheus(data).start()
        try:
            yield prom.url, prepared.end, onset
        finally:
            prom.close()


def bench_onsets() -> None:
    print("time from onset to the finding on /metrics (--since 1h, --every 1m, cycles stepped):")
    for name, playbook in INCIDENTS:
        with scenario_prometheus(name) as (url, end, onset):
            w = watch(url)
            at, cycles, named, found = onset, 0, None, None
            while at <= min(end, onset + MAX_WAIT):
                w.cycle(at)
                cycles += 1
                current = [m.playbook.id for m in w.latest.findings] if w.latest else []
                if named is None and playbook in current:
                    named = cycles
                if playbook in served(w, at):
                    found = at
                    break
                at += EVERY
            if found is None:
                print(f"  {name:<22} {playbook} not served within {MAX_WAIT / 60:.0f} min")
                continue
            print(
                f"  {name:<22} {playbook}: named by cycle {named}, served from cycle "
                f"{cycles} (the onset's cycle is 1): {found - onset:.0f} s after the onset"
            )


def cycle_row(label: str, w: Watch, at: float, store: PromStore) -> str:
    """One cycle: its wall time, queries, the points their answers held, and the samples
    Prometheus read for them (its query log's ``totalQueryableSamples``)."""
    q0, p0, s0 = w.source.tally.queries, w.source.tally.samples, store.samples()
    outcome = w.cycle(at)
    if outcome.kind != "ok":
        return f"  {label:<40} failed ({outcome.kind}): {outcome.message}"
    return (
        f"  {label:<40}{outcome.seconds:>7.2f} s{w.source.tally.queries - q0:>5} queries"
        f"{(w.source.tally.samples - p0) / 1e3:>9.1f} k points"
        f"{(store.samples() - s0) / 1e6:>8.2f} M samples   "
        f"{len(w.latest.findings) if w.latest else 0} finding(s)"
    )


def bench_fleet_cycle(shape: fleet.Shape) -> None:
    from lab.fleetbench import rules_data
    from lab.fleetstore import prometheus

    f = fleet.cached(shape)
    print(
        f"one cycle on a fleet of {shape.text()} (--since 1h, a cycle a minute; points: what "
        "the answers held, samples: what Prometheus read for them):"
    )
    rules, _ = rules_data(f)
    at = f.end - 1800.0
    for label, rule_dir in (("without the recording rules", None), ("with them", rules)):
        for lookback in (86400.0, 0.0):
            with prometheus(f.tsdb, rule_dir) as store:
                print(f" {label}, --lookback {lookback / 3600:g}h:")
                w = watch(store.prom.url, lookback=lookback)
                print(cycle_row("first cycle", w, at, store))
                print(cycle_row("next cycle (reads its new steps)", w, at + EVERY, store))
                print(cycle_row("a cycle later", w, at + 2 * EVERY, store))
                fresh = watch(store.prom.url, reuse=False, lookback=lookback)
                print(cycle_row("that cycle read whole", fresh, at + 2 * EVERY, store))


def rss_mb() -> float:
    """The process's resident memory now (MB), from /proc."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_long_run(shape: fleet.Shape, cycles: int) -> None:
    """Cycles a minute apart over the healthy fleet: memory, and the findings served."""
    from lab.fleetstore import prometheus

    f = fleet.cached(shape)
    first = f.end - parse_seconds(shape.duration) + 2 * SINCE  # a window and its baseline
    possible = int((f.end - first) // EVERY) + 1
    n = min(cycles, possible)
    short = "" if n == cycles else f", all its data holds of the {cycles} asked"
    print(
        f"{n} cycles a minute apart over the healthy fleet ({shape.text()}; "
        f"{n / 60:.1f} h of cycles{short}):"
    )
    with prometheus(f.tsdb) as store:
        w = watch(store.prom.url)
        tracemalloc.start()
        marks: list[tuple[int, float, float]] = []
        false, errors, t0 = 0, 0, time.monotonic()
        for i in range(n):
            at = first + i * EVERY
            if w.cycle(at).kind != "ok":
                errors += 1
            false += len(served(w, at))
            if i + 1 in (10, n // 4, n // 2, n) or (i + 1) % 100 == 0:
                marks.append((i + 1, rss_mb(), tracemalloc.get_traced_memory()[0] / 2**20))
        took = time.monotonic() - t0
        tracemalloc.stop()
    print(f"  {n} cycles in {took:.0f} s ({took / n:.2f} s a cycle), {errors} failed")
    for done, rss, traced in sorted(set(marks)):
        print(f"  after {done:>5} cycles: RSS {rss:7.1f} MB, Python allocations {traced:7.1f} MB")
    print(
        f"  findings served over the run: {false} (cycle x finding), "
        f"cache {w.source.reuse.points} points in {len(w.source.reuse.entries)} entries at the end"
    )


CYCLES = Limit(1, 100_000, integer=True)
MODELS = Limit(1, 10_000, integer=True)
INSTANCES = Limit(1, 1_000, integer=True)


def main(argv: Sequence[str] | None = None) -> None:
    from lab.args import Parser, number
    from lab.fleetbench import _duration

    p = Parser(prog="python -m lab.watchbench")
    p.add_argument(
        "--models", type=number(MODELS), default=16, help="the fleet a cycle is timed on"
    )
    p.add_argument("--instances", type=number(INSTANCES), default=32)
    p.add_argument("--duration", type=_duration, default="6h")
    p.add_argument(
        "--long-models", type=number(MODELS), default=1, help="the healthy fleet of the long run"
    )
    p.add_argument("--long-instances", type=number(INSTANCES), default=8)
    p.add_argument("--long-duration", type=_duration, default="26h")
    p.add_argument("--cycles", type=number(CYCLES), default=1440, help="cycles of the long run")
    p.add_argument("--part", choices=("all", "onsets", "fleet", "long"), default="all")
    a = p.parse_args(argv)
    if a.part in ("all", "onsets"):
        bench_onsets()
    if a.part in ("all", "fleet"):
        shape = fleet.Shape(models=a.models, instances=a.instances, duration=a.duration)
        bench_fleet_cycle(shape)
    if a.part in ("all", "long"):
        long = fleet.Shape(
            models=a.long_models, instances=a.long_instances, duration=a.long_duration
        )
        bench_long_run(long, a.cycles)


if __name__ == "__main__":
    main()
