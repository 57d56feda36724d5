"""Dashboards: valid Grafana JSON, laid out without overlaps, every query returns data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BOARDS = sorted((ROOT / "dashboards").glob("*.json"))
VARIABLES = {
    "$job": ".*",
    "$model_name": ".*",
    "$instance": ".*",
    "$engine": ".*",
    "$__rate_interval": "5m",
    "$ttft_slo": "1.0",
    "$itl_slo": "0.1",
    "$step_budget": "8192",
}


def _panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _exprs(board: dict) -> list[tuple[str, str]]:
    """Every query: the panels' targets and the Prometheus annotations."""
    panels = [(p["title"], t["expr"]) for p in _panels(board) for t in p.get("targets", [])]
    notes = [
        (f"annotation {a['name']}", a["expr"])
        for a in board["annotations"]["list"]
        if a.get("datasource", {}).get("type") == "prometheus"
    ]
    return panels + notes


def _substitute(expr: str) -> str:
    for var, value in sorted(VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_the_json_is_what_grafana_imports(path):
    board = json.loads(path.read_text())
    assert board["uid"].startswith("servediag-") and board["title"]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "model_name", "instance", "engine"} <= names
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        if p["type"] != "row":
            assert p["datasource"] == "${datasource}", p["title"]
            assert p["type"] in ("stat", "timeseries", "table", "heatmap"), p["type"]
            if p["type"] == "heatmap":  # Grafana plots pre-bucketed series, sorted by le
                assert p["options"]["calculate"] is False, p["title"]
                assert all(t["format"] == "heatmap" for t in p["targets"]), p["title"]
    notes = [a for a in board["annotations"]["list"] if not a.get("builtIn")]
    assert [a["name"] for a in notes] == ["Playbook alerts"]
    assert notes[0]["datasource"]["uid"] == "${datasource}"


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_queries_avoid_the_known_dashboard_bugs(path):
    for title, expr in _exprs(json.loads(path.read_text())):
        for m in re.finditer(r"histogram_quantile\([0-9.]+, (\S+ \S+ \([^)]*\))", expr):
            assert m.group(1).startswith("sum by (le"), title
        assert "gpu_cache_usage_perc" not in expr or "kv_cache_usage_perc" in expr, title
        assert not re.search(r"vllm:num_preemptions(?!_total)", expr), title


def _scenario_for(expr: str) -> str:
    """A healthy vLLM with DCGM; the synthetic probe's panels need a scenario that runs it."""
    return "fast-server-slow-users" if "llm_probe_" in expr else "healthy-steady"


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_panel_shows_data(path, scenario_library, prometheus_for, prometheus_with_rules):
    empty = []
    for title, expr in _exprs(json.loads(path.read_text())):
        name = _scenario_for(expr)
        # Panels on recorded series (the SLOs) need the recording rules evaluated over history.
        prom = prometheus_with_rules(name) if ":slo_" in expr else prometheus_for(name)
        result = prom.query(_substitute(expr), at=scenario_library[name].end)  # parses or raises
        if not result and not expr.startswith("ALERTS"):  # alerts need live rule evaluation
            empty.append(f"{title} ({name})")
    assert not empty, f"panels with no data: {empty}"


def test_provisioning_and_configmaps_carry_every_dashboard():
    import yaml

    provider = yaml.safe_load((ROOT / "dashboards" / "provisioning.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    maps = list(yaml.safe_load_all((ROOT / "dashboards" / "configmaps.yaml").read_text()))
    assert {m["metadata"]["labels"]["grafana_dashboard"] for m in maps} == {"1"}
    carried = {k: json.loads(v) for m in maps for k, v in m["data"].items()}
    assert set(carried) == {p.name for p in BOARDS}
    for path in BOARDS:
        assert carried[path.name] == json.loads(path.read_text())


def test_the_alerts_table_links_each_playbook_to_its_runbook(catalog):
    from diagnoser.site.config import SiteConfig

    board = json.loads((ROOT / "dashboards" / "overview.json").read_text())
    (table,) = [p for p in _panels(board) if p["title"] == "Playbook alerts firing"]
    (override,) = table["fieldConfig"]["overrides"]
    assert override["matcher"] == {"id": "byName", "options": "playbook"}
    (links,) = [p["value"] for p in override["properties"] if p["id"] == "links"]
    # Grafana puts the cell's value (the alert's playbook label) where ${__value.raw} is.
    cfg = SiteConfig()
    for pb in catalog.detectable():
        url = links[0]["url"].replace("${__value.raw}", pb.id)
        assert url == cfg.runbook_for(pb.id) == pb_runbook_url(pb.id), pb.id


def pb_runbook_url(playbook_id: str) -> str:
    """The runbook_url annotation the generated alert for this playbook carries."""
    import yaml

    rules = yaml.safe_load((ROOT / "rules" / "alerts.rules.yaml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule["labels"]["playbook"] == playbook_id:
                return rule["annotations"]["runbook_url"]
    raise AssertionError(f"no alert for {playbook_id}")


def test_every_playbooks_dashboard_link_resolves_to_a_real_panel(catalog):
    from diagnoser.outputs.dashboards.ids import PLAYBOOKS_UID, link

    board = json.loads((ROOT / "dashboards" / "playbooks.json").read_text())
    assert board["uid"] == PLAYBOOKS_UID
    panels = {p["id"]: p for p in board["panels"]}
    for pb in catalog.detectable():
        url = link(pb.id, catalog)
        assert url and url.startswith(f"/d/{PLAYBOOKS_UID}?viewPanel="), pb.id
        panel = panels[int(url.rsplit("=", 1)[1])]
        assert panel["title"].startswith(f"{pb.id}: "), (pb.id, panel["title"])
        page = (ROOT / "runbooks" / f"{pb.id}.md").read_text()
        assert url in page, pb.id
