"""Each of the lab's entry points refuses a bad argument with one line on stderr naming it and
exit status 2, before any work starts: no benchmark begun, no vLLM installed, no trace read
from a FIFO. Run in this process; an alarm fails the test if an entry point starts working."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lab import bench, fleetbench, inspect, recovery, whatifbench
from lab.args import click_main
from lab.real import __main__ as real
from lab.real import sequence, stepcosts, steptrace
from lab.real import whatif as whatif_lab

STEP = {"t1": 1, "reqs": [], "new": 0, "resumed": 0, "preempted": 0, "running": 0}
STEP |= {"waiting": 0, "kv": 0}


class StartedWork(Exception):
    """The entry point was still going after the alarm: it took the bad argument."""


@pytest.fixture(autouse=True)
def alarm() -> Iterator[None]:
    def tripped(signum: int, frame: object) -> None:
        raise StartedWork

    before = signal.signal(signal.SIGALRM, tripped)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


def with_argv(main: Callable[[], object], prog: str) -> Callable[[list[str]], object]:
    """An entry point that reads ``sys.argv``, called with ``argv``."""

    def call(argv: list[str]) -> object:
        saved = sys.argv
        sys.argv = [prog, *argv]
        try:
            return main()
        finally:
            sys.argv = saved

    return call


def clicked(command: object, prog: str) -> Callable[[list[str]], object]:
    return lambda argv: click_main(command, prog, argv)  # type: ignore[arg-type]


def trace(tmp: Path, text: str) -> str:
    path = tmp / "steps.1"
    path.write_text(text)
    return str(path)


CASES = [
    # name, entry point, arguments (a callable of the temporary directory, or a list), says
    ("bench unknown", with_argv(bench.main, "bench"), ["nosuch"], "no benchmark 'nosuch'"),
    ("bench extra", with_argv(bench.main, "bench"), ["sglang", "x"], "takes no arguments"),
    ("bench fleet -1", with_argv(bench.main, "bench"), ["fleet", "--models", "-1"], "--models"),
    ("fleet models 0", fleetbench.main, ["--models", "0"], "--models: 0 is not in the range"),
    ("fleet instances", fleetbench.main, ["--instances", "x"], "--instances"),
    ("fleet duration", fleetbench.main, ["--duration", "0"], "--duration"),
    ("fleet runs", fleetbench.main, ["--runs", "0"], "--runs"),
    ("fleet compare", fleetbench.main, ["--compare-models", "-2"], "--compare-models"),
    ("recovery scenario", recovery.main, ["nosuch"], "no such scenario"),
    ("recovery since", recovery.main, ["kv-cache-pressure", "--since", "0"], "--since"),
    ("recovery every", recovery.main, ["kv-cache-pressure", "--every", "x"], "--every"),
    (
        "recovery url",
        recovery.main,
        ["--prometheus-url", "ftp://x", "--recovery", "1", "--until", "2"],
        "--prometheus-url",
    ),
    (
        "recovery time",
        recovery.main,
        ["--prometheus-url", "http://x", "--recovery", "nan", "--until", "2"],
        "--recovery",
    ),
    ("recovery at", recovery.main, ["kv-cache-pressure", "--recovery-at", "30d"], "--recovery-at"),
    ("inspect scenario", inspect.main, ["nosuch"], "no such scenario"),
    ("inspect signal", inspect.main, ["kv-cache-pressure", "nosignal"], "no signal 'nosignal'"),
    ("real incident", clicked(real.main, "real"), ["nosuch"], "no such incident"),
    ("real scale", clicked(real.main, "real"), ["--scale", "nan"], "--scale"),
    ("real rerecord", clicked(real.main, "real"), ["--rerecord", "nosuch"], "'nosuch'"),
    ("real all", clicked(real.main, "real"), ["--all", "crash"], "not both"),
    ("sequence name", clicked(sequence.main, "sequence"), ["nosuch"], "no such sequence"),
    ("sequence core", clicked(sequence.main, "sequence"), ["--server-core", "-1"], "--server-core"),
    ("steptrace name", steptrace.main, ["nosuch"], "no experiment 'nosuch'"),
    ("steptrace seconds", steptrace.main, ["kv-room", "--seconds", "-1"], "--seconds"),
    ("steptrace factors", steptrace.main, ["--factors", "nan", "1", "--read", "x"], "--factors"),
    ("steptrace missing", steptrace.main, ["--read", "/no/such/trace"], "--read"),
    ("steptrace directory", steptrace.main, lambda tmp: ["--read", str(tmp)], "regular file"),
    (
        "steptrace fifo",
        steptrace.main,
        lambda tmp: (os.mkfifo(tmp / "fifo"), ["--read", str(tmp / "fifo")])[1],
        "regular file",
    ),
    (
        "steptrace t0",
        steptrace.main,
        lambda tmp: ["--read", trace(tmp, '{"t0": "x", ' + str(STEP)[1:].replace("'", '"'))],
        "t0 is not a number",
    ),
    (
        "steptrace reqs",
        steptrace.main,
        lambda tmp: [
            "--read",
            trace(tmp, str({**STEP, "t0": 0, "reqs": [[[1], 1, 1, 1, 1]]}).replace("'", '"')),
        ],
        "reqs is not a list",
    ),
    ("what-if lab name", whatif_lab.main, ["nosuch"], "no experiment 'nosuch'"),
    ("what-if lab scale", whatif_lab.main, ["kv-room", "--scale", "0"], "--scale"),
    ("what-if lab rerecord", whatif_lab.main, ["--rerecord", "nosuch"], "'nosuch'"),
    ("what-if bench", with_argv(whatifbench.main, "whatifbench"), ["x"], "takes no arguments"),
    ("stepcosts", with_argv(stepcosts.main, "stepcosts"), ["x"], "takes no arguments"),
]


@pytest.mark.parametrize(
    ("entry", "args", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_argument_is_one_line_and_exit_2_before_any_work(
    entry, args, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    argv = args(tmp_path) if callable(args) else args
    with pytest.raises(SystemExit) as ended:
        entry(argv)
    assert ended.value.code == 2, ended.value.code
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert says in lines[0], lines[0]
    assert "Traceback" not in err and not out, out
