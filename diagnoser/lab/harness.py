"""Scenarios into Prometheus TSDB blocks, several at once, each simulated only once.

``prepare`` simulates scenarios in parallel worker processes, writes their OpenMetrics and
backfills each into its own data directory; a ``Prometheus`` started on a directory then
serves that scenario. Used by the test suite, the demo and the benchmarks.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from diagnoser.core.exposition import write_openmetrics
from diagnoser.lab.promserver import backfill
from diagnoser.sim import library
from diagnoser.sim.run import simulate
from diagnoser.sim.scenario import Scenario


@dataclass(frozen=True)
class Prepared:
    name: str
    data_dir: Path
    end: float
    samples: int
    simulate_seconds: float
    backfill_seconds: float


def _one(scenario: str | Scenario, workdir: str, end: float) -> Prepared:
    sc = library.find(scenario) if isinstance(scenario, str) else scenario
    t0 = time.monotonic()
    rec = simulate(sc, end)
    t1 = time.monotonic()
    om = Path(workdir) / f"{sc.name}.om"
    with om.open("w", encoding="utf-8") as fh:
        write_openmetrics(rec, fh)
    data = Path(workdir) / sc.name
    backfill(om, data)
    om.unlink()
    return Prepared(sc.name, data, end, rec.sample_count(), t1 - t0, time.monotonic() - t1)


def default_workers(jobs: int) -> int:
    return max(1, min(jobs, os.cpu_count() or 1))


def prepare(
    names: list[str] | list[Scenario],
    workdir: Path,
    end: float | None = None,
    workers: int | None = None,
) -> dict[str, Prepared]:
    """Simulate and backfill scenarios (library names or loaded ones), keyed by name."""
    end = float(int(end if end is not None else time.time()) // 60 * 60)
    workdir.mkdir(parents=True, exist_ok=True)
    workers = workers or default_workers(len(names))
    if workers == 1 or len(names) == 1:
        done = [_one(n, str(workdir), end) for n in names]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            done = list(pool.map(_one, names, [str(workdir)] * len(names), [end] * len(names)))
    return {p.name: p for p in done}
