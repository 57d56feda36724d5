"""What-if's replays keep their command's deadline and end with it: a replay past the deadline
stops and says so, the same lever given twice is replayed once, and the worker processes end
when their command does, however it ends (SIGKILL of the command included)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_what_if_draws import _fit

from diagnoser.catalog.levers import parse_lever
from diagnoser.whatif.predict import LATE, unique, what_if
from lab.real import whatif as lab

ROOT = Path(__file__).resolve().parent.parent
SLO = (1.0, 0.1)
# A window whose replay takes tens of seconds: ten hours at 3.3 requests a second.
LONG = (120_000, 36_000.0)

# A command that replays the long window in two workers, says their process ids, and waits.
DRIVER = """
import sys
sys.path[:0] = ["tests", "."]
from test_what_if_draws import _fit
from lab.real import whatif as lab
from diagnoser.whatif import replay as rp
from diagnoser.whatif.predict import _Replays
setup, fit = lab.setup(lab.find("kv-room")), _fit(*LONG)
cfg, _ = rp.baseline(fit, setup)
with _Replays(fit, setup, 2) as pool:
    futures = [pool.submit(cfg) for _ in range(3)]
    while len(pool.pool._processes) < 2:
        pass
    print(*pool.pool._processes, flush=True)
    for f in futures:
        pool.wait(f)
"""


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _ended(pids: list[int], within: float) -> float:
    """Seconds until every one of ``pids`` has ended; the test fails after ``within``."""
    t0 = time.monotonic()
    while any(_alive(p) for p in pids):
        if time.monotonic() - t0 > within:
            left = [p for p in pids if _alive(p)]
            for p in left:  # leave nothing behind, whatever the test says
                os.kill(p, signal.SIGKILL)
            pytest.fail(f"worker processes {left} outlived their command by {within:g} s")
        time.sleep(0.05)
    return time.monotonic() - t0


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("ending", [signal.SIGKILL, signal.SIGTERM])
def test_the_workers_end_when_their_command_is_killed(ending):
    code = DRIVER.replace("LONG", repr(LONG))
    with subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # Ctrl-C's traceback: the driver is no command
        text=True,
    ) as cmd:
        try:
            assert cmd.stdout is not None
            workers = [int(p) for p in cmd.stdout.readline().split()]
            assert len(workers) == 2 and all(_alive(p) for p in workers)
            time.sleep(0.3)  # replaying
            cmd.send_signal(ending)
            _ended(workers, within=3.0)
            assert cmd.wait(5) != 0
        finally:
            cmd.kill()


def test_a_replay_past_the_deadline_stops_and_the_lever_says_so():
    setup, fit = lab.setup(lab.find("kv-room")), _fit(*LONG)
    levers = [parse_lever("replicas:+1"), parse_lever("max_num_seqs:x0.5")]
    for workers in (1, 2):
        t0 = time.monotonic()
        w = what_if(fit, setup, levers, SLO, workers=workers, deadline=t0 + 1.0)
        took = time.monotonic() - t0
        assert took < 2.0, (workers, took)
        assert w.calibration.late and not w.calibration.ok
        assert "deadline passed" in (w.calibration.reason or "")
        assert [o.error for o in w.outcomes] == [LATE, LATE]
        assert not multiprocessing.active_children()


def test_the_same_lever_twice_is_one_lever():
    given = ["replicas:+1", "max_num_seqs=x0.75", "replicas", "max_num_seqs:x0.75"] * 500
    got = unique([parse_lever(t) for t in given])
    assert [lever.text for lever in got] == ["replicas:+1", "max_num_seqs:x0.75"]
    setup, fit = lab.setup(lab.find("kv-room")), _fit(*LONG)
    t0 = time.monotonic()
    w = what_if(fit, setup, [parse_lever(t) for t in given], SLO, workers=1, deadline=t0 + 0.5)
    assert [o.lever.text for o in w.outcomes] == ["replicas:+1", "max_num_seqs:x0.75"]
