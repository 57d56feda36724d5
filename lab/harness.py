"""Scenarios into Prometheus TSDB blocks, several at once, each simulated only once.

``prepare`` simulates scenarios in parallel worker processes, writes their OpenMetrics and
backfills each into its own data directory; a ``Prometheus`` started on a directory then
serves that scenario. ``ScenarioCache`` does the same one scenario at a time, when it is
first asked for, for processes that share a directory (the test suite's workers): a file
lock per scenario, so each is simulated once whichever process asks first. Used by the test
suite, the demo and the benchmarks.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import diagnoser
from diagnoser.metrics.exposition import write_openmetrics
from diagnoser.sim import library
from diagnoser.sim.run import simulate
from diagnoser.sim.scenario import Scenario
from lab.promserver import backfill


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


# What a simulated scenario's series depend on besides the scenario itself: the simulator,
# the metric families and their exposition, the hardware tables (directories whole, files
# by name), and what they import (tests/test_sim_mechanics.py checks that nothing is left
# out). Most of the query side (promql, signals, the diagnosis) is not among them.
_SIMULATION_CODE = (
    "sim",
    "hardware",
    "plumbing/answer.py",
    "metrics/buckets.py",
    "plumbing/durations.py",
    "metrics/engines.py",
    "metrics/exporters.py",
    "metrics/exposition.py",
    "metrics/families.py",
    "metrics/families_sglang.py",
    "metrics/family.py",
    "metrics/platform.py",
    "plumbing/http.py",
    "plumbing/redact.py",
    "plumbing/source.py",
    "plumbing/tls.py",
    "metrics/tokens.py",
    "plumbing/errors.py",
    "plumbing/printable.py",
    "probe/metrics.py",
    "probe/stream.py",
)


def simulation_digest() -> str:
    """A digest of the code that turns a scenario into series: a cache keyed by it never
    serves series that other code wrote."""
    root = Path(diagnoser.__file__).resolve().parent
    h = hashlib.sha256()
    for part in _SIMULATION_CODE:
        path = root / part
        files = sorted(path.rglob("*")) if path.is_dir() else [path]
        for f in files:
            if f.suffix in (".py", ".yaml", ".json") and f.is_file():
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
    return h.hexdigest()[:16]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


class ScenarioCache(Mapping[str, Prepared]):
    """Library scenarios simulated and backfilled on first use, in ``root``, once for every
    process that shares it: each is built under its own file lock and keyed by the
    scenario's file and ``simulation_digest()``. All share one end time (the first process's
    ``end``, kept in ``root``), so every process sees the same timestamps. The data
    directories are shared: serve a copy (``Prometheus`` writes into its directory)."""

    def __init__(self, root: Path, end: float | None = None):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.code = simulation_digest()
        with _locked(root / "end.lock"):
            stamp = root / "end"
            if not stamp.exists():
                mine = float(int(end if end is not None else time.time()) // 60 * 60)
                stamp.write_text(f"{mine:.0f}\n")
            self.end = float(stamp.read_text())

    def key(self, name: str) -> str:
        text = (library.scenario_dir() / f"{name}.yaml").read_bytes()
        return f"{name}-{hashlib.sha256(text + self.code.encode()).hexdigest()[:12]}"

    def __getitem__(self, name: str) -> Prepared:
        if name not in library.names():
            raise KeyError(name)
        key = self.key(name)
        done = self.root / key / "prepared.json"
        with _locked(self.root / f"{key}.lock"):
            if not done.exists():
                work = self.root / f"{key}.building"
                shutil.rmtree(work, ignore_errors=True)
                work.mkdir()
                p = _one(name, str(work), self.end)
                final = self.root / key / "data"
                final.parent.mkdir(exist_ok=True)
                shutil.rmtree(final, ignore_errors=True)
                p.data_dir.rename(final)
                shutil.rmtree(work, ignore_errors=True)
                record = {**asdict(p), "data_dir": str(final)}
                done.write_text(json.dumps(record))
        record = json.loads(done.read_text())
        return Prepared(**{**record, "data_dir": Path(record["data_dir"])})

    def __iter__(self) -> Iterator[str]:
        return iter(library.names())

    def __len__(self) -> int:
        return len(library.names())
