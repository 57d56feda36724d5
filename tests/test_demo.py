"""``make demo``: every step announced, the report's path printed, nothing left running, and a
failing step named in one line; with ``--watch``, servediag watch's served finding printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.promserver import listening

ROOT = Path(__file__).resolve().parent.parent


def demo(cwd: Path, *args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    import os

    env = dict(os.environ)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(
        [sys.executable, "-m", "lab.demo", *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=env,
        timeout=300,
    )


@pytest.mark.prometheus
def test_the_demo_announces_each_step_and_leaves_nothing_running(tmp_path):
    proc = demo(tmp_path, "--scenario", "context-length-rejections", "--watch")
    assert proc.returncode == 0, proc.stderr
    steps = re.findall(r"^\[(\d)/9\] ", proc.stdout, re.M)
    assert steps == [str(i) for i in range(1, 10)]
    assert "LIKELY CAUSE" in proc.stdout
    # servediag watch over the demo's Prometheus serves the same cause on its /metrics.
    assert "[8/9] servediag watch --since 1h --every 10s" in proc.stdout
    served = re.findall(r"^ +(servediag_finding(?:_rank)?\{.*)$", proc.stdout, re.M)
    assert any('playbook="context-length-rejections"' in line for line in served), proc.stdout
    ranks = [line for line in served if line.startswith("servediag_finding_rank{")]
    assert any(line.endswith(" 1") for line in ranks), served
    watch_port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", proc.stdout).group(1))
    assert not listening(watch_port)
    assert "top finding: context-length-rejections (as labelled)" in proc.stdout
    report = Path(re.search(r"HTML report: (\S+)", proc.stdout).group(1))
    assert report == tmp_path / "out" / "demo-report.html"
    assert report.read_text().lstrip().lower().startswith("<!doctype html")
    port = int(re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout).group(1))
    assert not listening(port)
    assert "nothing left running" in proc.stdout.splitlines()[-1]


def test_a_failing_step_is_named_in_one_line(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = demo(tmp_path, path=str(empty))  # no promtool, no prometheus
    assert proc.returncode == 1
    assert "[2/8] generating Prometheus rules" in proc.stdout
    assert "[3/8]" not in proc.stdout
    first, hint, last = proc.stderr.splitlines()
    assert first.startswith("demo: step 2/8 (generating Prometheus rules and checking them")
    assert "promtool not found on PATH" in first
    assert "make setup" in hint and last == "demo: nothing was left running"
    assert not (tmp_path / "out").exists()


def test_an_unknown_scenario_is_refused_before_any_step(tmp_path):
    proc = demo(tmp_path, "--scenario", "retreival-launch")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("python -m lab.demo: error: --scenario retreival-launch: ")
    assert "did you mean 'retrieval-launch'?" in proc.stderr
    assert "Traceback" not in proc.stderr
