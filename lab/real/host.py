"""The host the lab's server runs on, as a platform sees it: a memory cgroup with a limit the
server is started in (a container's memory limit, which the kernel's OOM killer enforces), and
Debian's node-exporter scraped beside the server (the host's memory and its OOM kills).

The cgroup is cgroup v1's memory controller (``/sys/fs/cgroup/memory/<name>``), written as
root: the server's process joins it before it runs, so its children (the engine core and its
worker) are charged there from their first page. The limit is set from the server's footprint
under its usual traffic (its anonymous memory, what the kernel cannot reclaim), plus a
headroom, which its growth under more traffic outgrows.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from lab.promserver import free_port
from lab.real.record import fetch_text
from lab.real.venv import LabError

MEMCG_ROOT = Path("/sys/fs/cgroup/memory")
NODE_EXPORTER = "prometheus-node-exporter"  # Debian's package and command
# The collectors the diagnosis reads (the host's memory, and /proc/vmstat whose default fields
# hold oom_kill); the rest of node-exporter's defaults would only make the recording larger.
NODE_COLLECTORS = ("meminfo", "vmstat")


class MemoryCgroup:
    """A cgroup v1 memory cgroup of the lab's own: ``procs`` is the file a process joins it
    through; ``close`` removes it once its processes have gone."""

    def __init__(self, name: str, root: Path = MEMCG_ROOT):
        self.path = root / name
        try:
            self.path.mkdir()
        except OSError as exc:
            raise LabError(
                f"cannot make the memory cgroup {self.path} ({exc.strerror or exc}): the "
                "incident needs cgroup v1's memory controller, writable (as root)"
            ) from None
        self.limit = 0

    @property
    def procs(self) -> Path:
        return self.path / "cgroup.procs"

    def stat(self) -> dict[str, int]:
        lines = (self.path / "memory.stat").read_text().splitlines()
        return {k: int(v) for k, v in (ln.split() for ln in lines)}

    def footprint(self) -> int:
        """The bytes its processes hold that the kernel cannot reclaim (anonymous memory and
        shared memory; the page cache is reclaimed before anything is killed)."""
        s = self.stat()
        return s.get("total_rss", 0) + s.get("total_shmem", 0)

    def peak(self) -> int:
        return int((self.path / "memory.max_usage_in_bytes").read_text())

    def set_limit(self, limit: int) -> None:
        (self.path / "memory.limit_in_bytes").write_text(str(limit))
        self.limit = limit

    def oom_kills(self) -> int:
        """The processes the OOM killer killed in this cgroup (``memory.oom_control``)."""
        for line in (self.path / "memory.oom_control").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def close(self, wait: float = 10.0) -> None:
        """Remove the cgroup (its processes stopped first; a straggler is waited for)."""
        deadline = time.monotonic() + wait
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # left behind: an empty cgroup holds nothing
                time.sleep(0.5)


def join(procs: Path) -> None:
    """Put the calling process into the cgroup whose ``cgroup.procs`` is ``procs`` (run in a
    child before it executes the server)."""
    procs.write_text(str(os.getpid()))


class NodeExporter:
    """Debian's node-exporter on a free loopback port, with the collectors the diagnosis
    reads; ``stop`` is safe at any time."""

    def __init__(self, log: Path):
        self.port = free_port()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        binary = shutil.which(NODE_EXPORTER)
        if binary is None:
            raise LabError(
                f"{NODE_EXPORTER} is not installed: the incident scrapes the host's "
                f"node-exporter (Debian: apt-get install {NODE_EXPORTER})"
            )
        collectors = [f"--collector.{c}" for c in NODE_COLLECTORS]
        return [binary, f"--web.listen-address={self.target}", "--collector.disable-defaults",
                *collectors, "--web.disable-exporter-metrics"]  # fmt: skip

    def start(self) -> None:
        cmd = self.command()
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:]
                raise LabError(f"{NODE_EXPORTER} exited: {' '.join(tail) or 'no output'}")
            with contextlib.suppress(OSError):
                if "node_vmstat_oom_kill" in fetch_text(f"http://{self.target}/metrics", 2):
                    return
            time.sleep(0.2)
        self.stop()
        raise LabError(f"{NODE_EXPORTER} did not serve /metrics in 10 s")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def host_oom_kills(vmstat: Path = Path("/proc/vmstat")) -> int:
    """The host's OOM kills since boot (what node-exporter reads)."""
    for line in vmstat.read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0
