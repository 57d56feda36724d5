"""Files users hand us are read through one bounded reader (``errors.read_bytes``): a FIFO, a
device, a directory or a file larger than any such file can be is refused in one line naming
it, exit status 2, before a byte is read. The commands run as real processes, with a time
limit (a FIFO used to block the read forever) and a memory limit (``/dev/zero`` used to be read
until MemoryError)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from clitest import SCENARIO

ROOT = Path(__file__).resolve().parent.parent


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


def one_line(proc: subprocess.CompletedProcess[str], *says: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr[-2000:]
    for s in says:
        assert s in lines[0], lines[0]
    return lines[0]


def commands(path: Path, tmp: Path) -> dict[str, tuple[str, ...]]:
    """Every command that reads a file of the user's, reading ``path`` as that file."""
    mine = tmp / "mine"
    mine.mkdir(exist_ok=True)
    playbook = mine / "x.yaml"
    if not playbook.exists() and not playbook.is_symlink():
        playbook.symlink_to(path)
    return {
        "site config": ("generate", "--config", str(path), "--out", str(tmp / "out")),
        "playbook": ("catalog", "validate", str(mine)),
        "scenario": ("simulate", str(path), "--out", str(tmp / "x.om")),
        "config.json": ("kv-budget", "--model", str(path)),
        "token": (
            "diagnose",
            "--prometheus-url",
            "http://127.0.0.1:9",
            "--bearer-token-file",
            str(path),
        ),
    }


KINDS = ["site config", "playbook", "scenario", "config.json", "token"]


@pytest.mark.parametrize("kind", KINDS)
def test_a_fifo_is_refused_at_once(tmp_path, kind):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = cli(*commands(fifo, tmp_path)[kind], timeout=30)
    one_line(proc, "is a FIFO (named pipe), not a regular file")


@pytest.mark.parametrize("kind", ["site config", "playbook", "scenario", "config.json"])
def test_dev_zero_is_refused_not_read_until_memory_runs_out(tmp_path, kind):
    proc = cli(*commands(Path("/dev/zero"), tmp_path)[kind])
    one_line(proc, "is a character device, not a regular file")


def test_a_directory_where_a_playbook_goes_is_refused(tmp_path):
    mine = tmp_path / "mine"
    (mine / "x.yaml").mkdir(parents=True)
    one_line(cli("catalog", "validate", str(mine)), "x.yaml: is a directory, not a regular file")


@pytest.mark.parametrize(
    ("kind", "size", "says"),
    [
        ("site config", (1 << 20) + 1, "larger than 1 MiB"),
        ("scenario", (1 << 20) + 1, "larger than 1 MiB"),
        ("playbook", (1 << 20) + 1, "larger than 1 MiB"),
        ("config.json", (4 << 20) + 1, "larger than 4 MiB"),
    ],
)
def test_a_file_larger_than_any_of_its_kind_is_refused(tmp_path, kind, size, says):
    big = tmp_path / "big"
    start = b"{}\n" if kind == "config.json" else b"# a comment\n"
    big.write_bytes(start + b" " * (size - len(start)))
    named = tmp_path / "mine" / "x.yaml" if kind == "playbook" else big  # the link to it
    one_line(cli(*commands(big, tmp_path)[kind]), str(named), says)


def test_files_of_ordinary_size_are_still_read(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO + "# padding\n" * 50_000)  # half a MiB
    from diagnoser.sim.scenario import load_scenario

    assert load_scenario(path).duration == 1200
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 1, "pad": " " * (3 << 20)}))
    from diagnoser.kvbudget.budget import read_json

    assert read_json(cfg)["hidden_size"] == 1


def test_a_tokenizer_is_read_through_the_bounded_reader(tmp_path):
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    probe = ("probe", "--target", "http://127.0.0.1:9", "--model", "m", "--once")
    one_line(cli(*probe, "--tokenizer", str(fifo), timeout=30), "is a FIFO (named pipe)")
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate((64 << 20) + 1)  # sparse: larger than any tokenizer.json, on no disk
    one_line(cli(*probe, "--tokenizer", str(big)), str(big), "larger than 64 MiB")
