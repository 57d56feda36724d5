"""What the command-line tests share: a small scenario, running a command in-process, and the
check that a command failed with one line."""

from __future__ import annotations

from click.testing import CliRunner

from diagnoser.cli import main

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


def one_line(res, code: int, *says: str) -> str:
    """The command failed with ``code`` and one line on stderr holding each of ``says``."""
    assert res.exit_code == code, (res.exit_code, res.stderr[-2000:])
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr[-2000:]
    for s in says:
        assert s in lines[0], lines[0][:600]
    return lines[0]
