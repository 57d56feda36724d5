"""``servediag what-if``: replay the live workload through the calibrated engine, with and
without each lever of a fix."""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from diagnoser.cli.options import (
    EXIT_FOUND,
    F,
    SourceOptions,
    config_option,
    fail,
    handles_errors,
    load_site,
    source_options,
)
from diagnoser.cli.params import DURATION, TIMESTAMP
from diagnoser.hardware.hfconfig import LARGEST
from diagnoser.hardware.presets import GIB, MODEL_ALIASES, SERVED_DTYPES, GpuSpec

if TYPE_CHECKING:
    from diagnoser.catalog.levers import Lever
    from diagnoser.core.source import MetricSource
    from diagnoser.hardware.presets import ModelSpec
    from diagnoser.site import Site
    from diagnoser.whatif.predict import WhatIf

# vLLM's scheduler defaults for the OpenAI server (engine/arg_utils.py get_batch_defaults of
# 0.32): a GPU of at least 160 GiB gets the largest, one of at least 70 GiB that is not an
# A100 the larger pair; the CPU build its own (128 and 2048 for one engine).
LARGEST_GPU, LARGE_GPU = 160 * GIB, 70 * GIB


def vllm_defaults(g: GpuSpec) -> tuple[int, int]:
    """(max_num_seqs, max_num_batched_tokens) vLLM picks for ``g`` when not told."""
    if g.host_bound:
        return 128, 2048
    if g.memory_bytes >= LARGEST_GPU:
        return 1024, 16384
    if g.memory_bytes >= LARGE_GPU and "a100" not in g.name.lower():
        return 1024, 8192
    return 256, 2048


@dataclass(frozen=True)
class SetupOptions:
    """What the series do not say about the servers, as the options say: the model's shape,
    the GPU, the scheduler limits, the tensor-parallel size."""

    preset: str | None
    model_config: Path | None
    gpu_name: str | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    max_model_len: int | None
    tensor_parallel: int
    dtype: str


_SETUP_PARAMS = tuple(f.name for f in dataclasses.fields(SetupOptions))


def setup_options(fn: F) -> F:
    """``--preset``, ``--model-config``, ``--gpu``, the scheduler limits and ``--tp``, handed to
    the command as one ``setup: SetupOptions`` argument (what-if's, and diagnose --what-if's)."""
    options = [
        click.option(
            "--preset",
            default=None,
            metavar="NAME",
            help=f"The model's shape from a preset ({', '.join(MODEL_ALIASES)}).",
        ),
        click.option(
            "--model-config",
            type=click.Path(path_type=Path),
            default=None,
            metavar="CONFIG",
            help="The model's shape from its Hugging Face config.json (or its directory).",
        ),
        click.option(
            "--gpu",
            "gpu_name",
            default=None,
            help="GPU preset, or CPU for vLLM's CPU build (default: the GPU DCGM reports; "
            "required without DCGM).",
        ),
        click.option(
            "--max-num-seqs",
            type=click.IntRange(1, 1 << 20),
            default=None,
            help="The servers' --max-num-seqs (default: vLLM's for the GPU).",
        ),
        click.option(
            "--max-num-batched-tokens",
            type=click.IntRange(16, 1 << 26),
            default=None,
            help="The servers' --max-num-batched-tokens (default: vLLM's for the GPU).",
        ),
        click.option(
            "--max-model-len",
            type=click.IntRange(1, LARGEST),
            default=None,
            help="The servers' --max-model-len (default: the model's, within the KV cache).",
        ),
        click.option(
            "--tensor-parallel-size",
            "--tp",
            "tensor_parallel",
            type=click.IntRange(1, 64),
            default=1,
            show_default=True,
            help="GPUs each engine is split across.",
        ),
        click.option(
            "--dtype",
            type=click.Choice(SERVED_DTYPES),
            default="auto",
            show_default=True,
            help="The servers' --dtype (auto: the config's, float32 served as bfloat16).",
        ),
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        setup = SetupOptions(*(kwargs.pop(name) for name in _SETUP_PARAMS))
        if setup.preset is not None and setup.model_config is not None:
            fail("give --preset or --model-config, not both")
        return fn(*args, setup=setup, **kwargs)

    decorated: Any = wrapper
    for option in reversed(options):
        decorated = option(decorated)
    return decorated  # type: ignore[no-any-return]


@click.command("what-if")
@click.option(
    "--since",
    type=DURATION,
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Fit this much time up to --until.",
)
@click.option(
    "--until",
    type=TIMESTAMP,
    default=None,
    metavar="TIME",
    help="End of the window: RFC 3339 or Unix seconds (default: now).",
)
@source_options("http://localhost:9090", "Prometheus-compatible API (also PROMETHEUS_URL).")
@click.option("--model", default=None, help="The model_name (default: the only one serving).")
@setup_options
@click.option(
    "--lever",
    "levers",
    multiple=True,
    metavar="NAME[:CHANGE]",
    help="A lever to predict, e.g. gpu_memory_utilization:+0.05, max_num_seqs:x0.75, "
    "kv_cache_dtype:fp8, replicas:+1 (repeatable; default: every lever of the catalog's "
    "fixes).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@config_option
@handles_errors
def what_if_cmd(
    since: float,
    until: float | None,
    source: SourceOptions,
    model: str | None,
    setup: SetupOptions,
    levers: tuple[str, ...],
    fmt: str,
    config_path: Path | None,
) -> None:
    """Predict what each fix's lever would do, from the live workload of one model.

    Fits the window's workload (arrival rate, prompt and output lengths, the share stopping
    on length, prefix-cache hits) and engine (vllm:cache_config_info, the scheduler limits,
    the GPU, the model's shape), replays it through the simulator and fits two speed
    factors until the replay matches what was measured (TTFT and ITL p50/p95, KV usage,
    preemptions, the queue, within 30%), then replays each lever: predicted TTFT and ITL
    p95, throughput, preemptions and SLO attainment next to today's, with the calibration's
    residual as a ± band. Exit status: 0 predicted, 1 the calibration refused (the replay
    does not match the window: nothing predicted), 2 bad input (too little traffic to fit,
    an unknown model shape, a lever the engine does not have), 3 the metric source cannot be
    reached or answers garbage.

    \b
    Examples:
      servediag what-if --since 1h --model llama-3.1-8b --preset llama-3.1-8b
      servediag what-if --model-config ./config.json --gpu H100-80GB \\
          --lever gpu_memory_utilization:+0.05 --lever max_num_seqs:x0.75 --format json
    """
    import time

    from diagnoser.catalog.levers import LeverError, parse_lever
    from diagnoser.whatif import fit as fitting
    from diagnoser.whatif import report

    site = load_site(config_path)
    try:
        chosen = [parse_lever(t) for t in levers] or catalog_levers(site)
    except LeverError as exc:
        fail(f"--lever: {exc}")
    end = until if until is not None else time.time()
    start = end - since
    prometheus = source.connect().operation()
    selector = site.config.selector
    if model is None:
        found = fitting.models_with_traffic(prometheus, selector, start, end)
        if len(found) != 1:
            named = ", ".join(found[:10]) if found else "none with traffic"
            fail(f"give --model: what-if fits one model (in the window: {named})")
        model = found[0]
    result = predict(prometheus, site, {"model_name": model}, (start, end), selector, setup, chosen)
    for warning in prometheus.warnings:
        click.echo(f"servediag: warning: partial answer: {warning}", err=True)
    if fmt == "json":
        click.echo(json.dumps(report.to_json(result), indent=2))
    else:
        click.echo(report.text(result), nl=False)
    if not result.calibration.ok:
        sys.exit(EXIT_FOUND)


def predict(
    prometheus: MetricSource,
    site: Site,
    scope: dict[str, str],
    window: tuple[float, float],
    selector: tuple[str, ...],
    setup: SetupOptions,
    levers: list[Lever],
) -> WhatIf:
    """The what-if of the model ``scope`` names (``model_name``, and the labels of its group)
    over ``window``: fitted within ``selector``, calibrated, each lever replayed. Raises
    ``UserError`` when the window cannot be fitted or the model's shape or GPU is unknown."""
    from diagnoser.whatif.fit import fit_window
    from diagnoser.whatif.predict import what_if
    from diagnoser.whatif.replay import Setup

    model = scope["model_name"]
    start, end = window
    fitted = fit_window(prometheus, model, start, end, selector)
    spec = _shape(model, setup.preset, setup.model_config).served_as(setup.dtype)
    g = _gpu(prometheus, setup.gpu_name, end)
    seqs, tokens = vllm_defaults(g)
    engine = Setup(
        spec=spec,
        gpu=g,
        max_num_seqs=setup.max_num_seqs or seqs,
        max_num_batched_tokens=setup.max_num_batched_tokens or tokens,
        max_model_len=setup.max_model_len,
        tensor_parallel=setup.tensor_parallel,
    )
    objectives = site.config.slo.for_labels(scope)
    return what_if(fitted, engine, levers, (objectives.ttft_seconds, objectives.itl_seconds))


def catalog_levers(site: Site) -> list[Lever]:
    """Every lever the catalog's fixes name, once each, in catalog order."""
    from diagnoser.catalog.levers import parse_lever

    seen: dict[str, Lever] = {}
    for pb in site.catalog:
        for text in pb.levers:
            lever = parse_lever(text)
            seen.setdefault(lever.text, lever)
    return list(seen.values())


def _shape(model: str, preset: str | None, model_config: Path | None) -> ModelSpec:
    """The model's shape: the preset, the config.json, or a preset of the served name."""
    from diagnoser.errors import UserError
    from diagnoser.hardware import presets
    from diagnoser.hardware.hfconfig import ConfigFieldError
    from diagnoser.hardware.presets import ModelSpec as Spec
    from diagnoser.kvbudget.budget import ModelConfigError, load_model

    if model_config is not None:
        loaded = load_model(str(model_config))
        if loaded.source == "preset":
            raise UserError(
                f"--model-config {model_config}: not a config.json (a preset? --preset)"
            )
        try:
            return Spec.from_hf_config(loaded.raw)
        except ConfigFieldError as exc:
            raise ModelConfigError(loaded.source, exc.field, exc.message) from None
    name = preset or model
    try:
        return presets.model(name)
    except KeyError:
        if preset is not None:
            raise UserError(
                f"--preset: unknown model preset {preset!r} (known: {', '.join(MODEL_ALIASES)})"
            ) from None
    raise UserError(
        f"the shape of {model!r} is not known (no preset of that name): give --model-config "
        "config.json (or --preset)"
    )


def _gpu(prometheus: MetricSource, gpu_name: str | None, at: float) -> GpuSpec:
    from diagnoser.cli.kvbudget import preset_like
    from diagnoser.errors import UserError
    from diagnoser.hardware import presets
    from diagnoser.kvbudget.live import dcgm_gpu

    if gpu_name is not None:
        try:
            return presets.gpu(gpu_name)
        except KeyError as exc:
            raise UserError(f"--gpu: {exc.args[0]}") from None
    seen = dcgm_gpu(prometheus, at)
    if seen is None:
        raise UserError("no DCGM series say which GPU the servers run on: give --gpu")
    name, memory = preset_like(*seen)
    g = presets.gpu(name)
    return g if memory is None else dataclasses.replace(g, memory_bytes=memory * 1e9)
