"""Dashboards on a mixed fleet: an Engine variable, and every panel either reads both
engines' series or says in its description that it is vLLM only."""

from __future__ import annotations

import json
import re

import pytest

from diagnoser.outputs.dashboards import DASHBOARDS, render
from diagnoser.site import Site


def panels(name: str) -> list[dict]:
    board = json.loads(render(name, Site.default()))
    out = []
    for p in board["panels"]:
        out += [p, *p.get("panels", [])]
    return [p for p in out if p.get("targets")]


def exprs(panel: dict) -> list[str]:
    return [t["expr"] for t in panel["targets"] if t.get("expr")]


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_every_panel_reads_both_engines_or_says_it_is_vllm_only(name):
    for panel in panels(name):
        texts = exprs(panel)
        vllm = any(re.search(r"(?<![\w:])vllm:", t) for t in texts)
        sglang = any("sglang:" in t for t in texts)
        if vllm and not sglang:
            assert "vLLM only" in panel.get("description", ""), (name, panel["title"])
        if "vLLM only" in panel.get("description", ""):
            assert vllm, (name, panel["title"], "says vLLM only but reads no vLLM series")


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_the_engine_variable_chooses_the_servers_whose_models_are_listed(name):
    board = json.loads(render(name, Site.default()))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    engine = variables["serving_engine"]
    assert engine["label"] == "Engine"
    assert [o["value"] for o in engine["options"] if o["value"] != "$__all"] in (
        [],
        ["vllm", "sglang"],
    ) or engine["query"] == "vllm,sglang"
    for chained in ("job", "model_name", "instance"):
        query = variables[chained]["query"]
        query = query["query"] if isinstance(query, dict) else query
        assert "${serving_engine:regex}" in query, chained
        for engine_name, gauge in (
            ("vllm", "vllm:num_requests_running"),
            ("sglang", "sglang:num_running_reqs"),
        ):
            pattern = re.search(r'__name__=~"([^"]+)"', query)
            assert pattern is not None
            regex = pattern.group(1).replace("${serving_engine:regex}", engine_name)
            assert re.fullmatch(regex, gauge), (regex, gauge)
            other = "sglang" if engine_name == "vllm" else "vllm"
            assert not re.fullmatch(
                pattern.group(1).replace("${serving_engine:regex}", other), gauge
            )
