"""Files servediag writes are written whole or not at all and never through a link: a symbolic
link, a directory or a FIFO where ``--output``, ``--out`` or a generated file goes is refused
in one line (it used to be followed, and its target overwritten); ``generate`` writes every
changed file beside its target and renames them only when all are whole, after the rule files
as a whole passed promtool (an SLO override's regex Go cannot compile used to be written, exit
0); odd files already under ``--out`` (not UTF-8, a directory) are handled in one line."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from clitest import SCENARIO, cli, diagnose_answered, one_line, proc_one_line, run
from loopback import EMPTY, answer, serve


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file a link may point to: nothing servediag does may change it."""
    path = tmp_path / "victim.txt"
    path.write_text("precious\n")
    return path


# --- diagnose --output ----------------------------------------------------------------------


def test_diagnose_output_that_is_a_link_is_refused_and_its_target_kept(tmp_path, victim):
    out = tmp_path / "report.html"
    out.symlink_to(victim)
    res = diagnose_answered(EMPTY, "--output", str(out))
    one_line(res, 2, f"--output {out}: is a symbolic link")
    assert victim.read_text() == "precious\n" and out.is_symlink()


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_diagnose_output_that_is_no_regular_file_is_refused(tmp_path, kind):
    out = tmp_path / "report.md"
    out.mkdir() if kind == "directory" else os.mkfifo(out)
    with serve(lambda h, f: answer(h, EMPTY)) as prom:  # a process: writing a FIFO blocked
        proc = cli("diagnose", "--prometheus-url", prom.url, "--output", str(out), timeout=60)
    says = "is a directory" if kind == "directory" else "is a FIFO (named pipe)"
    proc_one_line(proc, "--output", str(out), says)


def test_diagnose_output_replaces_a_regular_file_whole_keeping_its_mode(tmp_path):
    out = tmp_path / "report.json"
    out.write_text("old")
    out.chmod(0o640)
    res = diagnose_answered(
        EMPTY, "--until", "1700000000", "--format", "json", "--output", str(out)
    )
    assert res.exit_code == 0, res.stderr[-2000:]
    assert json.loads(out.read_text())["findings"] == []
    assert out.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no temporary file left


# --- simulate --out -------------------------------------------------------------------------


def test_simulate_out_that_is_a_link_is_refused_even_with_force(tmp_path, victim):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "x.om"
    out.symlink_to(victim)
    res = run("simulate", str(path), "--out", str(out), "--force")
    one_line(res, 2, f"--out {out}: is a symbolic link")
    assert victim.read_text() == "precious\n"


def test_simulate_does_not_follow_a_link_planted_at_a_temporary_name(tmp_path, victim):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO)
    out = tmp_path / "x.om"
    (tmp_path / "x.om.partial").symlink_to(victim)  # where it used to write first
    res = run("simulate", str(path), "--out", str(out), "--end", "1700000000")
    assert res.exit_code == 0, res.stderr[-2000:]
    assert victim.read_text() == "precious\n"
    assert out.read_text().endswith("# EOF\n")


# --- generate --out -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("generated")
    res = run("generate", "--out", str(root))
    assert res.exit_code == 0, res.stderr[-2000:]
    return root


def _copy(src: Path, dst: Path) -> Path:
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.write_bytes(path.read_bytes())
    return dst


@pytest.mark.prometheus
def test_generate_refuses_a_link_where_a_file_goes_and_keeps_its_target(
    tmp_path, generated, victim
):
    root = _copy(generated, tmp_path / "out")
    rules = root / "rules" / "alerts.rules.yaml"
    rules.unlink()
    rules.symlink_to(victim)
    for args in (["generate", "--out", str(root)], ["generate", "--check", "--out", str(root)]):
        one_line(run(*args), 2, f"--out: {rules} is a symbolic link")
    assert victim.read_text() == "precious\n"


@pytest.mark.prometheus
def test_generate_refuses_a_directory_where_a_file_goes(tmp_path, generated):
    root = _copy(generated, tmp_path / "out")
    rules = root / "rules" / "alerts.rules.yaml"
    rules.unlink()
    rules.mkdir()
    for args in (["generate", "--out", str(root)], ["generate", "--check", "--out", str(root)]):
        one_line(run(*args), 2, f"--out: {rules} is a directory")


@pytest.mark.prometheus
def test_a_generated_file_that_is_not_utf8_is_stale_and_rewritten(tmp_path, generated):
    root = _copy(generated, tmp_path / "out")
    rules = root / "rules" / "alerts.rules.yaml"
    rules.write_bytes(b"\xff\xfe not ours")
    res = run("generate", "--check", "--out", str(root))
    assert res.exit_code == 1 and "stale: rules/alerts.rules.yaml" in res.stderr, res.stderr
    res = run("generate", "--out", str(root))
    assert res.exit_code == 0, res.stderr[-2000:]
    assert rules.read_bytes() == (generated / "rules" / "alerts.rules.yaml").read_bytes()


@pytest.mark.prometheus
def test_a_page_under_runbooks_that_is_not_ours_stays(tmp_path, generated, victim):
    root = _copy(generated, tmp_path / "out")
    odd = root / "runbooks" / "zzz.md"
    odd.write_bytes(b"x\xff not UTF-8")
    (root / "runbooks" / "link.md").symlink_to(victim)
    (root / "runbooks" / "dir.md").mkdir()
    res = run("generate", "--out", str(root))
    assert res.exit_code == 0, res.stderr[-2000:]
    assert odd.read_bytes() == b"x\xff not UTF-8" and victim.read_text() == "precious\n"


@pytest.mark.prometheus
def test_a_failure_midway_leaves_every_old_file_whole(tmp_path, generated, monkeypatch):
    """The disk fills up while the fifth changed file is written: nothing is replaced (a
    dashboard used to be left truncated), and no temporary file stays behind."""
    from diagnoser.plumbing import atomic

    root = _copy(generated, tmp_path / "out")
    old = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    for path in old:  # every file stale: each is rewritten
        path.write_bytes(b"old " + path.name.encode())
    before = {p: p.read_bytes() for p in old}
    written = []
    real = atomic.Staged.write

    def fills_up(self, path, data):
        written.append(path)
        if len(written) == 5:
            raise OSError(28, "No space left on device", str(path))
        return real(self, path, data)

    monkeypatch.setattr(atomic.Staged, "write", fills_up)
    res = run("generate", "--out", str(root))
    one_line(res, 2, "cannot write under --out", "No space left on device")
    assert {p: p.read_bytes() for p in old} == before
    assert sorted(p for p in root.rglob("*") if p.is_file()) == sorted(old)


@pytest.mark.parametrize(
    ("config", "code", "says"),
    [
        (
            "slo: {overrides: [{match: 'model_name=~\"llama.*+\"', ttft: 0.95}]}",
            2,
            "slo.overrides[0].match[0]: not a matcher Prometheus accepts: error parsing regexp",
        ),
        (
            "slo: {overrides: [{match: ['job=\"a\"', 'model_name=~\"(?=l)l\"'], ttft: 0.95}]}",
            2,
            "slo.overrides[0].match[1]: not a matcher Prometheus accepts",
        ),
        ("selector: ['model_name=~\"a++\"']", 2, "selector[0]: not a matcher Prometheus"),
        ("group_labels: [model_name]", 2, "group_labels[0]: 'model_name' is aggregated"),
        ("group_labels: [cluster, cluster]", 2, "group_labels[1]: 'cluster' is listed twice"),
    ],
)
@pytest.mark.promtool
def test_generate_writes_nothing_prometheus_would_refuse(tmp_path, config, code, says):
    cfg = tmp_path / "site.yaml"
    cfg.write_text(config + "\n")
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    one_line(res, code, str(cfg), says)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "parser", [pytest.param("promtool", marks=pytest.mark.prometheus), "promql-parser"]
)
def test_the_whole_rule_files_are_checked_before_writing(site, monkeypatch, parser):
    """What only the site config shapes (the SLO rules) is checked as a whole file: an
    expression no playbook carries, which Prometheus refuses, is found by promtool and,
    without it, by the PromQL parser library."""
    import shutil

    from diagnoser.outputs import promcheck
    from diagnoser.outputs.rules import RECORDING_FILE, render_files

    if parser == "promtool" and shutil.which("promtool") is None:
        pytest.skip("promtool is not installed")
    if parser == "promql-parser":
        pytest.importorskip("promql_parser")
        monkeypatch.setattr(promcheck.shutil, "which", lambda name: None)
    text = render_files(site)[RECORDING_FILE]
    assert promcheck.rule_files_problem({RECORDING_FILE: text}) is None
    broken = text.replace('=~"[^,]+"', '=~"(?=x)[^,]+"', 1)  # Go's regexp has no lookahead
    assert broken != text
    problem = promcheck.rule_files_problem({RECORDING_FILE: broken})
    assert problem is not None and "rules/recording.rules.yaml" in problem, problem
