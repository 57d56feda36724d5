"""Disaggregated prefill and decode: each server's side is read from its series (a KV
connector's families, and the max_tokens its requests ask for), or named by the site; the
finish reasons and answers are read on the decode side, replicas are compared within their
side, and the dashboard draws both sides.

The library's disaggregated scenarios are also diagnosed (test_diagnose_library) and their
alerts evaluated (test_agreement) with the rest of the library: the healthy one finds and
fires nothing, the KV-transfer one names kv-transfer-failures first, without
stop-token-mismatch."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import grafana_substitute

from diagnoser.site import Site
from diagnoser.site.config import ConfigError, SiteConfig, load_config

pytestmark = pytest.mark.prometheus

NAME = "disaggregated-healthy"  # one prefill server (pd-chat-prefill-0), two decode servers
BOARD = Path(__file__).resolve().parent.parent / "dashboards" / "kv-batching.json"


def _value(prom, expr: str, at: float) -> dict[str, float]:
    return {
        " ".join(r["metric"].get(k, "") for k in ("model_name", "finished_reason")).strip(): float(
            r["value"][1]
        )
        for r in prom.query(expr, at=at)
    }


def _signal(site: Site, name: str) -> str:
    sig = site.vocabulary[name]
    return sig.render(site.scope(sig))


def test_each_side_is_read_from_the_series_and_drawn_apart(scenario_library, prometheus_for, site):
    prom, at = prometheus_for(NAME), scenario_library[NAME].end
    # Half the model's finished requests are the prefill side's "length" by design; the
    # signal reads the decode side, where answers end at their stop token.
    assert _value(prom, _signal(site, "finished_length_share"), at)["pd-chat"] < 0.02
    answers = _value(prom, _signal(site, "generation_tokens_per_request"), at)["pd-chat"]
    assert answers > 100
    panels = [p for row in json.loads(BOARD.read_text())["panels"] for p in row.get("panels", [])]
    (panel,) = [p for p in panels if p["title"] == "Output tokens per request by side"]
    decode, prefill = (_value(prom, grafana_substitute(t["expr"]), at) for t in panel["targets"])
    assert decode["pd-chat"] == pytest.approx(answers) and prefill["pd-chat"] == 1.0


def test_replicas_are_compared_within_their_side(scenario_library, prometheus_for, site):
    prom, at = prometheus_for(NAME), scenario_library[NAME].end
    # The prefill server holds no request between steps and the decode servers hold their
    # batches: set side by side they would look 1.5x out of balance, all day. Within each
    # side the two decode servers share the load and the prefill server is alone.
    assert _value(prom, _signal(site, "load_imbalance"), at)["pd-chat"] < 1.25


def test_a_site_names_the_servers_of_a_side_where_the_series_cannot_tell(
    scenario_library, prometheus_for, site
):
    prom, at = prometheus_for(NAME), scenario_library[NAME].end
    rate = _value(prom, _signal(site, "finished_rate_by_reason"), at)["pd-chat stop"]
    # A site that names one decode server a prefill server: it leaves the decode side.
    named = replace(site, config=SiteConfig(prefill_targets='instance=~"pd-chat-0:.*"'))
    alone = _value(prom, _signal(named, "finished_rate_by_reason"), at)["pd-chat stop"]
    assert 0.3 * rate < alone < 0.7 * rate


def test_a_bad_side_matcher_is_one_line_naming_the_key(tmp_path):
    path = tmp_path / "site.yaml"
    path.write_text("prefill_targets: 'pod = prefill'\n")
    with pytest.raises(ConfigError, match=r"prefill_targets: .* is not label matchers") as err:
        load_config(path)
    assert "\n" not in str(err.value)
