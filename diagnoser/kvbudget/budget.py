"""The KV-cache budget: how many sequences and users fit on a GPU, and what would change it.

Per GPU, vLLM gives the KV cache what is left of ``memory x gpu_memory_utilization`` after
the weights (split across tensor-parallel ranks) and the runtime overhead (activations,
CUDA graphs, NCCL buffers), and cuts it into blocks of ``block_size`` tokens. A sequence of
``n`` tokens holds ``ceil(n / block_size)`` blocks, so the users that fit at a context are
the blocks divided by the blocks one user holds. The arithmetic is the simulator's
(``diagnoser.hardware.presets``); this module adds the inputs a planner needs (a config.json,
given or estimated weights), the what-if variants (FP8 KV, more tensor parallelism) and
the live capacity that running engines report in ``vllm:cache_config_info``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnoser.hardware import presets as hardware
from diagnoser.hardware.hfconfig import KV_HEADS, LARGEST, ConfigFieldError, HfConfig
from diagnoser.hardware.presets import GB, KV_CACHE_DTYPES, SERVED_DTYPES, GpuSpec, ModelSpec
from diagnoser.plumbing.errors import (
    MAX_DEPTH,
    FileFieldError,
    UserError,
    nesting_problem,
    read_text,
)
from diagnoser.plumbing.limits import Limit

MOST_GB = 1e6  # a petabyte: more than any GPU's memory or any model's weights
# Each number a plan takes and its range: kv-budget's options and kv_budget()'s arguments.
PLAN_LIMITS = {
    "gpu_memory_gb": Limit(0, MOST_GB, low_open=True),
    "gpu_memory_utilization": Limit(0, 1, low_open=True),
    "weights_gb": Limit(0, MOST_GB),
    "overhead_gb": Limit(0, MOST_GB),
    "max_model_len": Limit(1, LARGEST, integer=True),
    "context": Limit(1, LARGEST, integer=True),
    "users": Limit(1, LARGEST, integer=True),
    "tensor_parallel": Limit(1, 4096, integer=True),
    "block_size": Limit(1, 1 << 20, integer=True),
}
# Each named value a plan takes, and the values it may be.
PLAN_CHOICES = {"kv_cache_dtype": tuple(KV_CACHE_DTYPES), "dtype": SERVED_DTYPES}


class ModelConfigError(FileFieldError):
    """A config.json that cannot be read or lacks what the KV arithmetic needs."""


@dataclass(frozen=True)
class Model:
    spec: ModelSpec
    source: str  # "preset" or the config.json's path
    raw: dict[str, Any] = field(default_factory=dict)  # the config.json, when there is one


@dataclass(frozen=True)
class PlanInputs:
    """What a KV-cache plan is asked for: ``servediag kv-budget``'s options, the keyword
    arguments of ``diagnoser.kv_budget()``, and what ``make_budget`` plans from. ``model`` is
    a preset or a config.json (None: no plan, only the live capacity); ``max_model_len`` and
    ``context`` also bound what the live capacity is read against."""

    model: str | None = None
    gpu: str = hardware.DEFAULT_GPU
    gpu_memory_gb: float | None = None  # instead of the preset's memory
    gpu_memory_utilization: float = 0.9
    weights_gb: float | None = None  # default: the preset's, or estimated from config.json
    overhead_gb: float = hardware.DEFAULT_RUNTIME_OVERHEAD / GB  # per GPU
    max_model_len: int | None = None  # default: the model's max_position_embeddings
    context: int | None = None  # tokens each user holds; default: max_model_len
    users: int | None = None
    tensor_parallel: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    dtype: str = "auto"  # vLLM's --dtype
    gpu_from: str = "--gpu"  # where the GPU came from, said in the plan

    def __post_init__(self) -> None:
        """Each input within its range (``PLAN_LIMITS``, as the command line's options) and
        of its kind, else ``ValueError`` naming it: a plan never starts on a block size of
        zero or a NaN share of the GPU's memory."""
        optional = {f.name for f in dataclasses.fields(self) if f.default is None}
        for name, limit in PLAN_LIMITS.items():
            value = getattr(self, name)
            if value is not None or name not in optional:
                object.__setattr__(self, name, limit.check(value, name))
        for name in ("model", "gpu", "gpu_from"):
            value = getattr(self, name)
            if not isinstance(value, str) and (value is not None or name != "model"):
                raise ValueError(f"{name}: {value!r} is not text")
        for name, choices in PLAN_CHOICES.items():
            if getattr(self, name) not in choices:
                raise ValueError(
                    f"{name}: {getattr(self, name)!r} is not one of {', '.join(choices)}"
                )


@dataclass(frozen=True)
class Budget:
    """Everything the plan depends on."""

    model: Model
    gpu: GpuSpec
    weight_bytes: float  # the whole model; each GPU holds 1/TP of it
    weights_from: str
    max_model_len: int
    context: int  # tokens each user holds (prompt and answer so far)
    users: int | None = None
    gpu_memory_utilization: float = 0.9
    overhead_bytes: float = hardware.DEFAULT_RUNTIME_OVERHEAD
    tensor_parallel: int = 1
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    # The dtype the model is served in (vLLM's --dtype; auto: config.json's, float32 as
    # bfloat16), where it came from, and where the GPU came from.
    dtype: str = "bfloat16"
    dtype_from: str = "config.json"
    gpu_from: str = "--gpu"


@dataclass(frozen=True)
class Plan:
    """One configuration's answer; bytes are per GPU unless the name says otherwise."""

    tensor_parallel: int
    kv_cache_dtype: str
    kv_heads_per_gpu: int
    kv_bytes_per_value: int
    kv_bytes_per_token: int
    weight_bytes: float
    free_bytes: float
    num_gpu_blocks: int
    capacity_tokens: int
    full_length_sequences: int
    users_fit: int
    need_bytes: float | None  # what the target users at the context would hold


def load_model(name_or_path: str) -> Model:
    """A preset by name, or a config.json (a file, or a directory holding one)."""
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    looks_like_path = path.suffix == ".json" or "/" in name_or_path or path.exists()
    if not looks_like_path:
        try:
            return Model(hardware.model(name_or_path), "preset")
        except KeyError as exc:
            raise UserError(f"{exc.args[0]}; or give the path of a config.json") from None
    raw = read_json(path)
    if not isinstance(raw, dict):
        raise ModelConfigError(path, "", "must be a JSON object (a Hugging Face config.json)")
    try:
        spec = ModelSpec.from_hf_config(raw, estimate_weights=False)
    except ConfigFieldError as exc:
        raise ModelConfigError(path, exc.field, exc.message) from None
    return Model(spec, str(path), raw)


class _NotJson(ValueError):
    pass


def _not_json(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number")


def read_json(path: Path) -> Any:
    """A config.json's data; a file that is not text, not JSON (``NaN`` and ``Infinity``
    included), or nested absurdly deep is refused naming the file."""
    text = read_text(path, ModelConfigError)
    try:
        raw = json.loads(text, parse_constant=_not_json)
    except RecursionError:
        raise ModelConfigError(path, "", f"nested deeper than {MAX_DEPTH} levels") from None
    except (json.JSONDecodeError, _NotJson) as exc:
        raise ModelConfigError(path, "", f"not valid JSON: {str(exc).splitlines()[0]}") from None
    except ValueError:  # Python refuses to read integers of thousands of digits
        raise ModelConfigError(path, "", "holds a number of thousands of digits") from None
    problem = nesting_problem(raw)
    if problem is not None:
        raise ModelConfigError(path, "", problem)
    return raw


def weights(model: Model, weights_gb: float | None) -> tuple[float, str]:
    """The weights' bytes and where the number comes from."""
    if weights_gb is not None:
        return weights_gb * GB, "given"
    spec = model.spec
    if model.source != "preset":
        try:
            spec = ModelSpec.from_hf_config(model.raw)
        except ConfigFieldError as exc:
            raise ModelConfigError(
                model.source,
                exc.field,
                f"{exc.message}; the weights cannot be estimated, pass --weights-gb",
            ) from None
    width = f"{spec.dtype_bytes:g} byte" + ("" if spec.dtype_bytes == 1 else "s")
    how = f"{spec.params / 1e9:.3g}B parameters x {width}"
    kind = "preset" if model.source == "preset" else "estimate from config.json"
    return spec.weight_bytes, f"{kind}: {how}"


def make_budget(inputs: PlanInputs) -> Budget:
    """The budget the inputs describe; ``UserError`` (one line) for what cannot be planned."""
    if inputs.model is None:
        raise ValueError("a KV-cache plan needs a model (a preset or a config.json)")
    model = load_model(inputs.model)
    gpu_memory_gb, tensor_parallel = inputs.gpu_memory_gb, inputs.tensor_parallel
    try:
        gpu = hardware.gpu(inputs.gpu)
    except KeyError as exc:
        raise UserError(str(exc.args[0])) from None
    if gpu_memory_gb is not None:
        gpu = GpuSpec(f"{gpu_memory_gb:g} GB GPU", gpu_memory_gb * GB, gpu.bandwidth, gpu.flops)
    problem = tp_problem(model.spec, tensor_parallel)
    if problem:
        raise UserError(f"--tensor-parallel-size {tensor_parallel}: {problem}")
    longest = inputs.max_model_len or model.spec.max_position
    if not longest:
        raise ModelConfigError(
            model.source, "max_position_embeddings", "is missing; pass --max-model-len"
        )
    weight_bytes, weights_from = weights(model, inputs.weights_gb)
    served, served_from = inputs.dtype, "--dtype"
    if inputs.dtype == "auto":
        served = model.spec.dtype
        served_from = "config.json" if model.raw else "the preset"
    return Budget(
        model=model,
        gpu=gpu,
        weight_bytes=weight_bytes,
        weights_from=weights_from,
        max_model_len=longest,
        context=inputs.context or longest,
        users=inputs.users,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        overhead_bytes=round(inputs.overhead_gb * GB),
        tensor_parallel=tensor_parallel,
        kv_cache_dtype=inputs.kv_cache_dtype,
        block_size=inputs.block_size,
        dtype=served,
        dtype_from=served_from,
        gpu_from=inputs.gpu_from if gpu_memory_gb is None else "--gpu-memory-gb",
    )


def kv_value_bytes(kv_cache_dtype: str, served: str = "bfloat16") -> int:
    """Bytes per cached value; auto is the served dtype's (4 for a server run with --dtype
    float32, else 2)."""
    return KV_CACHE_DTYPES[kv_cache_dtype] or (4 if served == "float32" else 2)


def tp_problem(spec: ModelSpec, tp: int) -> str | None:
    """Why vLLM would refuse this tensor-parallel size, or None."""
    if spec.heads % tp:
        return f"{spec.heads} attention heads are not divisible by {tp}"
    if not spec.mla and spec.kv_heads >= tp and spec.kv_heads % tp:
        return f"{spec.kv_heads} KV heads are not divisible by {tp}"
    if not spec.mla and spec.kv_heads < tp and tp % spec.kv_heads:
        return f"{tp} GPUs cannot share {spec.kv_heads} KV heads evenly"
    return None


def plan(budget: Budget, tensor_parallel: int | None = None, kv_cache_dtype: str = "") -> Plan:
    tp = tensor_parallel or budget.tensor_parallel
    dtype = kv_cache_dtype or budget.kv_cache_dtype
    spec = budget.model.spec
    value = kv_value_bytes(dtype, budget.dtype)
    per_token = spec.kv_bytes_per_token(value, tp)
    free = hardware.kv_budget_bytes(
        spec,
        budget.gpu,
        budget.gpu_memory_utilization,
        budget.overhead_bytes,
        tp,
        budget.weight_bytes,
    )
    blocks = max(0, int(free // (per_token * budget.block_size)))
    need = None
    if budget.users is not None:
        need = float(budget.users * budget.context * per_token)
    return Plan(
        tensor_parallel=tp,
        kv_cache_dtype=dtype,
        kv_heads_per_gpu=spec.kv_heads_per_gpu(tp),
        kv_bytes_per_value=value,
        kv_bytes_per_token=per_token,
        weight_bytes=budget.weight_bytes / tp,
        free_bytes=free,
        num_gpu_blocks=blocks,
        capacity_tokens=blocks * budget.block_size,
        full_length_sequences=blocks // blocks_for(budget.max_model_len, budget.block_size),
        users_fit=blocks // blocks_for(budget.context, budget.block_size),
        need_bytes=need,
    )


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def what_if(budget: Budget) -> tuple[list[Plan], list[str]]:
    """The plan, then FP8 KV and 2x/4x tensor parallelism; and the variants vLLM refuses."""
    fp8 = KV_CACHE_DTYPES[budget.kv_cache_dtype] == 1
    dtypes = [budget.kv_cache_dtype] + ([] if fp8 else ["fp8"])
    plans, refused = [], []
    for factor in (1, 2, 4):
        tp = budget.tensor_parallel * factor
        problem = tp_problem(budget.model.spec, tp) if factor > 1 else None
        if problem:
            refused.append(f"TP {tp} is not possible: {problem}")
            continue
        plans += [plan(budget, tp, d) for d in dtypes]
    return plans, refused


def notes(budget: Budget, p: Plan) -> list[str]:
    """What a reader should know about this plan, one sentence each."""
    spec, out = budget.model.spec, []
    if budget.gpu_from.startswith("assumed"):
        out.append(
            f"The GPU is {budget.gpu_from}: no --gpu or --gpu-memory-gb was given and no DCGM "
            "series told which GPUs the servers have."
        )
    if budget.weights_from.startswith("estimate"):
        out.append(
            "The weights are an estimate from config.json's shapes (norms and biases left "
            "out, quantized layers at their width); pass --weights-gb for the checkpoint's size."
        )
    if spec.mla:
        out.append(
            f"MLA: each layer caches one latent of kv_lora_rank {spec.kv_lora_rank} + "
            f"qk_rope_head_dim {spec.qk_rope_head_dim} values, not K and V; every "
            "tensor-parallel GPU holds the whole latent, so TP frees weight memory but "
            "does not shrink the KV per token."
        )
    elif spec.kv_heads < p.tensor_parallel:
        out.append(
            f"{spec.kv_heads} KV heads on {p.tensor_parallel} GPUs: each head is replicated "
            f"on {p.tensor_parallel // spec.kv_heads} GPUs (vLLM keeps one per GPU at least)."
        )
    cfg = HfConfig(budget.model.raw)
    raw = cfg.raw
    if budget.model.raw and spec.kv_heads == spec.heads and cfg.value(*KV_HEADS) is None:
        out.append(
            f"config.json names no KV heads: all {spec.heads} attention heads keep K and V "
            "(multi-head attention), as vLLM assumes."
        )
    layer_types = raw.get("layer_types")
    if isinstance(layer_types, list):
        local = sum(1 for t in layer_types if t not in ("full_attention", "attention"))
        if local:
            out.append(
                f"{local} of {len(layer_types)} layers are not full attention (layer_types): "
                "vLLM stores less for them, so this plan is an upper bound on the KV needed."
            )
    if spec.max_position and budget.max_model_len > spec.max_position:
        out.append(
            f"max_model_len {budget.max_model_len:,} exceeds the model's {spec.max_position:,}:"
            " vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
        )
    if p.free_bytes <= 0:
        out.append(
            "Weights and runtime overhead take all of memory x gpu_memory_utilization: "
            "no room for a KV cache."
        )
    elif p.full_length_sequences == 0:
        out.append(
            "Not one max_model_len sequence fits, so vLLM will not start "
            "(kv-cannot-fit-max-model-len): lower --max-model-len, raise "
            "--gpu-memory-utilization or add tensor parallelism."
        )
    return out
