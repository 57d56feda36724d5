"""What the series do not say about the servers, and one model's what-if made from them.

``SetupOptions`` is what a caller knows of the servers (the model's shape, the GPU, the
scheduler limits); ``predict`` fits one model's window, fills in what the caller left out
(vLLM's scheduler defaults for the GPU, the GPU DCGM reports, a preset of the served name)
and replays each lever. The command line's ``what-if``, ``diagnose --what-if`` and the Python
API all come here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from diagnoser.hardware.hfconfig import LARGEST
from diagnoser.hardware.presets import GIB, MODEL_ALIASES, SERVED_DTYPES, GpuSpec
from diagnoser.plumbing.limits import Limit

if TYPE_CHECKING:
    from diagnoser.catalog.levers import Lever
    from diagnoser.hardware.presets import ModelSpec
    from diagnoser.plumbing.source import MetricSource
    from diagnoser.site import Site
    from diagnoser.whatif.predict import WhatIf

# vLLM's scheduler defaults for the OpenAI server (engine/arg_utils.py get_batch_defaults of
# 0.32): a GPU of at least 160 GiB gets the largest, one of at least 70 GiB that is not an
# A100 the larger pair; the CPU build its own (128 and 2048 for one engine).
LARGEST_GPU, LARGE_GPU = 160 * GIB, 70 * GIB
# Each scheduler limit and its range: what-if's options and SetupOptions' fields alike.
SETUP_LIMITS = {
    "max_num_seqs": Limit(1, 1 << 20, integer=True),
    "max_num_batched_tokens": Limit(16, 1 << 26, integer=True),
    "max_model_len": Limit(1, LARGEST, integer=True),
    "tensor_parallel": Limit(1, 64, integer=True),
}


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
    """What the series do not say about the servers: the model's shape (a preset or a
    ``config.json``), the GPU, the scheduler limits, the tensor-parallel size. Each left out
    is found (the served name's preset, the GPU DCGM reports) or vLLM's default."""

    preset: str | None = None
    model_config: Path | None = None
    gpu_name: str | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    max_model_len: int | None = None
    tensor_parallel: int = 1
    dtype: str = "auto"

    def __post_init__(self) -> None:
        """Each limit within its range (``SETUP_LIMITS``, as the command line's options),
        each name text, else ``ValueError`` naming the field."""
        optional = {f.name for f in dataclasses.fields(self) if f.default is None}
        for name, limit in SETUP_LIMITS.items():
            value = getattr(self, name)
            if value is not None or name not in optional:
                object.__setattr__(self, name, limit.check(value, name))
        for name in ("preset", "gpu_name"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name}: {value!r} is not text")
        if self.model_config is not None:
            if not isinstance(self.model_config, (str, Path)):
                raise ValueError(f"model_config: {self.model_config!r} is not a path")
            object.__setattr__(self, "model_config", Path(self.model_config))
        if self.dtype not in SERVED_DTYPES:
            raise ValueError(f"dtype: {self.dtype!r} is not one of {', '.join(SERVED_DTYPES)}")


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
    over ``window``: fitted within ``selector``, calibrated, each lever replayed, all by the
    deadline of ``prometheus``'s operation (``one_operation``: what is not replayed by then
    says so). Raises ``UserError`` when the window cannot be fitted or the model's shape or
    GPU is unknown."""
    from diagnoser.plumbing.source import deadline_of
    from diagnoser.whatif.fit import fit_window
    from diagnoser.whatif.predict import what_if
    from diagnoser.whatif.replay import Setup

    model = scope["model_name"]
    start, end = window
    fitted = fit_window(prometheus, model, start, end, selector)
    spec = shape(model, setup.preset, setup.model_config).served_as(setup.dtype)
    g = gpu(prometheus, setup.gpu_name, end)
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
    slo = (objectives.ttft_seconds, objectives.itl_seconds)
    return what_if(fitted, engine, levers, slo, deadline=deadline_of(prometheus))


def the_model(prometheus: MetricSource, selector: tuple[str, ...], start: float, end: float) -> str:
    """The one model with traffic in ``[start, end]`` (what-if fits one model); ``UserError``
    naming those there are when there is not exactly one."""
    from diagnoser.plumbing.errors import UserError
    from diagnoser.whatif.fit import models_with_traffic

    found = models_with_traffic(prometheus, selector, start, end)
    if len(found) != 1:
        named = ", ".join(found[:10]) if found else "none with traffic"
        raise UserError(f"give --model: what-if fits one model (in the window: {named})")
    return found[0]


def catalog_levers(site: Site) -> list[Lever]:
    """Every lever the catalog's fixes name, once each, in catalog order."""
    from diagnoser.catalog.levers import parse_lever

    seen: dict[str, Lever] = {}
    for pb in site.catalog:
        for text in pb.levers:
            lever = parse_lever(text)
            seen.setdefault(lever.text, lever)
    return list(seen.values())


def shape(model: str, preset: str | None, model_config: Path | None) -> ModelSpec:
    """The model's shape: the preset, the config.json, or a preset of the served name."""
    from diagnoser.hardware import presets
    from diagnoser.hardware.hfconfig import ConfigFieldError
    from diagnoser.hardware.presets import ModelSpec as Spec
    from diagnoser.kvbudget.budget import ModelConfigError, load_model
    from diagnoser.plumbing.errors import UserError

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


def gpu(prometheus: MetricSource, gpu_name: str | None, at: float) -> GpuSpec:
    """The GPU named, else the one DCGM reports (a preset of its family and memory)."""
    from diagnoser.hardware import presets
    from diagnoser.kvbudget.live import dcgm_gpu
    from diagnoser.plumbing.errors import UserError

    if gpu_name is not None:
        try:
            return presets.gpu(gpu_name)
        except KeyError as exc:
            raise UserError(f"--gpu: {exc.args[0]}") from None
    seen = dcgm_gpu(prometheus, at)
    if seen is None:
        raise UserError("no DCGM series say which GPU the servers run on: give --gpu")
    name, memory = presets.preset_like(*seen)
    g = presets.gpu(name)
    return g if memory is None else dataclasses.replace(g, memory_bytes=memory * 1e9)
