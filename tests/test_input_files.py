"""Files users hand us are read through one bounded reader (``errors.read_bytes``): a FIFO, a
device, a directory or a file larger than any such file can be is refused in one line naming
it, exit status 2, before a byte is read. The commands run as real processes, with a time
limit (a FIFO used to block the read forever) and a memory limit (``/dev/zero`` used to be read
until MemoryError)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from clitest import SCENARIO, cli, proc_one_line


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
    proc_one_line(proc, "is a FIFO (named pipe), not a regular file")


@pytest.mark.parametrize("kind", ["site config", "playbook", "scenario", "config.json"])
def test_dev_zero_is_refused_not_read_until_memory_runs_out(tmp_path, kind):
    proc = cli(*commands(Path("/dev/zero"), tmp_path)[kind])
    proc_one_line(proc, "is a character device, not a regular file")


def test_a_directory_where_a_playbook_goes_is_refused(tmp_path):
    mine = tmp_path / "mine"
    (mine / "x.yaml").mkdir(parents=True)
    proc_one_line(
        cli("catalog", "validate", str(mine)), "x.yaml: is a directory, not a regular file"
    )


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
    proc_one_line(cli(*commands(big, tmp_path)[kind]), str(named), says)


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
    proc_one_line(cli(*probe, "--tokenizer", str(fifo), timeout=30), "is a FIFO (named pipe)")
    big = tmp_path / "big.json"
    with big.open("wb") as fh:
        fh.truncate((64 << 20) + 1)  # sparse: larger than any tokenizer.json, on no disk
    proc_one_line(cli(*probe, "--tokenizer", str(big)), str(big), "larger than 64 MiB")
