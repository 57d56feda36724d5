"""The command line: help with examples, README coverage, one-line errors with exit statuses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from diagnoser.cli import main
from diagnoser.site import Site

ROOT = Path(__file__).resolve().parent.parent


def _commands(group: click.Group, prefix: str = ""):
    for name, cmd in sorted(group.commands.items()):
        yield f"{prefix}{name}", cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, f"{prefix}{name} ")


COMMANDS = list(_commands(main))


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_command_has_help_with_an_example(name, cmd):
    assert cmd.help and "Example" in cmd.help, name


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=[n for n, _ in COMMANDS])
def test_every_command_is_in_the_readme(name, cmd):
    assert f"servediag {name}" in (ROOT / "README.md").read_text(), name


def test_readme_starts_with_the_demo_and_the_test_commands():
    lines = [ln for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip()]
    block = lines[lines.index("```sh") + 1 : lines.index("```sh") + 3]
    assert block[0].startswith("make demo") and block[1].startswith("make test")


def run(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_catalog_list_shows_all_playbooks():
    catalog = Site.default().catalog
    res = run("catalog", "list")
    assert res.exit_code == 0
    n, detectable, advisory = len(catalog), len(catalog.detectable()), len(catalog.advisory())
    assert detectable and advisory and detectable + advisory == n
    assert f"{n} playbooks: {detectable} detectable, {advisory} advisory" in res.output
    rows = json.loads(run("catalog", "list", "--format", "json").output)
    assert {r["id"] for r in rows} >= {"kv-cache-pressure", "hidden-tail"}


def test_catalog_show_prints_the_signature_and_the_fix():
    res = run("catalog", "show", "prompt-length-shift")
    assert res.exit_code == 0
    assert "prompt_tokens_per_request rises >= 1.5x" in res.output
    assert "Fix:" in res.output and "VllmPromptLengthShift" in res.output


def test_unknown_playbook_suggests_the_nearest_id():
    res = CliRunner().invoke(main, ["catalog", "show", "kv-cache-presure"])
    assert res.exit_code == 2
    assert "did you mean 'kv-cache-pressure'" in res.output


def test_runbook_prints_the_fixed_sections():
    res = run("runbook", "kv-cache-pressure")
    assert res.exit_code == 0
    sections = re.findall(r"^## (\w+)", res.output, flags=re.M)
    assert sections == ["Meaning", "Impact", "Diagnosis", "Mitigation", "Guardrail"]


def test_signals_prints_promql_for_one_signal():
    res = run("signals", "kv_cache_usage", "--instance")
    assert res.exit_code == 0
    assert "max by (model_name, instance) (vllm:kv_cache_usage_perc)" in res.output
    assert run("signals", "nope").exit_code == 2


@pytest.mark.prometheus
def test_generate_check_passes_on_the_committed_files():
    res = CliRunner().invoke(main, ["generate", "--check", "--out", str(ROOT)])
    assert res.exit_code == 0, res.output


@pytest.mark.prometheus
def test_generate_check_reports_a_stale_file(tmp_path):
    assert run("generate", "--out", str(tmp_path)).exit_code == 0
    page = tmp_path / "runbooks" / "hidden-tail.md"
    page.write_text(page.read_text() + "edited by hand\n")
    res = CliRunner().invoke(main, ["generate", "--check", "--out", str(tmp_path)])
    assert res.exit_code == 1
    assert "stale: runbooks/hidden-tail.md" in res.output


@pytest.mark.prometheus
def test_generate_keeps_files_that_it_did_not_write(tmp_path):
    (tmp_path / "runbooks").mkdir()
    mine = tmp_path / "runbooks" / "our-oncall-notes.md"
    mine.write_text("# notes\n")
    assert run("generate", "--out", str(tmp_path)).exit_code == 0
    assert mine.read_text() == "# notes\n"


def test_a_bad_config_file_is_exit_2_in_one_line(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("selector: [\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "diagnoser",
            "generate",
            "--config",
            str(cfg),
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "not valid YAML" in proc.stderr
    assert not (tmp_path / "rules").exists()


def test_diagnose_against_an_unreachable_prometheus_exits_3_in_one_line():
    from lab.promserver import free_port

    url = f"http://user:s3cret@127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "from diagnoser.cli import diagnose_main; diagnose_main()",
            "--since",
            "1h",
            "--prometheus-url",
            url,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.count("\n") == 1 and "connection refused" in proc.stderr
    assert "s3cret" not in proc.stderr and "Traceback" not in proc.stderr
