"""A playbook whose alert Prometheus would reject never passes: `catalog validate` and
`generate` parse every rendered expression (promtool, or without it the promql-parser
library, or at least strings and brackets) and check every annotation template, one line per
problem naming the file and the field, exit status 2, nothing written."""

from __future__ import annotations

import shutil

import pytest
import yaml
from clitest import run

from diagnoser.catalog import builtin_dir, load_catalog
from diagnoser.outputs import promcheck
from diagnoser.outputs.gotemplate import template_problem
from diagnoser.outputs.promcheck import balance_problem
from diagnoser.outputs.rules import alert_rule
from diagnoser.site import Site, SiteConfig

HAS_PROMTOOL = shutil.which("promtool") is not None


def mine(tmp_path, edit) -> tuple:
    """A directory with one playbook of a site's own (a copy of prompt-length-shift)."""
    data = yaml.safe_load((builtin_dir() / "prompt-length-shift.yaml").read_text())
    data.update(id="site-copy", seed={"symptoms": []})
    data["alert"]["name"] = "VllmSiteCopy"
    edit(data)
    directory = tmp_path / "mine"
    directory.mkdir()
    path = directory / "site-copy.yaml"
    path.write_text(yaml.safe_dump(data))
    return directory, path


def set_alert(field: str, value=None, append: str = ""):
    def edit(data):
        data["alert"][field] = value if value is not None else data["alert"][field] + append

    return edit


BROKEN = {
    "expr": set_alert("expr", append=" > ((("),
    "expr-quote": set_alert("expr", append=' and on() vector(1) > count(up{job="x})'),
    "unclosed-action": set_alert("description", append=" {{ $value | humanize "),
    "if-without-end": set_alert("description", append=" {{ if gt $value 1.0 }}high"),
    "unknown-function": set_alert("description", append=" {{ $value | nosuchfunc }}"),
}
FIELD = {
    "expr": "alert.expr",
    "expr-quote": "alert.expr",
    "unclosed-action": "alert.description",
    "if-without-end": "alert.description",
    "unknown-function": "alert.description",
}


def without_promtool(monkeypatch, library: bool) -> None:
    monkeypatch.setattr(promcheck.shutil, "which", lambda name: None)
    if not library:
        monkeypatch.setattr(promcheck, "_promql_parser", lambda: None)


@pytest.fixture(
    params=[pytest.param("promtool", marks=pytest.mark.prometheus), "promql-parser", "no parser"]
)
def checker(request, monkeypatch):
    if request.param == "promtool" and not HAS_PROMTOOL:
        pytest.skip("promtool is not installed")
    if request.param == "promql-parser":
        pytest.importorskip("promql_parser")
    if request.param != "promtool":
        without_promtool(monkeypatch, library=request.param == "promql-parser")
    return request.param


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_validate_refuses_an_alert_prometheus_would_reject(tmp_path, checker, case):
    directory, path = mine(tmp_path, BROKEN[case])
    res = run("catalog", "validate", str(directory))
    assert res.exit_code == 2, (res.stdout, res.stderr)
    errors = [ln for ln in res.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1, res.stderr
    assert f"{path}: {FIELD[case]}: not " in errors[0], errors[0]
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("case", ["expr", "unclosed-action"])
def test_generate_refuses_it_and_writes_nothing(tmp_path, checker, case):
    directory, path = mine(tmp_path, BROKEN[case])
    out = tmp_path / "out"
    res = run("generate", "--catalog", str(directory), "--out", str(out))
    assert res.exit_code == 2 and f"{path}: {FIELD[case]}" in res.stderr, res.stderr
    assert not out.exists()


def test_a_valid_playbook_passes_and_says_what_parsed_it(tmp_path, checker):
    directory, _ = mine(tmp_path, lambda data: None)
    res = run("catalog", "validate", str(directory))
    assert res.exit_code == 0, res.stderr
    if checker == "no parser":
        assert "not parsed: no parser" in res.stdout and "warning:" in res.stderr
    else:
        assert f"alerts parsed with {checker}" in res.stdout and res.stderr == ""


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_a_threshold_that_is_not_a_number_is_refused(tmp_path, value):
    def edit(data):
        data["signature"]["all"][0]["rises"] = "PLACEHOLDER"

    directory, path = mine(tmp_path, edit)
    path.write_text(path.read_text().replace("PLACEHOLDER", value))
    res = run("catalog", "validate", str(directory))
    assert res.exit_code == 2
    assert "signature.all[0].rises: must be a finite number" in res.stderr


def test_an_override_threshold_that_is_not_a_number_is_refused(tmp_path):
    cfg = tmp_path / "site.yaml"
    cfg.write_text("alerts:\n  VllmPromptLengthShift: {params: {ratio: .nan}}\n")
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    assert res.exit_code == 2 and "alerts.VllmPromptLengthShift.params" in res.stderr


# --- the fallbacks accept everything the catalog ships ---------------------------------------


def builtin_rules() -> list[dict]:
    site = Site.build(SiteConfig(), load_catalog())
    return [alert_rule(pb, site) for pb in site.catalog.detectable()]


def test_the_fallback_checks_accept_every_builtin_alert():
    for rule in builtin_rules():
        assert balance_problem(rule["expr"]) is None, rule["alert"]
        for name, text in rule["annotations"].items():
            assert template_problem(text) is None, (rule["alert"], name)


def test_the_promql_library_accepts_every_builtin_alert():
    parser = pytest.importorskip("promql_parser")
    for rule in builtin_rules():
        parser.parse(rule["expr"])


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("{{ $value", "not closed"),
        ("{{ if $value }}x", "has no {{ end }}"),
        ("{{ end }}", "closes nothing"),
        ("{{ else }}", "outside an if"),
        ("{{ nosuch $value }}", 'function "nosuch" not defined'),
        ("{{ $nope }}", "undefined variable '$nope'"),
        ("{{ }}", "empty action"),
        ("{{ $value | }}", "pipeline stage is empty"),
        ("{{ (len $labels }}", "unclosed ("),
        ("{{/* a comment }}", "comment must end"),
        ('{{ printf "%s }}" $value', "not closed"),
    ],
)
def test_the_template_check_finds_what_prometheus_rejects(template, says):
    problem = template_problem(template)
    assert problem is not None and says in problem, problem


@pytest.mark.parametrize(
    "template",
    [
        '{{ printf "%s }}" $value }}',
        "{{- $labels.instance -}} {{/* note */}}",
        '{{ with query "up" }}{{ . | first | value | humanize }}{{ end }}',
        '{{ range $i, $s := query "up" }}{{ $s.Labels.job }}{{ end }}',
        '{{ if eq $labels.a "b" }}x{{ else if gt $value 1.0 }}y{{ else }}z{{ end }}',
        "{{ $x := 1 }}{{ $x }} {{ $externalLabels.cluster }} {{ .Labels.job }}",
    ],
)
def test_the_template_check_accepts_valid_go_templates(template):
    assert template_problem(template) is None


@pytest.mark.parametrize(
    ("expr", "says"),
    [
        ("x > (((", "not closed"),
        ("sum(x))", "unexpected ')'"),
        ('x{a="b}', 'string opened with " is not closed'),
        ("rate(x[5m)", "unexpected ')'"),
    ],
)
def test_the_bracket_check_finds_unbalanced_expressions(expr, says):
    problem = balance_problem(expr)
    assert problem is not None and says in problem, problem


def test_the_bracket_check_reads_strings_and_comments():
    assert balance_problem('x{a="(\\")"} # a ( comment\n> 1') is None
