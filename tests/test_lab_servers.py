"""The throwaway servers of the lab (Prometheus, Alertmanager, VictoriaMetrics): nothing is
left running, even when the process that started them is killed without a teardown."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.prometheus


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_server_goes_when_the_process_that_started_it_is_killed():
    code = (
        "import pathlib, sys, tempfile, time; from lab.promserver import Prometheus; "
        "p = Prometheus(pathlib.Path(tempfile.mkdtemp())).start(); "
        "print(p.proc.pid, flush=True); time.sleep(120)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    with child, child.stdout:
        pid = int(child.stdout.readline())
        child.kill()  # SIGKILL: no fixture teardown, no atexit
        child.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    pytest.fail(f"Prometheus {pid} outlived the process that started it")
