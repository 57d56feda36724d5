"""SGLang servers in a real Prometheus: the recording rules give them the same series as vLLM's,
the alerts fire on them, and diagnose decides what SGLang's series can tell, says why it cannot
decide the rest, and keeps a mixed fleet's models apart."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.diagnosis.match import ScopeData, evaluate
from diagnoser.plumbing.source import PrometheusSource, Series
from diagnoser.sim import library
from lab import harness
from lab.alerts import backfill_rules, firing
from lab.promserver import Prometheus

SCENARIOS = ["mixed-fleet-retrieval", "sglang-kv-cache-pressure"]


def test_a_playbook_needing_what_sglang_lacks_is_undecided_whatever_else_holds(site):
    """stop-token-mismatch's other required condition fails here (answers did not grow):
    on vLLM that clears it, on SGLang it stays undecided for the reason SGLang gives."""
    pb = site.catalog["stop-token-mismatch"]
    t = np.arange(0.0, 7200.0, 60.0)
    flat = Series({"model_name": "m"}, t, np.full(t.size, 300.0))
    gaps = {s.name: s.gap("sglang") for s in site.vocabulary if not s.on("sglang")}
    base, window = (0.0, 3600.0), (3600.0, 7200.0)
    vllm = ScopeData({"model_name": "m"}, {"generation_tokens_per_request": flat})
    sglang = ScopeData({"model_name": "m"}, dict(vllm.series), gaps=gaps)
    assert evaluate(pb, vllm, window, base, 60.0).status in ("not_matched", "undecided")
    m = evaluate(pb, sglang, window, base, 60.0)
    assert m.status == "undecided"
    assert "finished_length_share" in m.missing
    assert "SGLang exports no finished_reason" in m.reason


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return harness.prepare(SCENARIOS, tmp_path_factory.mktemp("sglang"))


@pytest.fixture(scope="module")
def mixed(prepared, site) -> dict:
    sc = library.find("mixed-fleet-retrieval")
    with Prometheus(prepared[sc.name].data_dir) as prom:
        window = Window.plan(sc.labels.window, prepared[sc.name].end)
        return to_json(diagnose(PrometheusSource(prom.url), site, window))


@pytest.mark.prometheus
def test_a_mixed_fleet_finds_the_cause_on_the_sglang_model_only(mixed):
    """The cause on the SGLang model, and nothing on the vLLM one. SGLang runs each long
    prompt's prefill alone while its streams wait, so their stalls may be found too: only as
    the cause's consequence."""
    top, *rest = mixed["findings"]
    assert top["id"] == "prompt-length-shift" and top["scope"] == {"model_name": "qwen3-8b"}
    for f in rest:
        assert f["scope"] == {"model_name": "qwen3-8b"}, f["scope"]
        assert f["explained_by"] == "prompt-length-shift", (f["id"], f["explained_by"])
    verdicts = {h["scope"]["model_name"]: h["verdict"] for h in mixed["health"]}
    assert verdicts == {"llama-3.1-8b-instruct": "healthy", "qwen3-8b": "unhealthy"}


@pytest.mark.prometheus
def test_at_sglangs_defaults_the_evidence_says_what_stood_in_for_the_median_prompt(mixed):
    """The SGLang servers run at their defaults (no --collect-tokens-histogram): the typical
    prompt is estimated from the median prefill, and the evidence says so."""
    top = mixed["findings"][0]
    (p50,) = [e for e in top["evidence"] if e["signal"] == "prompt_tokens_p50"]
    assert p50["holds"] and p50["read_as"].startswith("prompt_tokens_p50_from_prefill: ")
    assert "--collect-tokens-histogram" in p50["read_as"]


@pytest.mark.prometheus
def test_what_sglang_cannot_tell_is_undecided_with_its_reason(mixed):
    undecided = {(u["id"], u["scope"]["model_name"]): u for u in mixed["undecided"] if u["scope"]}
    on_sglang = undecided[("stop-token-mismatch", "qwen3-8b")]
    assert "SGLang exports no finished_reason" in on_sglang["reason"]
    assert on_sglang["provided_by"] == []  # no version of anything would provide it
    assert ("stop-token-mismatch", "llama-3.1-8b-instruct") not in undecided


@pytest.mark.prometheus
def test_the_recording_rules_and_alerts_read_sglang(prepared, tmp_path, site):
    """KV-cache pressure on SGLang: token usage near 1 and retractions under the names the
    alerts read, and the alert fires for the SGLang model."""
    from pathlib import Path

    rules = Path(__file__).resolve().parent.parent / "rules"
    sc = library.find("sglang-kv-cache-pressure")
    p = prepared[sc.name]
    data = tmp_path / "tsdb"
    shutil.copytree(p.data_dir, data)
    window = Window.plan(sc.labels.window, p.end)
    with Prometheus(data) as prom:
        backfill_rules(prom, rules / "recording.rules.yaml", window.first - 3600, window.end)
        source = PrometheusSource(prom.url)
        usage = source.query_range(
            "model_name:vllm_kv_cache_usage:max", window.start, window.end, 60.0
        )
        retracted = source.query_range(
            "model_name:vllm_num_preemptions:rate5m", window.start, window.end, 60.0
        )
        fired = firing(prom, rules / "alerts.rules.yaml", window.start, window.end)
    assert usage and np.nanmax(usage[0].v) > 0.95
    assert retracted and np.nanmax(retracted[0].v) > 0.01
    assert "VllmKvCachePressure" in {f.alert for f in fired}


def test_every_sglang_bucket_bound_read_is_one_sglang_has():
    """A threshold read from an SGLang histogram (le="...") must be one of its bounds: the
    stall share reads 0.4 s there, since SGLang's ITL buckets have no 0.3 s."""
    import re

    from diagnoser.metrics import families as F
    from diagnoser.metrics.buckets import le_label
    from diagnoser.metrics.signals import SIGNALS

    pattern = re.compile(r'(sglang:[a-z_]+)_bucket\{[^}]*le="([^"]+)"')
    seen = set()
    for sig in SIGNALS:
        if not sig.on("sglang"):
            continue
        for name, le in pattern.findall(sig.render(engine="sglang")):
            fam = F.family(name)
            assert le == "+Inf" or le in {le_label(b) for b in fam.bucket_bounds(0)}, (sig, le)
            seen.add((sig.name, le))
    assert ("itl_stall_share", "0.4") in seen


def test_sglang_scheduler_series_are_one_per_engine_and_the_queue_total():
    from diagnoser.metrics.signals import SIGNALS

    text = SIGNALS["requests_waiting"].render(engine="sglang")
    assert (
        'max without (tp_rank, pp_rank, moe_ep_rank) (sglang:num_queue_reqs{priority=""})' in text
    )
    # tokenizer series carry no ranks and a priority per request: summed as they are
    assert "priority" not in SIGNALS["ttft_p95"].render(engine="sglang")


@pytest.mark.parametrize(
    ("model", "field", "says"),
    [
        ("runtime: tgi", "models[0].runtime", "must be one of vllm, sglang"),
        ('runtime: sglang\n    version: "0.33"', "models[0].version", "must be one of 0.5"),
    ],
)
def test_a_scenario_names_a_known_runtime_and_one_of_its_versions(tmp_path, model, field, says):
    from diagnoser.sim.scenario import ScenarioError, load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(
        "description: x\nduration: 10m\nlabels: {expect: []}\nmodels:\n"
        f"  - name: m\n    preset: llama-3.1-8b\n    {model}\n"
        "    workload: {rate: {mean: 1}, prompt: {median: 100}, output: {median: 10}}\n"
    )
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    assert field in str(err.value) and says in str(err.value)
