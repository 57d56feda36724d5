"""Every dashboard against Grafana's published dashboard schema (``@grafana/schema``'s types as
JSON Schema, made by scripts/grafana-dashboard-schema and committed in tests/data): the
dashboard model, each panel plugin's options and field config, and every query. The checker
is scripts/check-dashboard-schema.py, and it must find what grafanalib writes on its own."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
BOARDS = sorted((ROOT / "dashboards").glob("*.json"))
SCHEMAS = sorted(DATA.glob("grafana-*.schema.json"))
GENERATOR = ROOT / "scripts" / "grafana-dashboard-schema"


def _checker():
    spec = importlib.util.spec_from_file_location(
        "check_dashboard_schema", ROOT / "scripts" / "check-dashboard-schema.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = _checker()
VALIDATORS = CHECK.load_validators()


def _violations(path: Path) -> list[tuple[str, str]]:
    return [(CHECK.jsonpath(p), msg) for p, msg in CHECK.check_file(path, *VALIDATORS)]


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_dashboard_is_clean_against_grafanas_published_schema(path):
    assert _violations(path) == []


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_panel_type_has_its_plugins_schema(path):
    """Options and field config are checked for every panel, not only the core model."""
    _, _, plugins = VALIDATORS
    board = json.loads(path.read_text())
    kinds = {p["type"] for p in board["panels"]} | {
        q["type"] for p in board["panels"] for q in p.get("panels", [])
    }
    assert kinds - {"row"} <= set(plugins), kinds - set(plugins)


def _raw_overview(tmp_path: Path, catalog) -> Path:
    """The Overview as grafanalib writes it, before the schema pass."""
    from grafanalib._gen import DashboardEncoder

    from diagnoser.outputs.dashboards import overview
    from diagnoser.site import Site
    from diagnoser.site.config import SiteConfig

    board = overview.build(Site.build(SiteConfig(), catalog))
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    return path


def test_the_checker_finds_what_grafanalib_writes(tmp_path, catalog):
    found = _violations(_raw_overview(tmp_path, catalog))
    says = "\n".join(f"{p}: {m}" for p, m in found)
    # explicit nulls, pre-Grafana-5 keys, a panel's keys on rows, the Angular heatmap
    assert re.search(r"\$\.panels\[\d+\]\.cacheTimeout: null is not of type string", says)
    assert re.search(r"^\$: .*'rows'.*unexpected", says, re.M)
    assert re.search(r"\$\.panels\[\d+\]: .*'span'.*unexpected", says)
    assert re.search(r"\$\.panels\[\d+\]: .*'targets'.*unexpected", says)  # a row
    assert re.search(r"\$\.panels\[\d+\]: .*'xBucketSize'.*unexpected", says)


def test_the_schema_pass_cleans_grafanalibs_own_thresholds(tmp_path):
    """grafanalib's threshold steps start at the string "null"; after the pass the
    base step's value is JSON null (minus infinity) and the other steps keep theirs."""
    from grafanalib._gen import DashboardEncoder
    from grafanalib.core import Dashboard, GridPos, Stat, Target, Threshold

    from diagnoser.outputs.dashboards.clean import schema_clean

    stat = Stat(
        title="s",
        targets=[Target(expr="up", refId="A")],
        gridPos=GridPos(4, 4, 0, 0),
        thresholds=[Threshold("green", 0, 0.0), Threshold("red", 1, 80.0)],
    )
    board = Dashboard(title="t", uid="t", panels=[stat]).auto_panel_ids()
    raw = json.loads(json.dumps(board.to_json_data(), cls=DashboardEncoder))
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(raw))
    after.write_text(json.dumps(schema_clean(raw)))
    steps = "$.panels[0].fieldConfig.defaults.thresholds.steps"
    assert dict(_violations(before))[f"{steps}[0].value"].startswith('"null" is not of type')
    cleaned = json.loads(after.read_text())["panels"][0]["fieldConfig"]["defaults"]
    assert [s["value"] for s in cleaned["thresholds"]["steps"]] == [None, 80.0]
    assert not [v for v in _violations(after) if "thresholds" in v[0]]


def test_a_datasource_given_as_a_string_is_a_violation(tmp_path):
    board = json.loads((ROOT / "dashboards" / "overview.json").read_text())
    i = next(i for i, p in enumerate(board["panels"]) if p["type"] == "timeseries")
    board["panels"][i]["datasource"] = "${datasource}"
    board["panels"][i]["targets"][0]["datasource"] = "${datasource}"
    path = tmp_path / "string-datasource.json"
    path.write_text(json.dumps(board))
    found = dict(_violations(path))
    assert found[f"$.panels[{i}].datasource"] == '"${datasource}" is not of type object'
    assert f"$.panels[{i}].targets[0].datasource" in found


def _pinned(name: str) -> str:
    m = re.search(rf'^{name} = "([^"]+)"', GENERATOR.read_text(), re.M)
    assert m, name
    return m.group(1)


@pytest.mark.parametrize("path", SCHEMAS, ids=[p.stem for p in SCHEMAS])
def test_the_schemas_say_they_were_made_by_the_script_from_the_pinned_package(path):
    comment = json.loads(path.read_text())["$comment"]
    assert comment.startswith("GENERATED by scripts/grafana-dashboard-schema")
    assert f"@grafana/schema@{_pinned('GRAFANA_SCHEMA')}" in comment
    assert _pinned("GRAFANA_SCHEMA_INTEGRITY") in comment
    assert f"ts-json-schema-generator@{_pinned('TS_JSON_SCHEMA_GENERATOR')}" in comment
    # strict but for R2 (an annotation may carry its datasource's query fields), as the
    # script's usage says the committed files are
    assert "Mode: RELAXED (R2):" in comment
    assert "--relax R2" in GENERATOR.read_text()
