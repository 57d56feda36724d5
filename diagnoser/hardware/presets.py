"""Model and GPU presets, and the KV-cache arithmetic that decides how many requests fit.

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per value; a model
with multi-head latent attention (MLA: DeepSeek-V2/V3) caches one latent of kv_lora_rank +
qk_rope_head_dim values per layer instead. What is left for the cache = GPU memory x
gpu_memory_utilization - weights - runtime overhead. Sizes are in bytes; GB means 10^9
bytes, as GPU vendors and the memory example below use them: 64 users x 8,192 tokens x
128 KiB = 68.7 GB against 80 x 0.9 - 16.0 - 2.14 = 53.9 GB free.

Tensor parallelism splits the KV heads across GPUs, as vLLM does (``get_num_kv_heads``):
each GPU holds max(1, KV heads // TP) heads, so with fewer KV heads than GPUs the heads are
replicated; the MLA latent is not split at all, every GPU holds all of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

GB = 1e9
GIB = 2**30


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params: float  # parameter count
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    max_position: int
    dtype_bytes: float = 2  # bytes per weight: bf16 2, fp8 1, 4-bit 0.5
    kv_lora_rank: int = 0  # MLA: size of the compressed KV latent (0: not MLA)
    qk_rope_head_dim: int = 0  # MLA: the decoupled RoPE key, cached beside the latent
    dtype: str = "bfloat16"  # what vLLM computes in; the KV cache's type under "auto"

    @classmethod
    def from_hf_config(
        cls, raw: Mapping[str, Any], name: str = "", estimate_weights: bool = True
    ) -> ModelSpec:
        """The shape from a Hugging Face config.json, as vLLM reads it.

        Raises ``ConfigFieldError`` naming the field that is missing or unusable. With
        ``estimate_weights`` the parameter count and weight width are estimated from the
        config (see ``diagnoser.hardware.hfconfig``); without, ``params`` is 0.
        """
        from diagnoser.hardware import hfconfig as hf

        cfg = hf.HfConfig(raw)
        layers = cfg.need(*hf.LAYERS)
        heads = cfg.need(*hf.HEADS)
        rank = cfg.optional("kv_lora_rank")
        rope = cfg.need("qk_rope_head_dim") if rank else 0
        dim = cfg.optional("qk_nope_head_dim") + rope if rank else hf.head_dim(cfg, heads)
        kv = heads if rank else hf.kv_heads(cfg, heads)
        label = name or str(raw.get("_name_or_path") or "") or _architecture(raw)
        return cls(
            name=label,
            params=hf.estimate_params(cfg) if estimate_weights else 0.0,
            layers=layers,
            hidden=cfg.count(*hf.HIDDEN) or heads * dim,
            heads=heads,
            kv_heads=kv,
            head_dim=dim,
            max_position=cfg.max_model_len(),
            dtype_bytes=hf.weight_bytes_per_param(cfg) if estimate_weights else 2,
            kv_lora_rank=rank,
            qk_rope_head_dim=rope,
            dtype=cfg.served_dtype(),
        )

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    def served_as(self, dtype: str) -> ModelSpec:
        """The shape served with vLLM's ``--dtype`` (``auto``: as it is): the weights, and a
        KV cache left at ``auto``, in that type. Quantized weights (under 2 bytes: fp8, 4-bit)
        stay as they are: ``--dtype`` sets what vLLM computes in, not how a checkpoint's
        weights were quantized."""
        if dtype == "auto":
            return self
        width = self.dtype_bytes if self.dtype_bytes < 2 else (4 if dtype == "float32" else 2)
        return replace(self, dtype=dtype, dtype_bytes=width)

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_heads_per_gpu(self, tensor_parallel: int = 1) -> int:
        """KV heads each GPU stores: split across ranks, replicated below one per rank."""
        if self.mla:
            return 1
        return max(1, self.kv_heads // tensor_parallel)

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2, tensor_parallel: int = 1) -> int:
        """KV-cache bytes one token takes on each GPU (on the only one when TP is 1)."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        heads = self.kv_heads_per_gpu(tensor_parallel)
        return 2 * self.layers * heads * self.head_dim * kv_dtype_bytes


def _architecture(raw: Mapping[str, Any]) -> str:
    arch = raw.get("architectures")
    if isinstance(arch, list) and arch and isinstance(arch[0], str):
        return arch[0]
    return str(raw.get("model_type") or "model")


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: float
    bandwidth: float  # bytes/s of HBM
    flops: float  # dense bf16 FLOP/s
    # A device whose steps are bound by the host (vLLM's CPU build) has measured costs of its
    # own: seconds per step, per decoding sequence per step, and per request in the API
    # server before the engine sees it. None: a GPU's (the simulator's, sim/costs.py).
    step_overhead: float | None = None
    per_sequence: float | None = None
    request_overhead: float | None = None

    @property
    def host_bound(self) -> bool:
        return self.step_overhead is not None


# Published Hugging Face configs (config.json) and parameter counts.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 32, 8, 128, 131072),
        ModelSpec("meta-llama/Llama-2-7b-chat-hf", 6.74e9, 32, 4096, 32, 32, 128, 4096),
        ModelSpec("Qwen/Qwen3-8B", 8.19e9, 36, 4096, 32, 8, 128, 40960),
        ModelSpec("mistralai/Mistral-7B-Instruct-v0.3", 7.25e9, 32, 4096, 32, 8, 128, 32768),
        ModelSpec("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 64, 8, 128, 131072),
        # MLA, FP8 weights (671e9 without the multi-token-prediction module vLLM skips). For
        # the KV planner: the simulator would price compute by all 671e9 parameters, not the
        # 37e9 a token activates.
        ModelSpec(
            "deepseek-ai/DeepSeek-V3",
            671e9,
            61,
            7168,
            128,
            128,
            192,  # qk_nope_head_dim 128 + qk_rope_head_dim 64
            163840,
            dtype_bytes=1,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
        ),
    )
}
MODEL_ALIASES = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-2-7b": "meta-llama/Llama-2-7b-chat-hf",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
}

# Vendor data sheets: SXM parts, dense BF16 tensor throughput.
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("H100-80GB", 80 * GB, 3.35e12, 989e12),
        GpuSpec("H200", 141 * GB, 4.8e12, 989e12),
        GpuSpec("A100-80GB", 80 * GB, 2.039e12, 312e12),
        GpuSpec("L40S", 48 * GB, 0.864e12, 362e12),
        # vLLM's CPU build on two x86 cores (AVX-512, float32), fitted to the steps of two
        # models measured on the lab's server (tests/data/cpu-step-costs.json, made by
        # python -m lab.real.stepcosts; its 296 M-parameter model priced within 7%
        # of every step). At the simulator's default efficiencies (0.7): 210 GFLOP/s for the
        # linear layers and attention, 34 GB/s for the weights and the KV cache, read and
        # computed one after the other (the same cores do both); 0.9 ms a step and 0.01 ms a
        # decoding sequence of scheduling, sampling and output processing; 4 ms a request in
        # the API server. The memory is the KV cache's pool (sized from the NUMA node's).
        GpuSpec(
            "CPU",
            32 * GB,
            48e9,
            300e9,
            step_overhead=0.9e-3,
            per_sequence=0.01e-3,
            request_overhead=4e-3,
        ),
    )
}

DEFAULT_RUNTIME_OVERHEAD = 2.14 * GB
# vLLM's --dtype values the planner knows (auto: config.json's, float32 served as bfloat16).
SERVED_DTYPES = ("auto", "bfloat16", "float16", "float32")
# The GPU a plan assumes when nothing says which (said in the plan's notes).
DEFAULT_GPU = "H100-80GB"
# vLLM's --kv-cache-dtype values on CUDA, by bytes per value (0 for auto: the model's dtype).
KV_CACHE_DTYPES = {"auto": 0, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


def model(name: str) -> ModelSpec:
    key = MODEL_ALIASES.get(name.lower(), name)
    if key not in MODELS:
        known = ", ".join(sorted(MODEL_ALIASES))
        raise KeyError(f"unknown model preset {name!r} (known: {known})")
    return MODELS[key]


def gpu(name: str) -> GpuSpec:
    for key, spec in GPUS.items():
        if key.lower() == name.lower():
            return spec
    raise KeyError(f"unknown GPU preset {name!r} (known: {', '.join(GPUS)})")


def kv_budget_bytes(
    spec: ModelSpec,
    g: GpuSpec,
    gpu_memory_utilization: float = 0.9,
    overhead_bytes: float = DEFAULT_RUNTIME_OVERHEAD,
    tensor_parallel: int = 1,
    weight_bytes: float | None = None,
) -> float:
    """Bytes left for the KV cache on each GPU after weights and runtime overhead."""
    weights = spec.weight_bytes if weight_bytes is None else weight_bytes
    return g.memory_bytes * gpu_memory_utilization - weights / tensor_parallel - overhead_bytes


def kv_capacity_tokens(
    spec: ModelSpec,
    g: GpuSpec,
    gpu_memory_utilization: float = 0.9,
    overhead_bytes: float = DEFAULT_RUNTIME_OVERHEAD,
    kv_dtype_bytes: int = 2,
    tensor_parallel: int = 1,
    weight_bytes: float | None = None,
) -> int:
    """Tokens the KV cache holds (KV heads are split across tensor-parallel GPUs)."""
    budget = kv_budget_bytes(
        spec, g, gpu_memory_utilization, overhead_bytes, tensor_parallel, weight_bytes
    )
    per_token = spec.kv_bytes_per_token(kv_dtype_bytes, tensor_parallel)
    return max(0, int(budget // per_token))


def preset_like(name: str, memory_bytes: float) -> tuple[str, float | None]:
    """The GPU preset DCGM's ``modelName`` and memory describe (its family in the name, its
    memory within 2%), else the default preset's speeds with DCGM's memory in GB."""
    for key, spec in GPUS.items():
        family = key.split("-")[0]
        if family in name and abs(spec.memory_bytes - memory_bytes) <= 0.02 * spec.memory_bytes:
            return key, None
    return DEFAULT_GPU, memory_bytes / 1e9
