"""The stores ``fleetbench`` serves the fleet from, and one ``diagnose`` run timed against
one: a Prometheus on the fleet's blocks (``prometheus``) here, VictoriaMetrics in
``fleetvm``. A store knows its URL, its process and the samples it has read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lab.promserver import Prometheus

TIMEOUT = "600"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    """One ``diagnose`` run and what it cost."""

    store: str
    scope: str
    since: str
    wall: float
    cpu: float
    rss_mb: float
    store_cpu: float
    queries: int
    samples: float
    status: int
    findings: list[str] = field(default_factory=list)
    # The store's heaviest queries: samples read, seconds, the query (Prometheus only).
    heaviest: list[tuple[float, float, str]] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    error: str = ""
    recorded: int = 0  # signals read from the site's recording rules


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def diagnose(
    url: str, end: float, since: str, scope: Sequence[str], extra: Sequence[str] = ()
) -> tuple[Run, dict[str, Any]]:
    """``servediag diagnose`` as its own process; the run (store figures left at 0) and its
    JSON report."""
    cmd = [sys.executable, "-m", "diagnoser", "diagnose", "--prometheus-url", url, *extra]
    cmd += ["--since", since, "--until", f"{end:.0f}", "--format", "json", "--timeout", TIMEOUT]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([*cmd, *scope], stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        text, problem = out.read().decode(), err.read().decode().strip()
    run = Run(
        "",
        "",
        since,
        wall,
        usage.ru_utime + usage.ru_stime,
        usage.ru_maxrss / 1024,
        0.0,
        0,
        0.0,
        proc.returncode,
    )
    if proc.returncode != 0:
        run.error = problem.splitlines()[-1] if problem else f"exit {proc.returncode}"
        return run, {}
    doc = json.loads(text)
    run.queries = int(doc["stats"]["queries"])
    run.recorded = int(doc["stats"].get("recorded_signals") or 0)
    run.findings = [f"{f['id']} {f.get('scope')}" for f in doc["findings"]]
    run.verdicts = {json.dumps(h["scope"], sort_keys=True): h["verdict"] for h in doc["health"]}
    return run, doc


class Store:
    """A server holding the fleet: its URL, its process, and the samples it has read."""

    kind = ""
    url = ""
    pid = 0
    recorded_rules = False  # diagnose reads the site's recording rules on this store

    @property
    def name(self) -> str:
        return f"{self.kind}+rules" if self.recorded_rules else self.kind

    @property
    def flags(self) -> tuple[str, ...]:
        """diagnose's own, for every run on this store."""
        return ("--recorded-rules",) if self.recorded_rules else ()

    def samples(self) -> float:
        raise NotImplementedError

    def measure(self, end: float, since: str, scope: Sequence[str], label: str) -> Run:
        before, cpu = self.samples(), cpu_seconds(self.pid)
        run, _ = diagnose(self.url, end, since, scope, self.flags)
        run.store, run.scope = self.name, label
        run.store_cpu = cpu_seconds(self.pid) - cpu
        run.samples = self.samples() - before
        return run


class PromStore(Store):
    kind = "prometheus"

    def __init__(self, prom: Prometheus, log: Path, recorded_rules: bool = False):
        self.prom, self.log = prom, log
        self.recorded_rules = recorded_rules
        self.url = prom.url
        assert prom.proc is not None
        self.pid = prom.proc.pid

    def entries(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        with self.log.open(encoding="utf-8") as fh:
            return [json.loads(line) for line in fh]

    def samples(self) -> float:
        return sum(_samples(e) for e in self.entries())

    def measure(self, end: float, since: str, scope: Sequence[str], label: str) -> Run:
        seen = len(self.entries())
        run = super().measure(end, since, scope, label)
        mine = self.entries()[seen:]
        run.heaviest = sorted(
            (
                (_samples(e), float(e["stats"]["timings"]["execTotalTime"]), e["params"]["query"])
                for e in mine
                if "stats" in e
            ),
            reverse=True,
        )[:3]
        return run


def _samples(entry: dict[str, Any]) -> float:
    return float(entry.get("stats", {}).get("samples", {}).get("totalQueryableSamples", 0))


@contextmanager
def prometheus(tsdb: Path, rules: Path | None = None) -> Iterator[PromStore]:
    """A Prometheus on a copy of the fleet (its blocks linked, not copied: it writes only its
    head and WAL beside them), logging every query with its statistics; with ``rules``, the
    blocks of the site's recording rules too, and diagnose told to read them."""
    with tempfile.TemporaryDirectory(prefix="servediag-fleet-") as tmp:
        data = Path(tmp) / "data"
        data.mkdir()
        for source in (tsdb, rules):
            for block in source.iterdir() if source else ():
                if (block / "meta.json").exists() and "." not in block.name:
                    shutil.copytree(block, data / block.name, copy_function=os.link)
        log = Path(tmp) / "queries.jsonl"
        config = {"global": {"query_log_file": str(log)}}
        with Prometheus(data, config=config, startup_timeout=300) as prom:
            yield PromStore(prom, log, recorded_rules=rules is not None)
