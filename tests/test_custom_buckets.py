"""Histograms whose bounds a site set itself (vLLM's ``--custom-histogram-buckets``): an SLO
threshold that is not one of the server's bounds is read at the largest bound below it, and
``generate`` and ``diagnose`` say so; a threshold exactly on a bound reads as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from clitest import one_line, run

from diagnoser.diagnosis import Window, diagnose
from diagnoser.metrics import buckets
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_series as rs
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.report.format import health_line
from diagnoser.sim.scenario import load_scenario
from diagnoser.site import ConfigError, Site, SiteConfig, load_config
from lab import harness
from lab.promserver import Prometheus

HERE = Path(__file__).resolve().parent
CUSTOM = load_scenario(HERE / "scenarios" / "custom-latency-buckets.yaml")
TTFT = "vllm:time_to_first_token_seconds"


# --- which bound a threshold is read at -------------------------------------------------------


def test_a_threshold_on_a_bound_is_read_there_and_one_between_at_the_bound_below():
    assert buckets.read_at(1.0, ((0.5, 1.0, 2.5),)) == (1.0,)
    assert buckets.read_at(1.2, ((0.5, 1.0, 2.5),)) == (1.0,)
    # Two sets of bounds (two servers): each gives its own largest bound at or below.
    assert buckets.read_at(1.0, ((0.5, 1.0), (0.8, 1.5))) == (0.8, 1.0)
    # A set with no bound at or below the threshold gives nothing.
    assert buckets.read_at(0.01, ((0.05, 0.1),)) == ()


def test_the_default_bounds_render_the_exact_bucket_as_before():
    expr = rs.share_at_or_below(TTFT, 1.0, buckets.TTFT_BUCKETS)(q.Scope(window="5m"))
    assert f'{TTFT}_bucket{{le="1.0"}}' in expr
    assert "max" not in expr


def test_other_bounds_are_read_at_the_largest_below_and_mixed_fleets_take_the_max():
    one = q.Scope(window="5m", buckets=((TTFT, ((0.5, 0.8, 1.5),)),))
    expr = rs.share_at_or_below(TTFT, 1.0, buckets.TTFT_BUCKETS)(one)
    assert f'{TTFT}_bucket{{le="0.8"}}' in expr
    two = q.Scope(window="5m", buckets=((TTFT, ((0.5, 0.8, 1.5), (0.5, 1.0))),))
    expr = rs.share_at_or_below(TTFT, 1.0, buckets.TTFT_BUCKETS)(two)
    # Cumulative buckets grow with le: the max over the candidates is each scope's own.
    assert re.search(
        r"max by \(model_name\) \(sum by \(le, model_name\) \(rate\("
        + re.escape(TTFT)
        + r'_bucket\{le=~"0\\\\.8\|1\\\\.0"\}',
        expr,
    ), expr


# --- the site config ----------------------------------------------------------------------------


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "site.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_site_config_declares_bounds_and_says_where_a_threshold_is_read(tmp_path):
    config = load_config(
        _config(
            tmp_path,
            "ttft_slo_seconds: 1.0\nhistogram_buckets:\n"
            "  time_to_first_token: [0.25, 0.5, 0.8, 1.5, 3]\n",
        )
    )
    (line,) = config.off_bound()
    assert "TTFT SLO threshold 1 s is not a bucket bound" in line and "read at 0.8 s" in line
    site = Site.build(config, Site.default().catalog)
    assert site.read_at("time_to_first_token", 1.0) == (0.8,)
    assert SiteConfig().off_bound() == []


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("histogram_buckets: [1, 2]\n", "must be a mapping"),
        ("histogram_buckets: {request_latency: [1, 2]}\n", "not a family"),
        ("histogram_buckets: {time_to_first_token: [2, 1]}\n", "bounds must be increasing"),
        ("histogram_buckets: {time_to_first_token: [0.1, .inf]}\n", "finite numbers above 0"),
        (
            "ttft_slo_seconds: 0.1\nhistogram_buckets: {time_to_first_token: [0.5, 1]}\n",
            "below the lowest bucket bound",
        ),
        (
            "slo: {overrides: [{match: 'model_name=\"a\"', ttft_seconds: 0}]}\n",
            "slo.overrides[0].ttft_seconds: a latency threshold is a number of seconds above 0",
        ),
        (
            "slo: {overrides: [{match: 'model_name=\"a\"', itl_seconds: 0.001}]}\n",
            "0.001 s is below the lowest bucket bound of inter_token_latency (0.01 s)",
        ),
    ],
)
def test_bad_bounds_are_one_line_naming_the_field(tmp_path, text, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_config(_config(tmp_path, text))


@pytest.mark.prometheus
def test_generate_says_when_a_threshold_is_not_a_bound_and_the_rules_read_below(tmp_path):
    path = _config(
        tmp_path,
        "histogram_buckets:\n  inter_token_latency: [0.02, 0.05, 0.08, 0.2, 0.5]\n",
    )
    res = run("generate", "--config", str(path), "--out", str(tmp_path / "out"))
    assert res.exit_code == 0, res.stderr
    assert "note: the ITL SLO threshold 0.1 s is not a bucket bound" in res.stderr
    rules = (tmp_path / "out" / "rules" / "recording.rules.yaml").read_text()
    assert 'vllm:inter_token_latency_seconds_bucket{le="0.08"}' in rules
    assert 'vllm:inter_token_latency_seconds_bucket{le="0.1"}' not in rules
    # The dashboards offer the site's bounds, and start at the one the rules read.
    board = json.loads((tmp_path / "out" / "dashboards" / "overview.json").read_text())
    (itl,) = [v for v in board["templating"]["list"] if v["name"] == "itl_slo"]
    assert itl["current"]["value"] == "0.08"
    assert [o["value"] for o in itl["options"]] == ["0.02", "0.05", "0.08", "0.2", "0.5"]
    # A threshold on a bound: no note.
    res = run("generate", "--out", str(tmp_path / "plain"))
    assert res.exit_code == 0 and "note:" not in res.stderr


def test_a_config_with_bad_bounds_fails_generate_with_one_line(tmp_path):
    path = _config(tmp_path, "histogram_buckets: {time_to_first_token: [3, 1]}\n")
    one_line(run("generate", "--config", str(path), "--out", str(tmp_path)), 2, "increasing")


# --- a server with its own bounds, in a real Prometheus --------------------------------------


@pytest.fixture(scope="module")
def custom(tmp_path_factory):
    prepared = harness.prepare([CUSTOM], tmp_path_factory.mktemp("custom"))[CUSTOM.name]
    with Prometheus(prepared.data_dir) as prom:
        yield prom, prepared.end


@pytest.mark.prometheus
def test_diagnose_reads_the_servers_bounds_and_says_where_it_read(custom, site):
    prom, end = custom
    window = Window.plan(CUSTOM.labels.window, end)
    result = diagnose(PrometheusSource(prom.url), site, window)
    (health,) = result.health
    slis = {s.name: s for s in health.slis}
    assert slis["ttft"].read_at == (0.8,) and slis["itl"].read_at == (0.08,)
    assert slis["ttft"].good is not None and slis["itl"].good is not None
    line = health_line(health)
    assert "TTFT<=1s (read at 0.8s: not a bucket bound)" in line, line
    assert "ITL<=0.1s (read at 0.08s: not a bucket bound)" in line, line
    # The share is the server's bucket at 0.8 s over its count, from Prometheus itself.
    at = prom.query(f'sum(rate({TTFT}_bucket{{le="0.8"}}[5m])) / sum(rate({TTFT}_count[5m]))', end)
    assert at and 0.0 <= float(at[0]["value"][1]) <= 1.0
    assert [f.playbook.id for f in result.findings][:1] == ["queue-saturation"]
    # A TTFT quantile at 120 s, the top of this server's bounds (not vLLM's 2,560 s), would
    # have fallen in +Inf: it is said as a lower bound.
    data = next(d for d in result.data.values() if d.scope == health.scope)
    assert data.ceilings["ttft_p99"] == (120.0,)
    assert data.ceilings["itl_p95"] == (5.0,)


@pytest.mark.prometheus
def test_the_json_says_which_bound_the_share_was_read_at(custom, tmp_path):
    prom, end = custom
    res = run(
        "diagnose",
        "--prometheus-url",
        prom.url,
        "--since",
        CUSTOM.labels.window,
        "--until",
        str(int(end)),
        "--format",
        "json",
    )
    assert res.exit_code in (0, 1), res.stderr
    doc = json.loads(res.stdout)
    (health,) = doc["health"]
    assert health["slo"]["ttft"]["read_at_seconds"] == [0.8]
    assert health["slo"]["itl"]["read_at_seconds"] == [0.08]
    assert health["slo"]["availability"]["read_at_seconds"] == []


@pytest.mark.prometheus
def test_without_reading_the_bounds_the_default_bucket_is_missing(custom, site):
    """What the reading buys: the default 1 s bucket does not exist on this server."""
    prom, end = custom
    assert prom.query(f'{TTFT}_bucket{{le="1.0"}}', end) == []
    assert prom.query(f'{TTFT}_bucket{{le="0.8"}}', end) != []


def test_a_scenario_with_bad_bounds_names_the_field(tmp_path):
    from diagnoser.sim.scenario import ScenarioError

    text = (HERE / "scenarios" / "custom-latency-buckets.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace("[0.01, 0.02, 0.05,", "[0.02, 0.01, 0.05,"))
    with pytest.raises(ScenarioError, match=r"engine\.histogram_buckets\.inter_token_latency"):
        load_scenario(path)
