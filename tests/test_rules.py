"""Generated Prometheus rules: promtool accepts them, and every alert is unit-tested."""

from __future__ import annotations

import copy
import functools
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from diagnoser.outputs import rules, watch
from diagnoser.site import Site
from diagnoser.site.config import ConfigError, SiteConfig, load_config

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules"
TESTS = sorted((RULES / "tests").glob("*.test.yaml"))


@functools.cache
def _yaml(path: Path) -> dict:
    """A committed YAML file, parsed once per run (the rule files are 120 KB of YAML)."""
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _alerts() -> list[dict]:
    doc = _yaml(RULES / rules.ALERTS_FILE)
    return [r for g in doc["groups"] for r in g["rules"]]


def _page(alert: dict) -> str:
    """The runbook page (and test suite) of an alert: its playbook's, its symptom's, or
    servediag watch's (the cause alert links each firing to its playbook's page)."""
    labels = alert["labels"]
    if labels.get("source") == "servediag-watch":
        return watch.PAGE
    return labels.get("playbook") or labels["symptom"]


def test_promtool_check_rules_is_clean(promtool_bin):
    out = rules.check_rules([RULES / rules.RECORDING_FILE, RULES / rules.ALERTS_FILE])
    assert out.count("SUCCESS") == 2


def test_the_operator_manifest_carries_the_same_groups(promtool_bin, tmp_path):
    manifest = yaml.safe_load((RULES / rules.OPERATOR_FILE).read_text())
    assert manifest["kind"] == "PrometheusRule"
    plain = [
        g
        for f in (rules.RECORDING_FILE, rules.ALERTS_FILE)
        for g in yaml.safe_load((RULES / f).read_text())["groups"]
    ]
    assert manifest["spec"]["groups"] == plain
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"groups": manifest["spec"]["groups"]}))
    rules.check_rules([spec])


def test_one_alert_per_detectable_playbook(catalog):
    by_playbook = {a["labels"]["playbook"]: a for a in _alerts() if "playbook" in a["labels"]}
    assert sorted(by_playbook) == sorted(p.id for p in catalog.detectable())


def test_symptom_alerts_page_on_what_users_feel_and_name_no_cause():
    symptoms = [a for a in _alerts() if "symptom" in a["labels"]]
    names = {a["alert"] for a in symptoms}
    assert {
        "VllmAvailabilityBudgetBurn",
        "VllmTtftBudgetBurn",
        "VllmItlBudgetBurn",
        "VllmTargetDown",
        "VllmTargetsAbsent",
        "VllmTrafficStopped",
        "VllmHttpErrors",
        "VllmEngineErrors",
    } == names
    burns = [a for a in symptoms if "slo" in a["labels"]]
    table = {
        (
            a["labels"]["slo"],
            a["labels"]["severity"],
            a["labels"]["long_window"],
            a["labels"]["short_window"],
        )
        for a in burns
    }
    for slo in ("availability", "ttft", "itl"):
        assert {
            (slo, "critical", "1h", "5m"),
            (slo, "critical", "6h", "30m"),
            (slo, "warning", "1d", "2h"),
            (slo, "warning", "3d", "6h"),
        } <= table


def test_every_alert_follows_the_mixin_schema(catalog):
    cfg = SiteConfig()
    for a in _alerts():
        ann = a["annotations"]
        if a["alert"] == watch.CAUSE_ALERT:
            # Its severity and playbook are the finding's labels; its runbook the playbook's.
            assert ann["runbook_url"] == cfg.runbook_for("{{ $labels.playbook }}")
        else:
            assert re.fullmatch(r"(Vllm|Servediag)[A-Z][A-Za-z0-9]+", a["alert"])
            assert a["labels"]["severity"] in ("critical", "warning", "info")
            assert ann["runbook_url"] == cfg.runbook_for(_page(a))
        assert ann["summary"].endswith(".") and "{{" not in ann["summary"]
        # Templated with labels and $value, unless there is nothing to template: absent()
        # returns one series without labels (no target at all).
        assert "{{" in ann["description"] or a["expr"].startswith("absent("), a["alert"]
        assert re.fullmatch(r"[0-9]+[mh]", a["for"]), a["alert"]


def test_every_alert_has_a_traffic_floor_unless_no_traffic_is_expected(catalog):
    for a in _alerts():
        if "playbook" not in a["labels"]:
            continue  # symptom alerts: each reads the traffic it needs (see test_symptoms)
        pb = catalog[a["labels"]["playbook"]]
        has_floor = re.search(
            r"and on \(model_name\) model_name:vllm_(request_success|"
            r"http_requests):rate5m > 0\.1$",
            a["expr"],
        )
        assert bool(has_floor) == (pb.alert.floor != "none"), a["alert"]


def test_runbook_urls_resolve_to_generated_pages():
    for a in _alerts():
        page = ROOT / "runbooks" / f"{_page(a)}.md"
        assert page.is_file(), page


# --- promtool unit tests --------------------------------------------------------------------


# A rule's name as PromQL spells it; any such word in an expression may read that rule.
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _rules_read_by(suite: dict, rule_docs: list[dict]) -> set[str]:
    """The names of the rules a promtool suite's cases can see: the alerts it tests and the
    rules its expressions name, with every rule those read, to the end of the chain. Any
    word of an expression that is a rule's name counts (an over-estimate, never an omission),
    so evaluating only these rules gives each case the values it gets from the whole files."""
    exprs: dict[str, list[str]] = {}
    for doc in rule_docs:
        for group in doc["groups"]:
            for r in group["rules"]:
                exprs.setdefault(r.get("record") or r["alert"], []).append(r["expr"])
    todo = [c["alertname"] for t in suite["tests"] for c in t.get("alert_rule_test", [])]
    for t in suite["tests"]:
        for case in t.get("promql_expr_test", []):
            todo += [w for w in _NAME.findall(case["expr"]) if w in exprs]
    needed: set[str] = set()
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo += [w for e in exprs.get(name, ()) for w in _NAME.findall(e) if w in exprs]
    return needed


def _pruned_suite(path: Path, out: Path) -> Path:
    """A copy of the suite at ``path`` whose rule files keep only the rules its cases read
    (``_rules_read_by``), in their groups and order. Evaluating the 180-odd rules of the
    generated files at every step took a minute per suite; the rules a suite reads take
    seconds, and the values they give are the same."""
    suite = copy.deepcopy(_yaml(path))
    docs = [_yaml((path.parent / f).resolve()) for f in suite["rule_files"]]
    needed = _rules_read_by(suite, docs)
    kept_groups: set[str] = set()
    files = []
    for name, doc in zip(suite["rule_files"], docs, strict=True):
        groups = []
        for group in doc["groups"]:
            rs = [r for r in group["rules"] if (r.get("record") or r["alert"]) in needed]
            if rs:
                groups.append({**group, "rules": rs})
                kept_groups.add(group["name"])
        file = out / Path(name).name
        file.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        files.append(str(file))
    suite["rule_files"] = files
    order = suite.get("group_eval_order")
    if order:
        suite["group_eval_order"] = [g for g in order if g in kept_groups]
    pruned = out / path.name
    pruned.write_text(yaml.safe_dump(suite, sort_keys=False))
    return pruned


def _promtool_test(promtool: str, path: Path) -> None:
    proc = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
        cwd=path.parent,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("path", TESTS, ids=[p.name for p in TESTS])
def test_promtool_unit_tests_pass(promtool_bin, path, tmp_path):
    """Each suite on the rules it reads (``_pruned_suite``)."""
    _promtool_test(promtool_bin, _pruned_suite(path, tmp_path))


def test_a_suite_passes_on_the_whole_rule_files_as_committed(promtool_bin):
    """What a user runs (``promtool test rules rules/tests/X.test.yaml``) passes as is; the
    cheapest suite stands for the rest, which run on the rules they read."""
    _promtool_test(promtool_bin, RULES / "tests" / "servediag-watch.test.yaml")


def test_a_suite_pruned_to_what_it_reads_keeps_every_rule_in_the_chain(tmp_path):
    """The alert, the recorded series it reads and theirs in turn, in their groups; nothing
    else."""
    suite = yaml.safe_load((RULES / "tests" / "prompt-length-shift.test.yaml").read_text())
    docs = [
        yaml.safe_load((RULES / f).read_text()) for f in (rules.RECORDING_FILE, rules.ALERTS_FILE)
    ]
    needed = _rules_read_by(suite, docs)
    assert "VllmPromptLengthShift" in needed and "VllmKvCachePressure" not in needed
    alert = next(
        r
        for g in docs[1]["groups"]
        for r in g["rules"]
        if r.get("alert") == "VllmPromptLengthShift"
    )
    direct = {w for w in _NAME.findall(alert["expr"]) if ":" in w}
    assert direct and direct <= needed
    everything = {
        r.get("record") or r["alert"] for d in docs for g in d["groups"] for r in g["rules"]
    }
    assert len(needed) < len(everything) / 10
    pruned = yaml.safe_load(
        _pruned_suite(RULES / "tests" / "prompt-length-shift.test.yaml", tmp_path).read_text()
    )
    kept = [yaml.safe_load(Path(f).read_text()) for f in pruned["rule_files"]]
    assert {
        r.get("record") or r["alert"] for d in kept for g in d["groups"] for r in g["rules"]
    } == needed


def _cases(doc: dict, alert: str):
    for group in doc["tests"]:
        for case in group.get("alert_rule_test", []):
            if case["alertname"] == alert:
                yield group, case


def test_every_alert_has_the_three_kinds_of_cases():
    """Fires with exact labels and annotations; not yet before `for:`; a silent look-alike."""
    missing = []
    for a in _alerts():
        pid, name = _page(a), a["alert"]
        key = next(k for k in ("source", "playbook", "symptom") if k in a["labels"])
        path = RULES / "tests" / f"{pid}.test.yaml"
        if not path.exists():
            missing.append(f"{path.name}: missing")
            continue
        doc = _yaml(path)
        assert set(doc["rule_files"]) == {"../recording.rules.yaml", "../alerts.rules.yaml"}
        assert doc.get("group_eval_order") == [
            g["name"]
            for f in (rules.RECORDING_FILE, rules.ALERTS_FILE)
            for g in _yaml(RULES / f)["groups"]
        ], f"{path.name}: evaluate recording groups before alerts (group_eval_order)"
        fires = [(g, c) for g, c in _cases(doc, name) if c.get("exp_alerts")]
        if not fires:
            missing.append(f"{path.name}: no case where {name} fires")
            continue
        for _, case in fires:
            for exp in case["exp_alerts"]:
                labels, ann = exp.get("exp_labels", {}), exp.get("exp_annotations", {})
                assert labels.get(key) == (a["labels"][key] if key == "source" else pid)
                assert "severity" in labels, path.name
                assert {"summary", "description", "runbook_url"} <= set(ann), path.name
                if name != watch.CAUSE_ALERT:
                    assert ann["runbook_url"] == a["annotations"]["runbook_url"], path.name
        group, first = fires[0]
        fire_at = _minutes(first["eval_time"])
        not_yet = [
            c
            for g, c in _cases(doc, name)
            if g is group and not c.get("exp_alerts") and _minutes(c["eval_time"]) < fire_at
        ]
        if not not_yet:
            missing.append(f"{path.name}: no case before `for:` elapses in {group['name']!r}")
        lookalikes = [g for g in doc["tests"] if g["name"].startswith("look-alike:")]
        silent = [
            g
            for g in lookalikes
            if all(not c.get("exp_alerts") for gg, c in _cases(doc, name) if gg is g)
            and any(gg is g for gg, _ in _cases(doc, name))
        ]
        if not silent:
            missing.append(f"{path.name}: no look-alike group where {name} stays silent")
    assert not missing, "\n".join(missing)


def _minutes(value: str) -> float:
    m = re.fullmatch(r"([0-9]+)([smhd])", str(value))
    assert m, value
    return int(m.group(1)) * {"s": 1 / 60, "m": 1, "h": 60, "d": 1440}[m.group(2)]


# --- config ---------------------------------------------------------------------------------


def test_config_knobs_reach_every_expression_and_annotation(tmp_path, catalog, promtool_bin):
    cfg_file = tmp_path / "site.yaml"
    cfg_file.write_text(
        "selector: ['job=\"vllm\"']\n"
        "group_labels: [cluster]\n"
        "runbook_url: https://runbooks.example.com/llm/{id}.html\n"
        "traffic_floor_rps: 0.5\n"
        "alerts:\n  VllmPromptLengthShift: {for: 1h, severity: critical, params: {ratio: 3}}\n"
    )
    files = rules.render_files(Site.build(load_config(cfg_file), catalog))
    alerts = yaml.safe_load(files[rules.ALERTS_FILE])["groups"][0]["rules"]
    shift = next(a for a in alerts if a["alert"] == "VllmPromptLengthShift")
    assert shift["for"] == "1h" and shift["labels"]["severity"] == "critical"
    assert "> 3 * (" in shift["expr"] and "more than 3x" in shift["annotations"]["description"]
    assert (
        shift["annotations"]["runbook_url"]
        == "https://runbooks.example.com/llm/prompt-length-shift.html"
    )
    assert "and on (cluster, model_name)" in shift["expr"] and "> 0.5" in shift["expr"]
    recording = yaml.safe_load(files[rules.RECORDING_FILE])
    for rule in recording["groups"][0]["rules"]:
        assert re.search(r"by \(([a-z_]+, )*cluster, model_name\)", rule["expr"]), rule["record"]
        assert rule["record"].startswith("cluster_model_name:")
        for sel in re.findall(r"vllm:[a-z_]+\{([^}]*)\}", rule["expr"]):
            assert 'job="vllm"' in sel, rule["record"]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    rules.check_rules([tmp_path / rules.RECORDING_FILE, tmp_path / rules.ALERTS_FILE])


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("colour: red\n", "unknown key 'colour'"),
        ("ttft_slo_seconds: 0.0001\n", "below the lowest bucket bound of time_to_first_token"),
        ("runbook_url: https://x.example.com/\n", "must contain {id}"),
        ("alerts:\n  VllmNoSuchAlert: {for: 5m}\n", "no alert named 'VllmNoSuchAlert'"),
        ("alerts:\n  VllmPromptLengthShift: {params: {nope: 1}}\n", "unknown parameter 'nope'"),
        ("selector: job=vllm\n", "must be a list of strings"),
        ("scrape_interval: 15 seconds\n", "scrape_interval: must be a duration like 15s"),
    ],
)
def test_a_bad_config_is_one_clear_error(tmp_path, catalog, text, says):
    path = tmp_path / "site.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=re.escape(says)):
        rules.render_files(Site.build(load_config(path), catalog))


def test_symptoms_of_a_model_carry_the_cause_for_their_scope(tmp_path, catalog, promtool_bin):
    """The likely_cause annotations read servediag watch's series for the alert's scope: the
    group labels and model_name (a group label named like one of the service's own labels
    under its ``label_`` name), with the site's runbook links; the expression is the alert's
    own, joined to nothing."""
    cfg_file = tmp_path / "site.yaml"
    cfg_file.write_text(
        "group_labels: [cluster, kind]\nrunbook_url: https://runbooks.example.com/llm/{id}.html\n"
    )
    site = Site.build(load_config(cfg_file), catalog)
    files = rules.render_files(site)
    groups = yaml.safe_load(files[rules.ALERTS_FILE])["groups"]
    symptoms = next(g for g in groups if g["name"] == "servediag.symptoms")["rules"]
    scoped = "servediag_finding{cluster=%q, label_kind=%q, model_name=%q}"
    args = "$labels.cluster $labels.kind $labels.model_name"
    for a in symptoms:
        ann = a["annotations"]
        if a["alert"] == "VllmTargetsAbsent":
            assert "likely_cause" not in ann  # no model to name a cause for
            continue
        assert (
            f'printf "{scoped} and servediag_finding_rank == 1" {args} | query'
            in (ann["likely_cause"])
        ), a["alert"]
        assert watch.NO_CAUSE in ann["likely_cause"]
        assert (
            "https://runbooks.example.com/llm/{{ .Labels.playbook }}.html"
            in (ann["likely_cause_runbook"])
        )
        assert "servediag" not in a["expr"], a["alert"]
    cause = next(g for g in groups if g["name"] == watch.GROUP)["rules"][0]
    assert cause["annotations"]["runbook_url"] == (
        "https://runbooks.example.com/llm/{{ $labels.playbook }}.html"
    )
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    rules.check_rules([tmp_path / rules.RECORDING_FILE, tmp_path / rules.ALERTS_FILE])


def test_a_scope_label_named_like_a_watch_label_is_read_under_its_prefixed_name():
    names = watch.watch_labels(["cluster", "playbook", "label_playbook", "severity", "model_name"])
    assert names == {
        "cluster": "cluster",
        "playbook": "label_label_playbook",
        "label_playbook": "label_playbook",
        "severity": "label_severity",
        "model_name": "model_name",
    }
    # The service renames by the same rule, so the rules read what it serves.
    from diagnoser.watch.exposition import scope_label_names

    assert scope_label_names([], list(names)) == names
