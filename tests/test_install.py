"""A non-editable install, into a clean virtualenv outside the checkout, carries the catalog."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.catalog import load_catalog

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_pip_install_gives_a_working_catalog(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "-q",
        "--disable-pip-version-check",
    ]
    subprocess.run([*pip, str(ROOT)], check=True, cwd=tmp_path)
    work = tmp_path / "elsewhere"
    work.mkdir()
    listed = subprocess.run(
        [str(venv / "bin" / "servediag"), "catalog", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        cwd=work,
    )
    ids = {row["id"] for row in json.loads(listed.stdout)}
    assert ids == {pb.id for pb in load_catalog()} and "stop-token-mismatch" in ids
    # The data came from the installed package, not from this checkout.
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "from diagnoser.catalog import builtin_dir; print(builtin_dir())",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=work,
    )
    assert str(venv) in where.stdout and str(ROOT) not in where.stdout
    runbook = subprocess.run(
        [str(venv / "bin" / "servediag"), "runbook", "hidden-tail"],
        capture_output=True,
        text=True,
        check=True,
        cwd=work,
    )
    assert "## Mitigation" in runbook.stdout
