"""The KV-cache budget planner: the seed's arithmetic, config.json models (MLA included),
one-line errors for bad configs, and the live capacity read from a real Prometheus."""

from __future__ import annotations

import dataclasses
import json

import pytest
from click.testing import CliRunner

from diagnoser.cli import main
from diagnoser.hardware.hfconfig import ConfigFieldError, HfConfig, estimate_params
from diagnoser.hardware.presets import GB, ModelSpec, model
from diagnoser.sim import library

# Published config.json files (Hugging Face), trimmed of fields vLLM does not read here.
LLAMA_2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
    "vocab_size": 32000,
}
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "rope_scaling": {"factor": 8.0, "original_max_position_embeddings": 8192},
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 128256,
}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "first_k_dense_replace": 3,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 129280,
    "quantization_config": {"fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
}
# head_dim given and different from hidden_size / heads (5120 / 32 = 160).
MISTRAL_NEMO = {
    "architectures": ["MistralForCausalLM"],
    "head_dim": 128,
    "hidden_size": 5120,
    "intermediate_size": 14336,
    "max_position_embeddings": 1024000,
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
    "vocab_size": 131072,
}


def invoke(*args: str):
    """The CLI in-process, with no Prometheus in the environment unless a test names one."""
    runner = CliRunner(env={"PROMETHEUS_URL": None})
    return runner.invoke(main, ["kv-budget", *args], catch_exceptions=False)


def plan_json(*args: str) -> dict:
    res = invoke(*args, "--format", "json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def write_config(tmp_path, raw: dict, name: str = "config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(raw))
    return str(path)


# --- the seed's numbers ----------------------------------------------------------------------


def test_the_seed_example_64_users_need_68_7_gb_against_53_9_free_and_50_fit():
    # The seed rounds Llama-3.1-8B's weights to 16.0 GB.
    args = ("--model", "llama-3.1-8b", "--context", "8192", "--users", "64", "--weights-gb", "16")
    doc = plan_json(*args)
    p = doc["plan"]
    assert doc["kv_bytes_per_token"] == 128 * 1024
    assert round(p["need_bytes"] / GB, 1) == 68.7
    assert round(p["free_bytes"] / GB, 1) == 53.9
    assert p["users_fit"] == 50
    out = invoke(*args).stdout
    assert "KV needed = 64 users x 8,192 tokens x 128 KiB = 68.7 GB" in out
    assert "vs free = 80 x 0.9 - 16.0 GB weights - 2.14 GB runtime = 53.9 GB" in out
    assert "Only 50 of 64 users fit" in out


def test_the_preset_weights_give_the_same_50_users():
    doc = plan_json("--model", "llama-3.1-8b", "--context", "8192", "--users", "64")
    assert doc["weights"]["source"] == "preset: 8.03B parameters x 2 bytes"
    assert round(doc["plan"]["free_bytes"] / GB, 1) == 53.8  # 16.06 GB of weights
    assert doc["plan"]["users_fit"] == 50


def test_the_128k_upgrade_leaves_room_for_three_full_length_requests():
    doc = plan_json("--model", "llama-3.1-8b", "--max-model-len", "131072")
    assert doc["plan"]["full_length_sequences"] == 3


def test_llama2_needs_four_times_the_kv_of_llama31_from_presets_and_configs(tmp_path):
    presets = [
        plan_json("--model", m)["kv_bytes_per_token"] for m in ("llama-2-7b", "llama-3.1-8b")
    ]
    configs = [
        plan_json("--model", write_config(tmp_path, raw, f"{i}.json"))["kv_bytes_per_token"]
        for i, raw in enumerate((LLAMA_2_7B, LLAMA_31_8B))
    ]
    assert presets == configs == [512 * 1024, 128 * 1024]
    assert presets[0] == 4 * presets[1]


def test_fp8_kv_halves_the_bytes_and_doubles_the_users():
    doc = plan_json("--model", "llama-3.1-8b", "--context", "8192")
    auto, fp8 = doc["what_if"][0], doc["what_if"][1]
    assert (auto["kv_cache_dtype"], fp8["kv_cache_dtype"]) == ("auto", "fp8")
    assert fp8["kv_bytes_per_token"] * 2 == auto["kv_bytes_per_token"]
    assert fp8["users_fit"] in (2 * auto["users_fit"], 2 * auto["users_fit"] + 1)


def test_tensor_parallelism_splits_kv_heads_and_weights():
    doc = plan_json("--model", "llama-3.1-8b", "--context", "8192")
    by_tp = {(v["tensor_parallel"], v["kv_cache_dtype"]): v for v in doc["what_if"]}
    one, two, four = by_tp[(1, "auto")], by_tp[(2, "auto")], by_tp[(4, "auto")]
    assert [v["kv_heads_per_gpu"] for v in (one, two, four)] == [8, 4, 2]
    assert two["weight_bytes"] == pytest.approx(one["weight_bytes"] / 2)
    assert one["free_bytes"] < two["free_bytes"] < four["free_bytes"]
    assert one["users_fit"] * 2 < two["users_fit"]  # half the bytes per token and more room


# --- config.json models ----------------------------------------------------------------------


def test_deepseek_v3_caches_one_mla_latent_70272_bytes_a_token(tmp_path):
    doc = plan_json("--model", write_config(tmp_path, DEEPSEEK_V3), "--gpu", "H200", "--tp", "8")
    # 61 layers x (512 kv_lora_rank + 64 qk_rope_head_dim) x 2 bytes, not 2 x heads x dim
    assert doc["kv_bytes_per_token"] == 61 * (512 + 64) * 2 == 70_272
    assert doc["model"]["attention"] == "MLA"
    # Every GPU holds the whole latent: TP shrinks the weights, not the KV per token.
    assert {v["kv_bytes_per_token"] for v in doc["what_if"] if v["kv_cache_dtype"] == "auto"} == {
        70_272
    }
    assert any(v["kv_bytes_per_token"] == 35_136 for v in doc["what_if"])  # FP8 KV
    assert any("whole latent" in n for n in doc["notes"])


def test_the_deepseek_v3_preset_agrees_with_its_config(tmp_path):
    from_config = ModelSpec.from_hf_config(DEEPSEEK_V3)
    preset = model("deepseek-v3")
    assert from_config.kv_bytes_per_token() == preset.kv_bytes_per_token() == 70_272
    assert from_config.kv_bytes_per_token(2, tensor_parallel=8) == 70_272
    assert from_config.dtype_bytes == preset.dtype_bytes == 1  # FP8 weights


@pytest.mark.parametrize(
    ("raw", "published"),
    [(LLAMA_2_7B, 6.74e9), (LLAMA_31_8B, 8.03e9), (DEEPSEEK_V3, 671e9)],
    ids=["llama-2-7b", "llama-3.1-8b", "deepseek-v3"],
)
def test_the_weight_estimate_is_within_one_percent_of_the_published_count(raw, published):
    assert estimate_params(HfConfig(raw)) == pytest.approx(published, rel=0.01)


def test_an_estimated_weight_is_labelled_and_given_weights_win(tmp_path):
    path = write_config(tmp_path, LLAMA_31_8B)
    doc = plan_json("--model", path)
    assert doc["weights"]["source"].startswith("estimate from config.json")
    assert any("estimate" in n for n in doc["notes"])
    assert "estimate from config.json" in invoke("--model", path).stdout
    given = plan_json("--model", path, "--weights-gb", "20")
    assert given["weights"] == {"bytes": 20e9, "source": "given"}


def test_head_dim_falls_back_to_hidden_size_over_heads(tmp_path):
    assert "head_dim" not in LLAMA_31_8B
    assert ModelSpec.from_hf_config(LLAMA_31_8B).head_dim == 4096 // 32
    # An explicit head_dim wins over hidden_size / heads (which would say 160).
    nemo = plan_json("--model", write_config(tmp_path, MISTRAL_NEMO))
    assert nemo["model"]["head_dim"] == 128
    assert nemo["kv_bytes_per_token"] == 2 * 40 * 8 * 128 * 2


def test_a_directory_holding_config_json_is_a_model(tmp_path):
    write_config(tmp_path, LLAMA_31_8B)
    assert plan_json("--model", str(tmp_path))["kv_bytes_per_token"] == 128 * 1024


def test_missing_kv_heads_mean_multi_head_attention(tmp_path):
    raw = {k: v for k, v in LLAMA_2_7B.items() if k != "num_key_value_heads"}
    doc = plan_json("--model", write_config(tmp_path, raw))
    assert doc["model"]["kv_heads"] == 32 and doc["model"]["attention"] == "MHA"
    assert any("names no KV heads" in n for n in doc["notes"])


def test_fewer_kv_heads_than_gpus_are_replicated(tmp_path):
    raw = {**LLAMA_31_8B, "num_key_value_heads": 2}
    doc = plan_json("--model", write_config(tmp_path, raw), "--tp", "4")
    assert doc["plan"]["kv_heads_per_gpu"] == 1
    assert doc["plan"]["kv_bytes_per_token"] == 2 * 32 * 1 * 128 * 2
    assert any("replicated on 2 GPUs" in n for n in doc["notes"])


def test_impossible_tensor_parallel_sizes(tmp_path):
    res = invoke("--model", "llama-3.1-8b", "--tp", "3")
    assert res.exit_code == 2
    assert "32 attention heads are not divisible by 3" in res.stderr
    raw = {**LLAMA_31_8B, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 128}
    doc = plan_json("--model", write_config(tmp_path, raw))
    assert {v["tensor_parallel"] for v in doc["what_if"]} == {1, 2}
    assert doc["not_possible"] == ["TP 4 is not possible: 6 attention heads are not divisible by 4"]


def test_nothing_fits_says_vllm_will_not_start():
    doc = plan_json("--model", "llama-3.1-70b", "--max-model-len", "8192")
    assert doc["plan"]["free_bytes"] < 0 and doc["plan"]["full_length_sequences"] == 0
    assert any("no room for a KV cache" in n for n in doc["notes"])
    tight = plan_json("--model", "llama-3.1-8b", "--gpu", "L40S", "--gpu-memory-utilization", "0.6")
    assert tight["plan"]["full_length_sequences"] == 0
    assert any("kv-cannot-fit-max-model-len" in n for n in tight["notes"])


# --- bad input: one line naming the field, exit 2 ----------------------------------------------


def _without(key: str) -> dict:
    return {k: v for k, v in LLAMA_31_8B.items() if k != key}


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (json.dumps(_without("num_hidden_layers")), "config.json: num_hidden_layers: is missing"),
        (json.dumps(_without("num_attention_heads")), "num_attention_heads: is missing"),
        (
            json.dumps({**LLAMA_31_8B, "num_key_value_heads": 0}),
            "config.json: num_key_value_heads: must be positive, not 0",
        ),
        (
            json.dumps({**LLAMA_31_8B, "num_attention_heads": 0}),
            "num_attention_heads: must be positive, not 0",
        ),
        (json.dumps({**LLAMA_31_8B, "num_hidden_layers": "32"}), "must be a whole number"),
        (json.dumps(_without("hidden_size")), "hidden_size: is missing, and so is head_dim"),
        (json.dumps({**DEEPSEEK_V3, "qk_rope_head_dim": None}), "qk_rope_head_dim: is missing"),
        (json.dumps({**LLAMA_31_8B, "torch_dtype": "int3"}), "torch_dtype: unknown dtype 'int3'"),
        ("{not json", "config.json: not valid JSON"),
        ("[1, 2]", "config.json: must be a JSON object"),
    ],
    ids=[
        "no-layers",
        "no-heads",
        "zero-kv-heads",
        "zero-heads",
        "text-layers",
        "no-head-dim-nor-hidden",
        "mla-without-rope",
        "unknown-dtype",
        "not-json",
        "not-an-object",
    ],
)
def test_a_bad_config_is_one_line_naming_the_field_and_exit_2(tmp_path, content, says):
    path = tmp_path / "config.json"
    path.write_text(content)
    res = invoke("--model", str(path))
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and says in res.stderr, res.stderr
    assert res.stdout == ""


def test_a_missing_config_file_is_one_line_and_exit_2(tmp_path):
    res = invoke("--model", str(tmp_path / "nowhere" / "config.json"))
    assert res.exit_code == 2
    assert res.stderr.count("\n") == 1 and "cannot read: No such file" in res.stderr


def test_an_unknown_preset_lists_the_known_ones():
    res = invoke("--model", "llama-9")
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "unknown model preset 'llama-9'" in res.stderr and "deepseek-v3" in res.stderr


def test_weights_that_cannot_be_estimated_ask_for_weights_gb(tmp_path):
    path = write_config(tmp_path, _without("intermediate_size"))
    res = invoke("--model", path)
    assert res.exit_code == 2
    assert "intermediate_size: is missing; the weights cannot be estimated, pass --weights-gb" in (
        res.stderr
    )
    assert invoke("--model", path, "--weights-gb", "16").exit_code == 0


def test_a_config_without_a_length_needs_max_model_len(tmp_path):
    path = write_config(tmp_path, _without("max_position_embeddings"))
    res = invoke("--model", path)
    assert res.exit_code == 2 and "max_position_embeddings: is missing" in res.stderr
    assert invoke("--model", path, "--max-model-len", "8192").exit_code == 0


def test_quantized_weights_count_at_their_width():
    awq = {**LLAMA_31_8B, "quantization_config": {"quant_method": "awq", "bits": 4}}
    assert ModelSpec.from_hf_config(awq).dtype_bytes == 0.5
    odd = {**LLAMA_31_8B, "quantization_config": {"quant_method": "mystery"}}
    with pytest.raises(ConfigFieldError) as err:
        ModelSpec.from_hf_config(odd)
    assert err.value.field == "quantization_config.quant_method"


def test_nothing_to_plan_is_exit_2():
    res = invoke()
    assert res.exit_code == 2 and "give --model" in res.stderr


# --- the live capacity, from a real Prometheus -----------------------------------------------


def _final_engine(m):
    """The engine settings at the end of the scenario (its timeline applied)."""
    cfg = m.engine
    for change in m.timeline:
        knobs = {k.split(".", 1)[1]: v for k, v in change.set.items() if k.startswith("engine.")}
        cfg = dataclasses.replace(cfg, **knobs)
    return cfg


@pytest.mark.parametrize(
    ("name", "plan_args"),
    [
        ("the-128k-upgrade", ["--gpu-memory-utilization", "0.95"]),
        ("superlinear-prefill", ["--kv-cache-dtype", "fp8"]),
    ],
)
def test_the_live_capacity_is_the_simulated_engines(
    name, plan_args, scenario_library, prometheus_for
):
    sc = library.find(name)
    (m,) = sc.models
    cfg = _final_engine(m)
    blocks = cfg.num_gpu_blocks(m.spec, m.gpu)
    prom = prometheus_for(name)
    at = str(scenario_library[name].end)
    doc = plan_json(
        "--prometheus-url",
        prom.url,
        "--at",
        at,
        "--max-model-len",
        "131072",
        "--context",
        "8192",
    )
    assert "plan" not in doc
    engines = doc["live"]["engines"]
    assert len(engines) == m.instances * m.engines
    per_seq = 131072 // cfg.block_size
    for e in engines:
        assert e["model_name"] == m.name and e["num_gpu_blocks"] == blocks
        assert e["capacity_tokens"] == blocks * cfg.block_size
        assert e["full_length_sequences"] == blocks // per_seq
        assert e["users_fit"] == blocks // (8192 // cfg.block_size)
    # The planner, given the engine's settings, predicts the same number of blocks.
    both = plan_json(
        "--model", "llama-3.1-8b", *plan_args, "--prometheus-url", prom.url, "--at", at
    )
    assert both["plan"]["num_gpu_blocks"] == blocks
    text = invoke("--model", "llama-3.1-8b", "--prometheus-url", prom.url, "--at", at).stdout
    assert "Live capacity at" in text and f"{blocks:,}" in text


def test_the_128k_upgrade_live_has_room_for_three_full_length_requests(
    scenario_library, prometheus_for
):
    prom = prometheus_for("the-128k-upgrade")
    end = str(scenario_library["the-128k-upgrade"].end)
    doc = plan_json("--model", "llama-3.1-8b", "--prometheus-url", prom.url, "--at", end)
    (engine,) = doc["live"]["engines"]
    assert doc["live"]["max_model_len"] == 131072  # the model's, as none was given
    assert engine["full_length_sequences"] == 3


def test_no_cache_info_at_that_time_is_said_plainly(scenario_library, prometheus_for):
    prom = prometheus_for("the-128k-upgrade")
    day_before = str(scenario_library["the-128k-upgrade"].end - 86400)
    res = invoke("--prometheus-url", prom.url, "--at", day_before)
    assert res.exit_code == 0
    assert "no vllm:cache_config_info series" in res.stdout


def test_an_unreachable_prometheus_is_one_line_and_exit_3():
    from lab.promserver import free_port

    url = f"http://user:s3cret@127.0.0.1:{free_port()}"
    res = invoke("--model", "llama-3.1-8b", "--prometheus-url", url)
    assert res.exit_code == 3
    assert res.stderr.count("\n") == 1 and "connection refused" in res.stderr
    assert "s3cret" not in res.stderr


def test_prometheus_url_from_the_environment_and_shared_option_checks():
    from lab.promserver import free_port

    runner = CliRunner(env={"PROMETHEUS_URL": f"http://127.0.0.1:{free_port()}"})
    res = runner.invoke(main, ["kv-budget"], catch_exceptions=False)
    assert res.exit_code == 3 and "connection refused" in res.stderr
    bad = runner.invoke(main, ["kv-budget", "--header", "no-equals"], catch_exceptions=False)
    assert bad.exit_code == 2 and "must be NAME:VALUE" in bad.stderr
    res = invoke("--model", "llama-3.1-8b", "--at", "0")
    assert res.exit_code == 2 and "give --prometheus-url too" in res.stderr


def test_the_python_api_takes_every_input_the_command_line_does_and_plans_alike():
    """One list of the plan's inputs: the command line's options are the API's keywords,
    overhead and where the GPU came from included, and both give the same plan."""
    import diagnoser
    from diagnoser.kvbudget import report
    from diagnoser.kvbudget.budget import PlanInputs

    cli = plan_json(
        "--model", "llama-3.1-8b", "--gpu", "H200", "--overhead-gb", "4.5", "--users", "8",
        "--context", "4096", "--tp", "2", "--block-size", "32",
    )  # fmt: skip
    plan, live = diagnoser.kv_budget(
        "llama-3.1-8b",
        gpu="H200",
        overhead_gb=4.5,
        users=8,
        context=4096,
        tensor_parallel=2,
        block_size=32,
        gpu_from="--gpu",
    )
    assert live is None and plan is not None
    assert json.loads(json.dumps(report.to_json(plan, None))) == cli
    assert cli["runtime_overhead_bytes"] == 4.5 * GB
    inventory, _ = diagnoser.kv_budget("llama-3.1-8b", gpu_from="assumed H100-80GB")
    assert inventory is not None and inventory.gpu_from == "assumed H100-80GB"
    assert report.to_json(inventory, None) == plan_json("--model", "llama-3.1-8b")
    with pytest.raises(TypeError, match="overhead"):
        diagnoser.kv_budget("llama-3.1-8b", overheads_gb=1.0)
    fields = {f.name for f in dataclasses.fields(PlanInputs)}
    options = {p.name for p in main.commands["kv-budget"].params}
    assert fields - {"model", "gpu", "gpu_from"} <= options


# --- what the plan assumes, said ---------------------------------------------------------------


def test_a_server_run_in_float32_caches_four_bytes_a_value():
    """--dtype float32 (vLLM's flag): the KV cache takes the served dtype under auto."""
    auto = plan_json("--model", "llama-3.1-8b", "--gpu", "H100-80GB")
    wide = plan_json("--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--dtype", "float32")
    assert auto["plan"]["kv_bytes_per_value"] == 2 and auto["model"]["served_dtype"] == "bfloat16"
    assert wide["plan"]["kv_bytes_per_value"] == 4
    assert wide["plan"]["kv_bytes_per_token"] == 2 * auto["plan"]["kv_bytes_per_token"]
    assert wide["model"]["served_dtype_from"] == "--dtype"


def test_a_gpu_nobody_named_is_said_to_be_assumed():
    doc = plan_json("--model", "llama-3.1-8b")
    assert doc["gpu"]["source"] == "assumed H100-80GB"
    assert any(n.startswith("The GPU is assumed H100-80GB") for n in doc["notes"])
    named = plan_json("--model", "llama-3.1-8b", "--gpu", "H200")
    assert named["gpu"]["source"] == "--gpu" and not any("assumed" in n for n in named["notes"])


def test_live_the_gpu_comes_from_dcgm_and_the_unexported_dtype_is_said(
    scenario_library, prometheus_for
):
    """vLLM 0.32 and 0.33 export no served dtype (cache_config_info's cache_dtype is "auto"):
    the plan says which it assumed and from where; the GPU is the one DCGM reports."""
    prom = prometheus_for("the-128k-upgrade")
    end = str(scenario_library["the-128k-upgrade"].end)
    doc = plan_json("--model", "llama-3.1-8b", "--prometheus-url", prom.url, "--at", end)
    assert doc["gpu"]["source"] == "H100-80GB, from DCGM" and doc["gpu"]["name"] == "H100-80GB"
    said = [n for n in doc["notes"] if n.startswith("The served dtype is not in vLLM's series")]
    assert said and "assumes bfloat16, from the preset; give --dtype" in said[0]
    given = plan_json(
        "--model", "llama-3.1-8b", "--dtype", "float32", "--prometheus-url", prom.url, "--at", end
    )
    assert not any(n.startswith("The served dtype") for n in given["notes"])


def _dcgm_answers(series: dict) -> object:
    """A Prometheus whose DCGM framebuffer query gets ``series``, and every other none."""
    from urllib.parse import parse_qs, urlsplit

    from loopback import answer

    def respond(h, f):
        query = parse_qs(urlsplit(h.path).query).get("query", [""])[0]
        found = [series] if "DCGM_FI_DEV_FB" in query else []
        answer(h, {"status": "success", "data": {"resultType": "vector", "result": found}})

    return respond


@pytest.mark.parametrize("value", ["+Inf", "NaN"])
def test_a_dcgm_framebuffer_that_is_no_size_is_one_line(value):
    from clitest import one_line, run
    from loopback import serve

    gpu = {"metric": {"modelName": "NVIDIA H100 80GB HBM3"}, "value": [1, value]}
    with serve(_dcgm_answers(gpu)) as prom:
        res = run("kv-budget", "--model", "llama-3.1-8b", "--prometheus-url", prom.url)
    one_line(res, 3, f"as {value} MiB, not a size", "give --gpu")


def test_a_dcgm_series_without_a_point_is_no_gpu_reported():
    from clitest import run
    from loopback import serve

    gpu = {"metric": {"modelName": "NVIDIA H100 80GB HBM3"}, "values": []}
    with serve(_dcgm_answers(gpu)) as prom:
        res = run("kv-budget", "--model", "llama-3.1-8b", "--prometheus-url", prom.url)
    assert res.exit_code == 0, res.stderr
    assert "no DCGM series told" in " ".join(res.stdout.split())
