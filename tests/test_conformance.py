"""The simulator's /metrics against vLLM's own metric code, one version profile at a time.

``tests/data/vllm-VERSION.json`` is what ``scripts/vllm-metrics-reference`` read from that
release's wheel. For each profile the simulator must expose every family that the release
registers with no optional feature on (KV connectors, speculative decoding, LoRA, ... are
off), with vLLM's type, label names and bucket bounds, the API server's HTTP families, and
nothing else; ``process_*`` only with one API-server process. The exposition is parsed with
prometheus_client, the library that writes vLLM's.
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
from diagnoser.metrics.buckets import request_token_buckets
from diagnoser.metrics.exposition import Recorder, text_exposition
from diagnoser.sim.run import Simulation
from diagnoser.sim.scenario import load_scenario
from diagnoser.sim.vllm_metrics import PROFILES

DATA = Path(__file__).resolve().parent / "data"
MAX_MODEL_LEN = 16384
PROCESS = {"process_cpu_seconds_total": "counter", "process_start_time_seconds": "gauge"}

SCENARIO = """\
description: Two data-parallel engines behind one API server, busy enough to fill them.
duration: 5m
scrape_interval: 15s
seed: 11
labels: {{window: 5m, expect: [], absent: []}}
models:
  - name: conf
    preset: llama-3.1-8b
    gpu: H100-80GB
    version: "{version}"
    engines: 2
    api_server: {{processes: {processes}}}
    engine:
      {{max_model_len: {max_model_len}, prefix_hit_share: 0.3, num_speculative_tokens: {spec},
        max_loras: {loras}}}
    workload:
      adapters: {adapters}
      rate: {{mean: 6}}
      prompt: {{median: 900, sigma: 0.8}}
      output: {{median: 120, sigma: 0.6}}
"""


def reference(version: str) -> dict[str, Any]:
    path = DATA / f"vllm-{version}.json"
    try:
        data = json.loads(path.read_text())
        data["families"].items()
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        pytest.fail(f"{path}: not a metrics reference ({exc}); run scripts/vllm-metrics-reference")
    return data


def expected(ref: dict[str, Any], processes: int) -> dict[str, dict[str, Any]]:
    """Exposed family name -> {type, labels, buckets} of everything the server must expose."""
    out = {}
    for name, fam in ref["families"].items():
        if fam["scope"] == "v1-stat-logger" and not fam["conditions"] and not fam["hidden"]:
            out[name] = fam
    for name, fam in ref["http_instrumentation"]["families"].items():
        out[name] = fam
    if processes == 1:
        out.update({n: {"type": t, "labels": []} for n, t in PROCESS.items()})
    return out


def exposition(
    tmp_path: Path,
    profile: str,
    processes: int,
    max_model_len: int = MAX_MODEL_LEN,
    speculative_tokens: int = 0,
    max_loras: int = 0,
) -> str:
    """The live /metrics of the scenario's server after five simulated minutes."""
    text = SCENARIO.format(
        version=profile,
        processes=processes,
        max_model_len=max_model_len,
        spec=speculative_tokens,
        loras=max_loras,
        adapters=2 * max_loras,
    )
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(text))
    sc = load_scenario(path)
    rec = Recorder(history=False)
    sim = Simulation(sc, Recorder(), 1_700_000_000.0)
    for _ in sim.run(1_700_000_000.0 + 300):
        pass
    (server,) = sim.runs[0].servers
    server.collect()
    server.record_metrics(rec, sim.t, {})
    return text_exposition(rec)


def bucket_list(fam: dict[str, Any]) -> tuple[float, ...]:
    spec = fam["buckets"]
    if isinstance(spec, str):
        assert spec.startswith("1-2-5 up to max_model_len"), spec
        return request_token_buckets(MAX_MODEL_LEN)
    return tuple(float(b) for b in spec)


@pytest.mark.parametrize(("profile", "processes"), [*((p, 1) for p in PROFILES), ("0.33", 2)])
def test_the_simulator_exposes_what_vllm_registers(tmp_path, profile, processes):
    ref = reference(PROFILES[profile])
    want = expected(ref, processes)
    got = parsed(exposition(tmp_path, profile, processes))
    assert sorted(set(want) - set(got)) == [], "families vLLM exposes and the simulator lacks"
    assert sorted(set(got) - set(want)) == [], "families the simulator invents"
    for name, fam in want.items():
        type_, labelsets, bounds = got[name]
        assert type_ == fam["type"], name
        assert labelsets == {frozenset(fam["labels"])}, name
        if fam["type"] == "histogram":
            assert bounds == {bucket_list(fam)}, name


def test_help_texts_are_vllms(tmp_path):
    ref = reference(PROFILES["0.33"])["families"]
    for fam in text_string_to_metric_families(exposition(tmp_path, "0.33", 1)):
        name = fam.name + ("_total" if fam.type == "counter" else "")
        if name in ref:
            assert fam.documentation == ref[name]["documentation"], name


def test_the_family_table_agrees_with_every_reference():
    """What the signals read (names, types, labels, buckets, version bounds) is vLLM's."""
    for version in PROFILES.values():
        families = reference(version)["families"]
        for fam in F.FAMILIES.values():
            if fam.provider != "vllm" or fam is F.CACHE_CONFIG:
                continue
            ref = families.get(fam.name)
            if not fam.exposed_in(version) or fam.requires:
                # Optional: absent, hidden, behind a condition, or registered by a connector
                # (KV offloading, NIXL) or the speculative decoder rather than the stat logger.
                optional = ref is None or ref["hidden"] or ref["conditions"]
                assert optional or ref["scope"] != "v1-stat-logger", (fam.name, version)
                continue
            assert ref is not None and not ref["hidden"], (fam.name, version)
            assert (ref["type"], set(ref["labels"])) == (fam.type, {*fam.base, *fam.labels})
            if fam.type == "histogram":
                assert bucket_list(ref) == fam.bucket_bounds(MAX_MODEL_LEN), fam.name


def test_the_family_tables_help_texts_are_vllms():
    """Every vLLM family vLLM 0.33 registers, optional ones included, carries vLLM's help text
    (the speculative decoder's are built at run time and cannot be read from the wheel)."""
    families = reference(PROFILES["0.33"])["families"]
    for fam in F.FAMILIES.values():
        ref = families.get(fam.name)
        if fam.provider == "vllm" and ref and ref["documentation"] != "<unresolved: doc>":
            assert fam.help == ref["documentation"], fam.name
            if fam is not F.CACHE_CONFIG:  # one label per CacheConfig field
                assert (ref["type"], set(ref["labels"])) == (fam.type, {*fam.base, *fam.labels})


def test_cache_config_info_has_no_model_name_and_sums_blocks_over_engines(tmp_path):
    infos = [
        s.labels
        for fam in text_string_to_metric_families(exposition(tmp_path, "0.33", 1))
        if fam.name == F.CACHE_CONFIG.name
        for s in fam.samples
    ]
    assert sorted(i["engine"] for i in infos) == ["0", "1"]
    assert all("model_name" not in i for i in infos)
    blocks = {int(i["num_gpu_blocks"]) for i in infos}
    tokens = {int(i["kv_cache_size_tokens"]) for i in infos}
    (total,), (per_engine,) = blocks, tokens
    assert total * 16 == pytest.approx(2 * per_engine, rel=0.01)
