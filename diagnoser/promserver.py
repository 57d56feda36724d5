"""A throwaway local Prometheus: backfill OpenMetrics with promtool, serve it on loopback.

Used by the tests and the demo. Nothing is left running: the server is a context manager
that stops its process and removes its data unless told to keep it.
"""

from __future__ import annotations

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
from typing import IO, Any


class PrometheusError(Exception):
    """A binary is missing, a backfill failed, or the server did not come up."""


def binary(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise PrometheusError(f"{names[0]} not found on PATH (Debian package 'prometheus')")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


class Prometheus:
    """``with Prometheus(data_dir) as prom: prom.url`` -- a real server on a free port."""

    def __init__(
        self,
        data_dir: Path,
        rule_files: list[Path] | None = None,
        scrape_configs: list[dict[str, Any]] | None = None,
        extra_args: list[str] | None = None,
        startup_timeout: float = 30.0,
        evaluation_interval: str = "15s",
    ):
        self.data_dir = data_dir
        self.rule_files = rule_files or []
        self.scrape_configs = scrape_configs or []
        self.extra_args = extra_args or []
        self.timeout = startup_timeout
        self.evaluation_interval = evaluation_interval
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Prometheus:
        self._tmp = tempfile.TemporaryDirectory(prefix="servediag-prom-")
        config = Path(self._tmp.name) / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {
                        "scrape_interval": "15s",
                        "evaluation_interval": self.evaluation_interval,
                    },
                    "rule_files": [str(p) for p in self.rule_files],
                    "scrape_configs": self.scrape_configs,
                }
            )
        )
        self._log = (Path(self._tmp.name) / "prometheus.log").open("wb")
        for _attempt in range(3):
            self.port = free_port()
            self.proc = subprocess.Popen(
                [
                    binary("prometheus"),
                    f"--config.file={config}",
                    f"--storage.tsdb.path={self.data_dir}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--storage.tsdb.retention.time=100y",
                    "--web.enable-lifecycle",
                    "--query.lookback-delta=5m",
                    *self.extra_args,
                ],
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            if self._wait_ready():
                return self
            self.stop()
        tail = (Path(self._tmp.name) / "prometheus.log").read_text(errors="replace")[-500:]
        self.close()
        raise PrometheusError(f"prometheus did not become ready: {tail.strip()}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as resp:
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

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

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
