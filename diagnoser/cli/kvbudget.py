"""``servediag kv-budget``: plan the KV cache, and read each engine's live capacity."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from diagnoser.cli.options import (
    SourceOptions,
    config_option,
    fail,
    handles_errors,
    load_site,
    source_options,
)
from diagnoser.cli.params import TIMESTAMP, bounded
from diagnoser.hardware.presets import (
    DEFAULT_GPU,
    KV_CACHE_DTYPES,
    MODEL_ALIASES,
    SERVED_DTYPES,
    preset_like,
)
from diagnoser.kvbudget.budget import PLAN_LIMITS, PlanInputs, make_budget


@click.command("kv-budget")
@click.option(
    "--model",
    "model_ref",
    metavar="PRESET|CONFIG",
    help=f"A preset ({', '.join(MODEL_ALIASES)}) or a Hugging Face config.json "
    "(or the directory holding it).",
)
@click.option(
    "--gpu",
    "gpu_name",
    default=None,
    help="GPU preset (default: the GPU DCGM reports, with --prometheus-url; else H100-80GB, "
    "said in the notes).",
)
@click.option(
    "--gpu-memory-gb",
    type=bounded(PLAN_LIMITS["gpu_memory_gb"]),
    help="GPU memory in GB (10^9 bytes), instead of the preset's.",
)
@click.option(
    "--gpu-memory-utilization",
    type=bounded(PLAN_LIMITS["gpu_memory_utilization"]),
    default=PlanInputs.gpu_memory_utilization,
    show_default=True,
    help="vLLM's share of the GPU's memory.",
)
@click.option(
    "--weights-gb",
    type=bounded(PLAN_LIMITS["weights_gb"]),
    help="The weights' size in GB (default: the preset's, or estimated from config.json).",
)
@click.option(
    "--overhead-gb",
    type=bounded(PLAN_LIMITS["overhead_gb"]),
    default=PlanInputs.overhead_gb,
    show_default=True,
    help="Runtime overhead per GPU in GB (activations, CUDA graphs).",
)
@click.option(
    "--max-model-len",
    type=bounded(PLAN_LIMITS["max_model_len"]),
    help="Longest sequence (default: the model's max_position_embeddings).",
)
@click.option(
    "--context",
    type=bounded(PLAN_LIMITS["context"]),
    help="Tokens each user holds, prompt and answer (default: --max-model-len).",
)
@click.option(
    "--users", type=bounded(PLAN_LIMITS["users"]), help="Concurrent users to check against."
)
@click.option(
    "--tensor-parallel-size",
    "--tp",
    "tensor_parallel",
    type=bounded(PLAN_LIMITS["tensor_parallel"]),
    default=PlanInputs.tensor_parallel,
    show_default=True,
    help="GPUs the model is split across.",
)
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(list(KV_CACHE_DTYPES)),
    default=PlanInputs.kv_cache_dtype,
    show_default=True,
    help="As vLLM's flag: auto is the model's dtype; fp8 halves the bytes.",
)
@click.option(
    "--dtype",
    type=click.Choice(list(SERVED_DTYPES)),
    default=PlanInputs.dtype,
    show_default=True,
    help="As vLLM's flag: the dtype the server runs the model in (auto: config.json's, "
    "float32 served as bfloat16); the KV cache takes it under --kv-cache-dtype auto.",
)
@click.option(
    "--block-size",
    type=bounded(PLAN_LIMITS["block_size"]),
    default=PlanInputs.block_size,
    show_default=True,
    help="Tokens per KV-cache block, as vLLM's flag.",
)
@source_options(
    None, "Also read each vLLM engine's live KV capacity from here (also PROMETHEUS_URL)."
)
@click.option(
    "--at",
    "at",
    type=TIMESTAMP,
    default=None,
    metavar="TIME",
    help="With --prometheus-url: when to read it, RFC 3339 or Unix seconds (default: now).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@config_option
@handles_errors
def kv_budget_cmd(
    model_ref: str | None,
    gpu_name: str | None,
    source: SourceOptions,
    at: float | None,
    fmt: str,
    config_path: Path | None,
    **plan: Any,  # the other options: the plan's inputs, each named as PlanInputs names it
) -> None:
    """Plan the KV cache: bytes per token, sequences and users that fit, and what if.

    From a preset or a model's config.json (MLA models such as DeepSeek-V3 included):
    KV bytes per token, the free memory after weights and overhead, how many full-length
    sequences and users fit, and what FP8 KV or 2x/4x tensor parallelism would change. With
    --prometheus-url, also each running engine's capacity from vllm:cache_config_info.
    Exit status: 0 done, 2 bad input (one line naming the config field), 3 the metric
    source cannot be reached or answers garbage.

    \b
    Examples:
      servediag kv-budget --model llama-3.1-8b --context 8192 --users 64 --weights-gb 16
      servediag kv-budget --model ./DeepSeek-V3/config.json --gpu H200 --tp 8
      servediag kv-budget --model llama-3.1-8b --max-model-len 131072 \\
          --prometheus-url http://prometheus:9090 --format json
    """
    import time

    from diagnoser.kvbudget import report as kvbudget_report
    from diagnoser.kvbudget.live import dcgm_gpu, read_live

    if model_ref is None and source.url is None:
        fail("give --model PRESET|CONFIG, or --prometheus-url for the live capacity")
    if at is not None and source.url is None:
        fail("--at reads Prometheus: give --prometheus-url too")
    budget = None
    prometheus = source.connect().operation() if source.url is not None else None
    when = at if at is not None else time.time()
    gpu_from = "--gpu"
    if model_ref is not None and gpu_name is None and plan["gpu_memory_gb"] is None:
        seen = dcgm_gpu(prometheus, when) if prometheus is not None else None
        if seen is not None:
            gpu_name, plan["gpu_memory_gb"] = preset_like(*seen)
            gpu_from = f"{seen[0]}, from DCGM"
        else:
            gpu_from = f"assumed {DEFAULT_GPU}"
    try:  # the options are checked already; what DCGM reported is checked here
        inputs = PlanInputs(model_ref, gpu=gpu_name or DEFAULT_GPU, gpu_from=gpu_from, **plan)
    except ValueError as exc:
        fail(str(exc))
    if inputs.model is not None:
        budget = make_budget(inputs)
    live = None
    if prometheus is not None:
        longest_live = budget.max_model_len if budget else inputs.max_model_len
        selector = load_site(config_path).config.selector
        live = read_live(
            prometheus, when, longest_live, budget.context if budget else inputs.context, selector
        )
        for warning in prometheus.warnings:
            click.echo(f"servediag: warning: partial answer: {warning}", err=True)
    doc = kvbudget_report.to_json(budget, live)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(kvbudget_report.text(doc), nl=False)
