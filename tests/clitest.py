"""What the command-line tests share: a small scenario, running a command in-process or as a
process of its own, and the check that a command failed with one line."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from loopback import answer, serve

from diagnoser.cli import main

ROOT = Path(__file__).resolve().parent.parent

SCENARIO = """\
description: One small model for twenty minutes.
duration: 20m
scrape_interval: 15s
seed: 1
labels: {window: 10m, expect: [], absent: []}
models:
  - name: m
    preset: llama-3.1-8b
    workload:
      rate: {mean: 1}
      prompt: {median: 400, sigma: 0.4}
      output: {median: 100, sigma: 0.4}
"""


def run(*args: str):
    """``servediag ARGS`` in this process, with no Prometheus URL or site config from the
    environment."""
    runner = CliRunner(env={"PROMETHEUS_URL": None, "SERVEDIAG_CONFIG": None})
    return runner.invoke(main, list(args), catch_exceptions=False)


def diagnose_answered(body: bytes | dict[str, Any], *args: str):
    """``servediag diagnose ARGS`` in this process against a loopback server that answers
    every query with ``body``."""
    with serve(lambda h, f: answer(h, body)) as prom:
        return run("diagnose", "--prometheus-url", prom.url, *args)


def one_line(res, code: int, *says: str) -> str:
    """The command failed with ``code`` and one line on stderr holding each of ``says``."""
    assert res.exit_code == code, (res.exit_code, res.stderr[-2000:])
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr[-2000:]
    for s in says:
        assert s in lines[0], lines[0][:600]
    return lines[0]


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``servediag ARGS`` as a process of its own, under 2 GiB of memory and ``timeout``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PROMETHEUS_URL", "SERVEDIAG_CONFIG")}
    env["PYTHONPATH"] = str(ROOT)
    try:
        return subprocess.run(
            [sys.executable, "-m", "diagnoser", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=_limits,
            env=env,
            cwd=ROOT,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"servediag {' '.join(args)} did not finish within {timeout:g} s")


def proc_one_line(proc: subprocess.CompletedProcess[str], *says: str) -> str:
    """The process of ``cli`` failed with exit status 2 and one line on stderr holding each
    of ``says``."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    for s in says:
        assert s in lines[0], lines[0]
    return lines[0]
