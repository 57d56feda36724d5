"""Dashboards: valid Grafana JSON, laid out without overlaps, the house style on every panel,
every query returns data, and the GPU panels find their GPUs with or without Kubernetes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clitest import run
from conftest import grafana_substitute as _substitute

from diagnoser.metrics import families, platform

ROOT = Path(__file__).resolve().parent.parent
BOARDS = sorted((ROOT / "dashboards").glob("*.json"))
DS = {"type": "prometheus", "uid": "${datasource}"}
# A metric family in a query: vLLM's, DCGM's, the API server's, the probe's, the platform's.
FAMILY = re.compile(
    r"(?<![\w:])(vllm:[a-z0-9_]+|DCGM_FI_[A-Z_]+|http_[a-z_]+|llm_probe_[a-z0-9_]+"
    r"|kube_[a-z_]+|container_[a-z_]+|node_[a-zA-Z_]+)(?![\w:])(?!\s*\()"
)
HEATMAP = re.compile(r"^sum by \(le\) \(rate\(([\w:]+)_bucket\{[^}]*\}\[\$__rate_interval\]\)\)$")


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _panels(board: dict) -> list[dict]:
    """Every panel that shows something, those in collapsed rows included."""
    out = []
    for p in board["panels"]:
        if p["type"] == "row":
            out += p.get("panels", [])
        else:
            out.append(p)
    return out


def _exprs(board: dict) -> list[tuple[str, str]]:
    """Every query: the panels' targets and the Prometheus annotations."""
    panels = [(p["title"], t["expr"]) for p in _panels(board) for t in p.get("targets", [])]
    notes = [
        (f"annotation {a['name']}", a["expr"])
        for a in board["annotations"]["list"]
        if a.get("datasource", {}).get("type") == "prometheus"
    ]
    return panels + notes


def _families(expr: str) -> set[str]:
    names = set()
    for raw in FAMILY.findall(expr):
        for suffix in ("_bucket", "_sum", "_count"):
            if raw.endswith(suffix) and raw[: -len(suffix)] in families.FAMILIES:
                raw = raw[: -len(suffix)]
        names.add(raw)
    return names


def _cells(panels: list[dict]) -> dict[tuple[int, int], str]:
    """Grid cells -> the panel in them; fails on an overlap or a panel off the 24 columns."""
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
    return cells


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_the_json_is_what_grafana_imports(path):
    board = _load(path)
    assert board["uid"].startswith("servediag-") and board["title"]
    rows = [p for p in board["panels"] if p["type"] == "row"]
    ids = [p["id"] for p in rows + _panels(board)]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "job", "model_name", "instance", "engine"} <= names
    _cells(board["panels"])
    for row in (p for p in board["panels"] if p["type"] == "row" and p["collapsed"]):
        # a collapsed row's panels open right under it, without overlapping each other
        _cells(row["panels"])
        assert min(p["gridPos"]["y"] for p in row["panels"]) == row["gridPos"]["y"] + 1
    for p in _panels(board):
        assert p["datasource"] == DS, p["title"]
        assert all(t["datasource"] == DS for t in p["targets"]), p["title"]
        assert p["type"] in ("stat", "timeseries", "table", "heatmap"), p["type"]
    notes = [a for a in board["annotations"]["list"] if not a.get("builtIn")]
    assert [a["name"] for a in notes] == ["Playbook alerts", "Onsets named by servediag watch"]
    assert all(a["datasource"] == DS for a in notes)


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_dashboards_link_to_each_other_and_share_the_crosshair(path):
    board = _load(path)
    assert board["graphTooltip"] == 1  # shared crosshair
    (link,) = board["links"]
    assert link["type"] == "dashboards" and "servediag" in board["tags"]
    assert link["tags"] == ["servediag"] and link["keepTime"] and link["includeVars"]


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_panel_is_drawn_at_full_resolution(path, site):
    for p in _panels(_load(path)):
        assert "maxDataPoints" not in p, p["title"]  # Grafana: one point per pixel
        assert p["interval"] == site.config.scrape_interval, p["title"]
        assert all(t["intervalFactor"] == 1 for t in p["targets"]), p["title"]


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_time_series_list_every_series_with_its_last_and_largest_value(path):
    for p in _panels(_load(path)):
        defaults = p["fieldConfig"]["defaults"]
        if defaults.get("unit") == "percentunit":
            assert (defaults["min"], defaults["max"]) == (0, 1), p["title"]
        if p["type"] != "timeseries":
            continue
        assert p["options"]["tooltip"]["mode"] == "multi", p["title"]
        legend = p["options"]["legend"]
        assert legend["displayMode"] == "table" and legend["showLegend"], p["title"]
        assert {"lastNotNull", "max"} <= set(legend["calcs"]), p["title"]


def _read(text: str) -> set[str]:
    """The families, recorded series (the SLOs') and ALERTS that a query or a text names."""
    recorded = set(re.findall(r"[a-z_]+:slo_[a-z_]+:\w+", text))
    watch = set(re.findall(r"servediag_[a-z_]+", text))
    return _families(text) | recorded | watch | ({"ALERTS", "up"} & set(re.findall(r"\w+", text)))


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_panel_says_what_it_reads_and_every_family_is_in_the_table(path):
    for p in _panels(_load(path)):
        for name in set().union(*(_families(t["expr"]) for t in p["targets"])):
            assert name in families.FAMILIES, f"{p['title']}: {name} is not a known family"
        read = set().union(*(_read(t["expr"]) for t in p["targets"]))
        assert _read(p["description"]) & read, f"{p['title']}: its description names no metric"


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_heatmaps_plot_the_histograms_own_buckets(path):
    for p in _panels(_load(path)):
        if p["type"] != "heatmap":
            continue
        assert p["options"]["calculate"] is False, p["title"]  # Grafana plots the buckets
        assert p["options"]["rowsFrame"]["layout"] == "le", p["title"]
        for t in p["targets"]:
            assert t["format"] == "heatmap" and t["legendFormat"] == "{{le}}", p["title"]
            for part in t["expr"].split(" or "):
                m = HEATMAP.match(part)
                assert m, (p["title"], part)
                assert families.family(m.group(1)).type == "histogram", p["title"]


def test_the_distributions_of_ttft_itl_and_e2e_are_heatmaps(scenario_library, prometheus_for):
    board = _load(ROOT / "dashboards" / "overview.json")
    maps = {p["title"]: p for p in _panels(board) if p["type"] == "heatmap"}
    assert {"TTFT distribution", "ITL distribution", "End-to-end distribution"} <= set(maps)
    prom = prometheus_for("healthy-steady")
    for title, panel in maps.items():
        (target,) = panel["targets"]
        result = prom.query(_substitute(target["expr"]), at=scenario_library["healthy-steady"].end)
        buckets = {r["metric"]["le"] for r in result}
        assert len(buckets) > 3 and "+Inf" in buckets, title  # one series per bucket
        assert all(set(r["metric"]) == {"le"} for r in result), title


def test_stats_that_count_events_count_them_over_the_time_range():
    board = _load(ROOT / "dashboards" / "gpu-frontend.json")
    (restarts,) = [p for p in _panels(board) if p["title"] == "Restarts"]
    (target,) = restarts["targets"]
    assert "[$__range]" in target["expr"] and "$__rate_interval" not in target["expr"]
    assert target["instant"] is True


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_queries_avoid_the_known_dashboard_bugs(path):
    for title, expr in _exprs(_load(path)):
        for m in re.finditer(r"histogram_quantile\([0-9.]+, (\S+ \S+ \([^)]*\))", expr):
            assert m.group(1).startswith("sum by (le"), title
        assert "gpu_cache_usage_perc" not in expr or "kv_cache_usage_perc" in expr, title
        assert not re.search(r"vllm:num_preemptions(?!_total)", expr), title


def _scenario_for(expr: str) -> str:
    """A healthy vLLM with DCGM; the synthetic probe's panels need a scenario that runs it."""
    return "fast-server-slow-users" if "llm_probe_" in expr else "healthy-steady"


# Families the simulator does not write: the platform's exporters (kube-state-metrics,
# cAdvisor, node-exporter) and DCGM's uncorrectable-error counters.
UNSIMULATED = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")


def _optional(expr: str) -> bool:
    """The query reads a family that exists only with an optional feature on (speculative
    decoding, LoRA, a KV connector), which no library scenario runs, or one of an exporter
    the simulator does not run."""
    return any(
        families.family(f).requires
        or families.family(f).provider in platform.PLATFORM_SOURCES
        or f in UNSIMULATED
        for f in _families(expr)
    )


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_every_panel_shows_data(path, scenario_library, prometheus_for, prometheus_with_rules):
    empty, optional = [], 0
    for title, expr in _exprs(_load(path)):
        name = _scenario_for(expr)
        # Panels on recorded series (the SLOs) need the recording rules evaluated over history.
        prom = prometheus_with_rules(name) if ":slo_" in expr else prometheus_for(name)
        result = prom.query(_substitute(expr), at=scenario_library[name].end)  # parses or raises
        if _optional(expr):
            optional += 1  # parsed by Prometheus; empty without the feature
        elif not result and not expr.startswith("ALERTS") and "servediag_" not in expr:
            # Alerts need live rule evaluation; servediag watch's series, the service
            # (test_the_diagnosis_row_reads_the_watch_series).
            empty.append(f"{title} ({name})")
    assert not empty, f"panels with no data: {empty}"
    if path.stem in ("overview", "kv-batching"):
        assert optional, "the optional rows were not checked"


def test_optional_feature_rows_start_collapsed():
    for path, titles in (
        ("overview", ("Speculative decoding", "LoRA adapters")),
        ("kv-batching", ("KV offloading", "KV transfer")),
    ):
        rows = {p["title"]: p for p in _load(ROOT / "dashboards" / f"{path}.json")["panels"]}
        for title in titles:
            (row,) = [r for t, r in rows.items() if t.startswith(title)]
            assert row["type"] == "row" and row["collapsed"] and row["panels"], title
            for p in row["panels"]:
                assert any(_optional(t["expr"]) for t in p["targets"]) or (
                    "external_kv_transfer" in p["targets"][0]["expr"]
                ), p["title"]


@pytest.mark.prometheus  # generate checks the rules it writes with promtool where it is installed
def test_provisioning_and_configmaps_carry_every_dashboard(tmp_path):
    import yaml

    provider = yaml.safe_load((ROOT / "dashboards" / "provisioning.yaml").read_text())
    assert provider["providers"][0]["type"] == "file"
    # The ConfigMaps are made on demand, not committed beside the dashboards they repeat.
    assert not (ROOT / "dashboards" / "configmaps.yaml").exists()
    res = run("generate", "--configmaps", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    maps = list(yaml.safe_load_all((tmp_path / "dashboards" / "configmaps.yaml").read_text()))
    assert {m["metadata"]["labels"]["grafana_dashboard"] for m in maps} == {"1"}
    carried = {k: json.loads(v) for m in maps for k, v in m["data"].items()}
    assert set(carried) == {p.name for p in BOARDS}
    for path in BOARDS:
        assert carried[path.name] == _load(path)


def test_the_alerts_table_links_each_playbook_to_its_runbook(catalog):
    from diagnoser.site.config import SiteConfig

    board = _load(ROOT / "dashboards" / "overview.json")
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

    board = _load(ROOT / "dashboards" / "playbooks.json")
    assert board["uid"] == PLAYBOOKS_UID
    panels = {p["id"]: p for p in board["panels"]}
    for pb in catalog.detectable():
        url = link(pb.id, catalog)
        assert url and url.startswith(f"/d/{PLAYBOOKS_UID}?viewPanel="), pb.id
        panel = panels[int(url.rsplit("=", 1)[1])]
        assert panel["title"].startswith(f"{pb.id}: "), (pb.id, panel["title"])
        page = (ROOT / "runbooks" / f"{pb.id}.md").read_text()
        assert url in page, pb.id


def test_the_site_scrape_interval_is_every_panels_minimum_step(tmp_path, catalog):
    from diagnoser.outputs import dashboards
    from diagnoser.site import Site, load_config

    cfg = tmp_path / "site.yaml"
    cfg.write_text("scrape_interval: 30s\n")
    board = json.loads(dashboards.render("overview", Site.build(load_config(cfg), catalog)))
    assert {p["interval"] for p in _panels(board)} == {"30s"}


# servediag watch's series as it serves them: llama with two findings, engine-hang the likely
# cause; qwen healthy. (Job and instance are the scrape's.)
SCRAPE = 'job="servediag",instance="watch:9464"'
HANG = 'model_name="llama",playbook="engine-hang",severity="critical"'
QUEUE = 'model_name="llama",playbook="queue-saturation",severity="warning"'
ONSET = 1_700_000_000 - 1800
WATCH_SERIES = [
    ("servediag_finding", HANG, 0.8),
    ("servediag_finding", QUEUE, 0.9),
    ("servediag_finding_rank", HANG, 1),
    ("servediag_finding_rank", QUEUE, 2),
    ("servediag_finding_onset_timestamp_seconds", HANG, ONSET),
    ("servediag_finding_onset_timestamp_seconds", QUEUE, ONSET),
    (
        "servediag_playbook_info",
        'playbook="engine-hang",title="The engine hangs",severity="critical",'
        'runbook="https://x.example/engine-hang.md"',
        1,
    ),
    (
        "servediag_playbook_info",
        'playbook="queue-saturation",title="Queue saturation",severity="warning",'
        'runbook="https://x.example/queue-saturation.md"',
        1,
    ),
    ("servediag_health", 'model_name="llama",verdict="unhealthy"', 1),
    ("servediag_health", 'model_name="qwen",verdict="healthy"', 1),
    ("servediag_last_success_age_seconds", "", 42),
    ("servediag_stale", "", 0),
]


@pytest.mark.prometheus
def test_the_diagnosis_row_reads_the_watch_series(tmp_path):
    """Every overview query on servediag watch's series (the Diagnosis now row, the onset
    annotation) returns data on a real Prometheus holding them: each finding's row with its
    rank, confidence, onset and runbook, and the onset in milliseconds for Grafana."""
    from lab.promserver import Prometheus, backfill

    end, onset = 1_700_000_000, ONSET
    text = ""
    for family in dict.fromkeys(f for f, _, _ in WATCH_SERIES):
        text += f"# TYPE {family} gauge\n"
        for t in range(end - 600, end + 1, 60):
            for name, labels, value in WATCH_SERIES:
                if name == family:
                    text += f"{name}{{{','.join(filter(None, (SCRAPE, labels)))}}} {value} {t}\n"
    om = tmp_path / "watch.om"
    om.write_text(text + "# EOF\n")
    backfill(om, tmp_path / "tsdb")
    board = _load(ROOT / "dashboards" / "overview.json")
    queries = [(t, e) for t, e in _exprs(board) if "servediag_" in e]
    assert len(queries) >= 6, queries
    with Prometheus(tmp_path / "tsdb") as prom:
        results = {t + " " + e: prom.query(_substitute(e), at=end) for t, e in queries}
        assert all(results.values()), [k for k, v in results.items() if not v]
        (causes,) = [p for p in _panels(board) if p["title"].startswith("Likely causes")]
        rows = {}
        for target in causes["targets"]:
            for r in prom.query(_substitute(target["expr"]), at=end):
                rows.setdefault(r["metric"]["playbook"], {})[target["refId"]] = float(r["value"][1])
                assert r["metric"]["runbook"].startswith("https://x.example/")
        assert rows == {
            "engine-hang": {"A": 1.0, "B": 0.8, "C": onset * 1000.0},
            "queue-saturation": {"A": 2.0, "B": 0.9, "C": onset * 1000.0},
        }
    (note,) = [a for a in board["annotations"]["list"] if "servediag_" in a.get("expr", "")]
    assert note["useValueForTime"] is True and "{{playbook}}" in note["titleFormat"]
    (fresh,) = [p for p in _panels(board) if p["title"] == "Diagnosis fresh or stale"]
    (words,) = fresh["fieldConfig"]["defaults"]["mappings"]
    assert {k: v["text"] for k, v in words["options"].items()} == {"0": "fresh", "1": "stale"}


@pytest.mark.parametrize("path", BOARDS, ids=[p.stem for p in BOARDS])
def test_the_onsets_are_drawn_on_latency_kv_and_queue_panels_only(path):
    """The onset annotation names the panels it is drawn on (Grafana's panel filter): each a
    time series, every one that reads a latency, the KV cache or the queue, and no other."""
    board = _load(path)
    (note,) = [a for a in board["annotations"]["list"] if "servediag_" in a.get("expr", "")]
    assert note["filter"]["exclude"] is False
    series = {p["id"]: p for p in _panels(board) if p["type"] == "timeseries"}
    ids = note["filter"]["ids"]
    assert ids and set(ids) <= set(series)
    titles = {series[i]["title"] for i in ids}
    wanted = {
        "overview": {"Time to first token", "Queue time", "KV cache usage by instance"},
        "kv-batching": {"KV cache usage by instance", "Running and waiting"},
        "prompt-length": {"Server TTFT"},
    }.get(path.stem, set())
    assert wanted <= titles, titles
    unwanted = {
        "Token throughput",
        "Finished requests by reason",
        "Output length",
        "GPU power draw",
    }
    assert not titles & unwanted, titles
