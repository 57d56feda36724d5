"""One site config reaches every output alike: ``diagnose`` applies the selector, the group
labels, the SLOs, the traffic floor and the alert overrides exactly as the rules do.

The data: the same model served in two clusters, an incident (prompts got longer) in cluster
``a`` and a healthy day in cluster ``b``, backfilled into one real Prometheus.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.metrics.exposition import write_openmetrics
from diagnoser.outputs import rules
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.sim import library
from diagnoser.sim.run import simulate
from diagnoser.site import Site
from diagnoser.site.config import load_config
from lab.promserver import Prometheus, backfill
from lab.replay import Recording

END = 1793534400.0
MODEL = "llama-3.1-8b-instruct"
CLUSTERS = {"a": "retrieval-launch", "b": "healthy-steady"}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?( .*)$")


def _relabel(line: str, cluster: str) -> str:
    """A sample line with ``cluster`` added and its instance made the cluster's own."""
    m = SAMPLE.match(line)
    if not m:
        return line
    name, labels, rest = m.group(1), m.group(2), m.group(3)
    inner = labels[1:-1] if labels else ""
    inner = re.sub(r'instance="([^"]*)"', rf'instance="\1-{cluster}"', inner)
    parts = [p for p in (inner, f'cluster="{cluster}"') if p]
    return f"{name}{{{','.join(parts)}}}{rest}\n"


@pytest.fixture(scope="module")
def two_clusters(tmp_path_factory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("site")
    for cluster, scenario in CLUSTERS.items():
        rec = simulate(library.find(scenario), END)
        raw, labelled = tmp / f"{cluster}.raw.om", tmp / f"{cluster}.om"
        with raw.open("w", encoding="utf-8") as fh:
            write_openmetrics(rec, fh)
        with raw.open(encoding="utf-8") as fin, labelled.open("w", encoding="utf-8") as fout:
            for line in fin:
                fout.write(line if line.startswith("#") else _relabel(line, cluster))
        backfill(labelled, tmp / "tsdb")
    with Prometheus(tmp / "tsdb") as prom:
        yield prom.url


def _site(tmp_path: Path, **config: object) -> Site:
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(config))
    return Site.build(load_config(path), Site.default().catalog)


def _diagnose(url: str, site: Site) -> dict:
    window = Window.plan(3600, END)
    return to_json(diagnose(PrometheusSource(url), site, window))


def _found(doc: dict) -> set[tuple[str, str]]:
    return {(f["scope"].get("cluster", "*"), f["id"]) for f in doc["findings"]}


@pytest.mark.prometheus
def test_without_group_labels_the_clusters_are_one_model(two_clusters, site):
    doc = _diagnose(two_clusters, site)
    assert doc["scopes"] == [{"model_name": MODEL}]


@pytest.mark.prometheus
def test_group_labels_split_the_diagnosis_as_they_split_the_alerts(two_clusters, tmp_path):
    site = _site(tmp_path, group_labels=["cluster"])
    doc = _diagnose(two_clusters, site)
    assert doc["scopes"] == [
        {"cluster": "a", "model_name": MODEL},
        {"cluster": "b", "model_name": MODEL},
    ]
    assert _found(doc) == {("a", "prompt-length-shift")}
    # The alerts group by the same labels.
    alerts = yaml.safe_load(rules.render_files(site)[rules.ALERTS_FILE])["groups"][0]["rules"]
    shift = next(a for a in alerts if a["alert"] == "VllmPromptLengthShift")
    assert "on (cluster, model_name)" in shift["expr"]
    kv = next(a for a in alerts if a["alert"] == "VllmKvCachePressure")
    assert "unless on (cluster, model_name)" in kv["expr"]


@pytest.mark.prometheus
def test_the_selector_scopes_every_query(two_clusters, tmp_path):
    nothing = _diagnose(two_clusters, _site(tmp_path, selector=['job="no-such-job"']))
    assert nothing["scopes"] == [] and nothing["findings"] == []
    healthy_only = _diagnose(two_clusters, _site(tmp_path, selector=['cluster="b"']))
    assert healthy_only["scopes"] == [{"model_name": MODEL}] and healthy_only["findings"] == []


@pytest.mark.prometheus
def test_the_sites_slo_thresholds_are_the_ones_queried(two_clusters, tmp_path):
    site = _site(tmp_path, itl_slo_seconds=0.2, ttft_slo_seconds=2.5)
    source = Recording(PrometheusSource(two_clusters))
    diagnose(source, site, Window.plan(3600, END))
    # (a quantile's buckets are not a threshold: SGLang's ITL p95 reads its buckets to 0.4 s)
    slo = [
        e
        for e in source.answers
        if "inter_token_latency_seconds_bucket{le=" in e and "histogram_quantile" not in e
    ]
    assert slo and all('le="0.2"' in e or 'le="0.3"' in e for e in slo), slo
    assert any('le="2.5"' in e for e in source.answers)
    recorded = rules.render_files(site)[rules.RECORDING_FILE]
    assert 'le="0.2"' in recorded and 'le="0.1"' not in recorded


@pytest.mark.prometheus
def test_an_alert_override_reaches_the_diagnosis(two_clusters, tmp_path):
    site = _site(tmp_path, alerts={"VllmPromptLengthShift": {"params": {"ttft_ratio": 100}}})
    doc = _diagnose(two_clusters, site)
    assert "prompt-length-shift" not in {f["id"] for f in doc["findings"]}
    alerts = yaml.safe_load(rules.render_files(site)[rules.ALERTS_FILE])["groups"][0]["rules"]
    shift = next(a for a in alerts if a["alert"] == "VllmPromptLengthShift")
    assert "> 100 * (" in shift["expr"]


@pytest.mark.prometheus
def test_a_model_below_the_traffic_floor_is_diagnosed_and_said_to_be(two_clusters, tmp_path):
    doc = _diagnose(two_clusters, _site(tmp_path, traffic_floor_rps=50))
    assert doc["below_traffic_floor"] == [{"model_name": MODEL}]
    assert _found(doc) == {("*", "prompt-length-shift")}


def test_the_documented_site_config_is_a_valid_one(tmp_path):
    page = (Path(__file__).resolve().parent.parent / "docs" / "site-config.md").read_text()
    block = page.split("# my-site.yaml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "my-site.yaml"
    path.write_text(block)
    site = Site.build(load_config(path), Site.default().catalog)
    assert site.config.group_labels == ("cluster",)
    assert site.catalog["stop-token-mismatch"].alert.params["share"] == 0.3


@pytest.mark.prometheus
def test_slo_objectives_and_thresholds_apply_per_model(two_clusters, tmp_path):
    site = _site(
        tmp_path,
        group_labels=["cluster"],
        slo={
            "ttft": 0.95,
            "overrides": [{"match": 'cluster="a"', "ttft": 0.5, "ttft_seconds": 2.5}],
        },
    )
    source = Recording(PrometheusSource(two_clusters))
    result = diagnose(source, site, Window.plan(3600, END))
    by_cluster = {h.scope["cluster"]: h for h in result.health}
    ttft = {c: next(s for s in h.slis if s.name == "ttft") for c, h in by_cluster.items()}
    assert (ttft["a"].objective, ttft["a"].threshold) == (0.5, 2.5)
    assert (ttft["b"].objective, ttft["b"].threshold) == (0.95, 1.0)
    assert any('le="2.5"' in e for e in source.answers)
    # Cluster a's prompts got longer: its TTFT misses 1 s far more often than 2.5 s.
    assert ttft["a"].good is not None and ttft["a"].good > 0.9


@pytest.mark.parametrize(
    ("slo", "says"),
    [
        ({"ttft": 1.5}, "slo.ttft: an objective is a share between 0 and 1"),
        ({"overrides": [{"match": "llama", "ttft": 0.9}]}, "is not a label matcher"),
        ({"overrides": [{"match": 'model_name="x"', "ttft_seconds": -1}]}, "above 0"),
        ({"availabilty": 0.99}, "unknown key 'availabilty'"),
        ({"period": "1h"}, "slo.period: must be from 1d to 366d"),
    ],
)
def test_a_bad_slo_is_one_clear_error(tmp_path, slo, says):
    from diagnoser.site.config import ConfigError

    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump({"slo": slo}))
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(path)
