"""A throwaway local Prometheus: backfill OpenMetrics with promtool, serve it on loopback.

Used by the tests and the demo; ``Alertmanager`` starts a real Alertmanager the same way for
the alerting tests. Nothing is left running: each server is a context manager that stops its
process and removes its working files.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import IO, Any, TypeVar


class PrometheusError(Exception):
    """A binary is missing, a backfill failed, or a server did not come up."""


def binary(*names: str, package: str = "prometheus") -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise PrometheusError(f"{names[0]} not found on PATH (Debian package '{package}')")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server listens on ``port``: binding it fails even with SO_REUSEADDR (which
    only lets a new server past connections of a stopped one that wait to close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def backfill(openmetrics: Path, data_dir: Path, block_hours: int = 2) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` into ``data_dir``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        [
            binary("promtool"),
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            f"--max-block-duration={block_hours}h",
            str(openmetrics),
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise PrometheusError(f"backfill of {openmetrics} failed: {tail[0]}")


def _die_with_parent() -> None:
    """In the child, before the server starts (Linux): ask to be sent SIGTERM when the
    thread that started it goes, so a test run that is killed (no fixture teardown) leaves
    no server behind. Elsewhere nothing is asked."""
    import ctypes
    import signal
    import sys

    if sys.platform != "linux":
        return
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_S = TypeVar("_S", bound="LocalServer")


class LocalServer:
    """A server binary on a free loopback port; ``with`` stops it and removes its files.

    Subclasses say which binary and which arguments; the base class picks the port (retrying
    when another process wins the race for it), waits for ``READY_PATH`` to answer 200, and
    keeps the server's log for the error message when it does not come up.
    """

    NAMES: tuple[str, ...] = ()
    PACKAGE = ""
    READY_PATH = "/-/ready"

    def __init__(self, startup_timeout: float = 30.0):
        self.timeout = startup_timeout
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def workdir(self) -> Path:
        assert self._tmp is not None, "the server is not started"
        return Path(self._tmp.name)

    def command(self, exe: str) -> list[str]:
        raise NotImplementedError

    def start(self: _S) -> _S:
        if self.proc is not None:  # ``with server.start():`` would start a second process
            raise PrometheusError(f"{self.NAMES[0]} is already running at {self.url}")
        exe = binary(*self.NAMES, package=self.PACKAGE)
        self._tmp = tempfile.TemporaryDirectory(prefix=f"servediag-{self.NAMES[0]}-")
        log = self.workdir / "server.log"
        self._log = log.open("wb")
        for _attempt in range(3):
            self.port = free_port()
            self.proc = subprocess.Popen(
                self.command(exe),
                stdout=self._log,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
            )
            if self._wait_ready():
                return self
            self.stop()
        tail = log.read_text(errors="replace")[-500:]
        self.close()
        raise PrometheusError(f"{self.NAMES[0]} did not become ready: {tail.strip()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}{self.READY_PATH}", timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Prometheus(LocalServer):
    """``with Prometheus(data_dir) as prom: prom.url`` -- a real server on a free port.

    ``config`` adds top-level configuration (``alerting``, or ``global`` keys such as a
    shorter ``evaluation_interval``) to the defaults.
    """

    NAMES = ("prometheus",)
    PACKAGE = "prometheus"

    def __init__(
        self,
        data_dir: Path,
        rule_files: list[Path] | None = None,
        scrape_configs: list[dict[str, Any]] | None = None,
        extra_args: list[str] | None = None,
        startup_timeout: float = 30.0,
        config: dict[str, Any] | None = None,
        lookback: str = "5m",
    ):
        """``lookback``: how long a sample stands for its series where no later one came
        (``--query.lookback-delta``; a flag Prometheus refuses to be given twice)."""
        super().__init__(startup_timeout)
        self.lookback = lookback
        self.data_dir = data_dir
        self.rule_files = rule_files or []
        self.scrape_configs = scrape_configs or []
        self.extra_args = extra_args or []
        self.config = config or {}

    def command(self, exe: str) -> list[str]:
        config = self.workdir / "prometheus.yml"
        glob = {"scrape_interval": "15s", "evaluation_interval": "15s"}
        config.write_text(
            json.dumps(
                {
                    **self.config,
                    "global": {**glob, **self.config.get("global", {})},
                    "rule_files": [str(p) for p in self.rule_files],
                    "scrape_configs": self.scrape_configs,
                }
            )
        )
        return [
            exe,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=100y",
            "--web.enable-lifecycle",
            f"--query.lookback-delta={self.lookback}",
            *self.extra_args,
        ]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._get("/api/v1/query", params)

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return self._get("/api/v1/query_range", params)

    def _get(self, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=30) as resp:
            body = json.loads(resp.read())
        if body.get("status") != "success":
            raise PrometheusError(f"query failed: {body.get('error')}")
        return list(body["data"]["result"])


class Alertmanager(LocalServer):
    """A real Alertmanager on a free loopback port, from a config given as a mapping.

    Clustering is off (``--cluster.listen-address=``), so it binds nothing but its web port.
    """

    NAMES = ("prometheus-alertmanager", "alertmanager")
    PACKAGE = "prometheus-alertmanager"

    def __init__(self, config: dict[str, Any], startup_timeout: float = 30.0):
        super().__init__(startup_timeout)
        self.config = config

    def command(self, exe: str) -> list[str]:
        config = self.workdir / "alertmanager.yml"
        config.write_text(json.dumps(self.config))
        return [
            exe,
            f"--config.file={config}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--cluster.listen-address=",
        ]

    def alerts(self) -> list[dict[str, Any]]:
        """The alerts Alertmanager holds (API v2)."""
        with urllib.request.urlopen(f"{self.url}/api/v2/alerts", timeout=10) as resp:
            return list(json.loads(resp.read()))
