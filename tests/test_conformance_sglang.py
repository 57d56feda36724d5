"""The simulator's SGLang /metrics against SGLang's own metric code (0.5.23).

``tests/data/sglang-0.5.23.json`` is what ``scripts/sglang-metrics-reference`` read from the
wheel. A unified server started with ``--enable-metrics`` and no other option exports every
family of its LLM runtime except those behind an option or an event listed below (each with
the reason); the simulator must export exactly the rest, with SGLang's type, label names and
bucket bounds, and the family table (``diagnoser.metrics.families_sglang``) must say the same.
Label names are the collector's default ones: ``dp_rank`` and ``priority`` appear only with
data parallelism and priority scheduling, and a gauge without a ``multiprocess_mode`` carries
the ``pid`` prometheus_client's multiprocess mode gives it.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from scrape import parsed

from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics.exposition import Recorder, text_exposition
from diagnoser.sim.run import Simulation
from diagnoser.sim.scenario import load_scenario
from diagnoser.sim.sglang_metrics import PROFILES

DATA = Path(__file__).resolve().parent / "data"
OPTIONAL_LABELS = {"priority", "dp_rank"}
PER_PROCESS = (None, "all", "liveall")  # gauge modes that keep a pid label

_HICACHE = "--enable-hierarchical-cache"
_DISAGG = "--disaggregation-mode prefill|decode"
_GRAMMAR = "requests with a grammar (json_schema, regex, ebnf)"
_DP_ATTN = "--enable-dp-attention"
# Families SGLang registers that a default unified server does not export, and why.
NOT_EXPORTED = {
    **dict.fromkeys(
        ("lora_pool_slots_total", "lora_pool_slots_used", "lora_pool_utilization"),
        "--enable-lora",
    ),
    **dict.fromkeys(
        (
            "hicache_host_used_tokens",
            "hicache_host_total_tokens",
            "hicache_host_mamba_used_states",
            "hicache_host_mamba_total_states",
            "hicache_backup_bytes_total",
            "hicache_backup_duration_seconds",
            "hicache_backup_tokens_total",
            "hicache_dropped_tokens_total",
            "load_back_bytes_total",
            "load_back_duration_seconds",
            "load_back_tokens_total",
        ),
        _HICACHE,
    ),
    **dict.fromkeys(
        (
            "backup_bandwidth",
            "backup_pgs",
            "backuped_tokens_total",
            "hicache_backup_dropped_tokens_total",
            "hicache_prefetch_aux_alloc_failed_tokens_total",
            "prefetch_bandwidth",
            "prefetch_pgs",
            "prefetched_tokens_total",
            "storage_prefetch_deferred_tokens_total",
            "storage_prefetch_hit_tokens_total",
            "storage_prefetch_unfulfilled_tokens_total",
        ),
        "--hicache-storage-backend",
    ),
    **dict.fromkeys(
        ("num_streaming_sessions", "streaming_session_held_tokens"),
        "--enable-streaming-session",
    ),
    **dict.fromkeys(
        (
            "grammar_compilation_time_seconds",
            "grammar_ebnf_size",
            "grammar_schema_count",
            "grammar_tree_traversal_time_avg",
            "grammar_tree_traversal_time_max",
            "num_grammar_aborted_total",
            "num_grammar_cache_hit_total",
            "num_grammar_timeout_total",
            "num_grammar_total",
            "num_so_requests_total",
        ),
        _GRAMMAR,
    ),
    "spec_verify_calls_total": "--speculative-algorithm",
    **dict.fromkeys(
        (
            "kv_transfer_alloc_ms",
            "kv_transfer_bootstrap_ms",
            "kv_transfer_latency_ms",
            "kv_transfer_speed_gb_s",
            "kv_transfer_total_mb",
            "decode_deferred_kv_release_seconds",
            "decode_deferred_kv_release_total",
            "num_bootstrap_failed_reqs_total",
            "num_transfer_failed_reqs_total",
            "num_prefill_retries_total",
            "num_decode_host_receive_reqs_total",
            "failed_session_recoveries_total",
            "encoder_dp_pending_requests",
        ),
        _DISAGG,
    ),
    **dict.fromkeys(
        (
            "dp_attention_pairs_total",
            "dp_attention_steps_total",
            "dp_attention_sync_wait_seconds",
            "dp_attention_token_imbalance_ratio",
            "dp_attention_tokens_total",
            "dp_cooperation_forward_execution_seconds_total",
            "dp_cooperation_realtime_tokens_total",
        ),
        _DP_ATTN,
    ),
    **dict.fromkeys(
        (
            "estimated_flops_per_gpu_total",
            "estimated_read_bytes_per_gpu_total",
            "estimated_write_bytes_per_gpu_total",
        ),
        "--enable-mfu-metrics",
    ),
    "forward_execution_seconds_total": "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1",
    "eplb_balancedness": "expert-parallel load balancing (--enable-eplb)",
    "eplb_gpu_physical_count": "expert-parallel load balancing (--enable-eplb)",
    **dict.fromkeys(
        (
            "prefill_delayer_outcomes_total",
            "prefill_delayer_wait_forward_passes",
            "prefill_delayer_wait_seconds",
        ),
        "--enable-prefill-delayer",
    ),
    "weight_load_duration_seconds": "a weight update (update_weights_from_*)",
    "max_total_num_tokens_swa": "a hybrid sliding-window model",
    "max_running_requests_under_SLO": "never set by the scheduler (None) in 0.5.23",
    "get_loads_duration_seconds": "/v1/loads, which a router calls",
    "func_latency_seconds": "no function is timed with time_func_latency in 0.5.23",
    "startup_latency_breakdown_seconds_max": "enable_startup_timer() is never called",
}
# Families behind a server flag in some 0.5 releases: SGLang up to 0.5.10.post1 observes the
# token-length histograms only with --collect-tokens-histogram (ServerArgs default False);
# 0.5.11 and later always do, so 0.5.23's reference has them, and the simulator exports them
# with the flag alone (SGLang's defaults without it). The family table says the same.
FLAGGED = {
    f"sglang:{n}": SG.TOKENS_HISTOGRAM
    for n in (
        "prompt_tokens_histogram",
        "uncached_prompt_tokens_histogram",
        "generation_tokens_histogram",
    )
}
# Exported after an event the simulator does not produce.
NOT_SIMULATED = {
    "num_aborted_requests_total": "a client that goes away (the simulated clients never do)",
    "evicted_tokens_total": "the radix cache evicting (the simulator keeps no radix tree)",
    "eviction_duration_seconds": "the radix cache evicting (the simulator keeps no radix tree)",
}

SCENARIO = """\
description: >-
  One SGLang server whose requests are retracted: long answers near their max_tokens outgrow
  the room admission keeps for output (new_token_ratio), as in sglang-kv-cache-pressure.
duration: 8m
scrape_interval: 15s
seed: 5
labels: {window: 5m, expect: [], absent: []}
models:
  - name: conf
    runtime: sglang
    preset: llama-2-7b
    gpu: H100-80GB
    engine: {max_model_len: 4096, prefix_hit_share: 0.3, max_num_seqs: 256}
    workload:
      rate: {mean: 4}
      prompt: {median: 500, sigma: 0.5}
      output: {median: 1700, sigma: 0.15}
      max_tokens: 2048
"""


def reference() -> dict[str, Any]:
    path = DATA / f"sglang-{PROFILES['0.5']}.json"
    return json.loads(path.read_text())


def llm_runtime(ref: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The LLM server's families (not the diffusion runtime's)."""
    return {n: f for n, f in ref["families"].items() if f["scope"] != "multimodal-gen"}


def skipped(ref: dict[str, Any]) -> set[str]:
    """The families a default server does not export, or the simulator does not produce."""
    encoder = {n for n in llm_runtime(ref) if n.startswith("sglang:encoder_")}
    return {f"sglang:{n}" for n in (*NOT_EXPORTED, *NOT_SIMULATED)} | encoder


def labels_of(fam: dict[str, Any]) -> set[str]:
    labels = {x for x in fam["labels"] if x not in OPTIONAL_LABELS}
    if fam["type"] == "gauge" and fam.get("multiprocess_mode") in PER_PROCESS:
        labels.add("pid")
    return labels


def exposition(path: Path, flags: str = "") -> str:
    """The scenario's server's /metrics at its end, started with ``flags`` (engine keys)."""
    text = textwrap.dedent(SCENARIO)
    if flags:
        text = text.replace("max_num_seqs: 256}", f"max_num_seqs: 256, {flags}}}")
    path.write_text(text)
    sc = load_scenario(path)
    start = 1_700_000_000.0
    sim = Simulation(sc, Recorder(), start)
    for _ in sim.run(start + sc.duration):
        pass
    (server,) = sim.runs[0].servers
    server.collect()
    rec = Recorder(history=False)
    server.record_metrics(rec, sim.t, {})
    return text_exposition(rec)


@pytest.fixture(scope="module")
def exposed(tmp_path_factory) -> str:
    """As 0.5.23 exports: the token histograms on (--collect-tokens-histogram before 0.5.11)."""
    path = tmp_path_factory.mktemp("sglang") / "s.yaml"
    return exposition(path, "collect_tokens_histogram: true")


def test_without_the_flag_the_token_histograms_alone_are_missing(exposed, tmp_path):
    """At SGLang's defaults (no --collect-tokens-histogram) the server exports every family it
    exports with the flag but the token-length histograms; the table marks those alone."""
    default = {n for n in parsed(exposition(tmp_path / "s.yaml")) if n.startswith("sglang:")}
    flagged = {n for n in parsed(exposed) if n.startswith("sglang:")}
    assert sorted(flagged - default) == sorted(FLAGGED)
    assert default <= flagged
    needs = {f.name: f.requires for f in F.FAMILIES.values() if f.provider == "sglang"}
    assert {n: r for n, r in needs.items() if r == SG.TOKENS_HISTOGRAM} == FLAGGED


def test_every_registered_family_is_exported_or_has_a_reason():
    ref = llm_runtime(reference())
    names = {n.removeprefix("sglang:") for n in ref}
    assert sorted(set(NOT_EXPORTED) - names) == [], "reasons for families SGLang lacks"
    assert sorted(set(NOT_SIMULATED) - names) == []
    table = {f.name for f in F.FAMILIES.values() if f.provider == "sglang"}
    rest = set(ref) - skipped(reference())
    assert sorted(rest - table) == [], "families a default server exports, not in the table"
    assert sorted(table - set(ref)) == [], "families in the table SGLang does not register"


def test_the_simulator_exports_what_sglang_exports(exposed):
    ref = llm_runtime(reference())
    want = {n: f for n, f in ref.items() if n not in skipped(reference())}
    got = {n: v for n, v in parsed(exposed).items() if n.startswith("sglang:")}
    assert sorted(set(want) - set(got)) == [], "families SGLang exports and the simulator lacks"
    assert sorted(set(got) - set(want)) == [], "families the simulator invents"
    for name, fam in want.items():
        type_, labelsets, bounds = got[name]
        assert type_ == fam["type"], name
        assert {frozenset(ls - {"le", "gt"}) for ls in labelsets} == {
            frozenset(labels_of(fam) - {"le", "gt"})
        }, name
        if fam["type"] == "histogram":
            assert bounds == {tuple(float(b) for b in fam["buckets"])}, name


def test_nothing_but_sglang_and_the_scrape(exposed):
    """No vLLM family, no API-server instrumentator, no process_* (multiprocess registry)."""
    others = [n for n in parsed(exposed) if not n.startswith("sglang:")]
    assert others == []


def test_the_family_table_agrees_with_the_reference():
    ref = reference()["families"]
    for fam in F.FAMILIES.values():
        if fam.provider != "sglang":
            continue
        r = ref[fam.name]
        assert r["type"] == fam.type, fam.name
        assert {*fam.base, *fam.labels} == labels_of(r), fam.name
        assert fam.help == r["documentation"], fam.name
        if fam.type == "histogram":
            assert fam.bucket_bounds(0) == tuple(float(b) for b in r["buckets"]), fam.name


def test_retractions_and_cache_hits_were_counted(exposed):
    """The scenario exercises the event-driven families the signals read."""
    samples = {
        s.name: s.value
        for fam in text_string_to_metric_families(exposed)
        for s in fam.samples
        if not s.name.endswith(("_bucket",))
    }
    assert samples["sglang:num_retracted_requests_total"] > 0
    assert samples["sglang:cached_tokens_total"] > 0
    assert samples["sglang:num_requests_total"] > 0
