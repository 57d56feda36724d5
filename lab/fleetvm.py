"""The fleet of ``fleetbench`` in VictoriaMetrics: imported from the fleet's blocks with
``vmctl prometheus`` (once, kept beside them), served from a copy of that import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from lab import fleet
from lab.fleetstore import Store
from lab.promserver import PrometheusError, binary, free_port


class VMStore(Store):
    kind = "victoriametrics"

    def __init__(self, url: str, pid: int):
        self.url, self.pid = url, pid

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as resp:
            for raw in resp.read().decode().splitlines():
                if raw.startswith(f"{name} "):
                    return float(raw.split()[1])
        return 0.0

    def samples(self) -> float:
        return self.metric("vm_rows_read_per_query_sum")


def _vm_command(data: Path, port: int) -> list[str]:
    return [
        binary("victoria-metrics", package="victoria-metrics"),
        f"-storageDataPath={data}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-retentionPeriod=100y",
        "-search.disableCache",  # each run reads the data, as a first question would
        "-search.latencyOffset=0s",
    ]


@contextmanager
def _vm_server(data: Path) -> Iterator[VMStore]:
    port = free_port()
    with (data.parent / f"{data.name}.log").open("wb") as log:
        proc = subprocess.Popen(_vm_command(data, port), stdout=log, stderr=subprocess.STDOUT)
        store = VMStore(f"http://127.0.0.1:{port}", proc.pid)
        try:
            deadline = time.monotonic() + 300
            while True:
                try:
                    urllib.request.urlopen(f"{store.url}/health", timeout=1).read()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise PrometheusError("victoria-metrics did not start") from None
                    time.sleep(0.2)
            yield store
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _vmctl(tsdb: Path, url: str) -> None:
    """``vmctl prometheus`` reads the fleet's blocks into VictoriaMetrics: the same samples.
    It draws a progress bar and stops when it has no terminal, so it gets a pseudo-one."""
    import pty

    cmd = [binary("vmctl", package="victoria-metrics"), "prometheus", "-s"]
    cmd += [f"--prom-snapshot={tsdb}", f"--vm-addr={url}", "--prom-concurrency=2"]
    master, slave = pty.openpty()
    proc = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, close_fds=True)
    os.close(slave)
    tail = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closes when vmctl exits
            break
        if not chunk:
            break
        tail = (tail + chunk)[-2000:]
    os.close(master)
    if proc.wait() != 0 or b"Import finished" not in tail:
        raise PrometheusError(f"vmctl failed: {tail.decode(errors='replace')[-300:]}")


def vm_data(
    f: fleet.Fleet, say: Callable[[str], None] = print, rules: Path | None = None
) -> tuple[Path, float | None]:
    """The fleet imported into a VictoriaMetrics data directory beside its TSDB (once), and
    with ``rules``, the recording rules' blocks too (once more); the directory and the seconds
    the import took (None: it was there)."""
    home = f.tsdb.parent
    data = home / "vm"
    todo = [(home / "vm.json", f.tsdb, "the fleet")]
    if rules is not None:
        todo.append((home / "vm-rules.json", rules, "the recording rules"))
    if all(done.exists() for done, _, _ in todo):
        return data, None
    if not todo[0][0].exists():
        shutil.rmtree(data, ignore_errors=True)
    t0 = time.monotonic()
    with _vm_server(data) as vm:
        for done, blocks, what in todo:
            if done.exists():
                continue
            say(f"importing {what} into VictoriaMetrics ({data}) with vmctl")
            t1 = time.monotonic()
            _vmctl(blocks, vm.url)
            urllib.request.urlopen(f"{vm.url}/internal/force_flush", timeout=300).read()
            done.write_text(json.dumps({"seconds": time.monotonic() - t1}))
    return data, time.monotonic() - t0


@contextmanager
def victoria(data: Path, recorded_rules: bool = False) -> Iterator[VMStore]:
    """A VictoriaMetrics on a copy of the imported fleet (it merges and writes into its
    directory); ``recorded_rules``: diagnose reads the recording rules imported with it."""
    with tempfile.TemporaryDirectory(prefix="servediag-fleet-vm-") as tmp:
        copy = Path(tmp) / "vm"
        shutil.copytree(data, copy, ignore=shutil.ignore_patterns("flock.lock"))
        with _vm_server(copy) as vm:
            vm.recorded_rules = recorded_rules
            yield vm
