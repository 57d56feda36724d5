"""Model and GPU presets, and the KV-cache arithmetic that decides how many requests fit.

KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes per value. What is
left for the cache = GPU memory x gpu_memory_utilization - weights - runtime overhead. Sizes
are in bytes; GB means 10^9 bytes, as GPU vendors and the memory example below use them:
64 users x 8,192 tokens x 128 KiB = 68.7 GB against 80 x 0.9 - 16.0 - 2.14 = 53.9 GB free.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    dtype_bytes: int = 2  # bf16 weights

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * kv_dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: float
    bandwidth: float  # bytes/s of HBM
    flops: float  # dense bf16 FLOP/s


# Published Hugging Face configs (config.json) and parameter counts.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("meta-llama/Llama-3.1-8B-Instruct", 8.03e9, 32, 4096, 32, 8, 128, 131072),
        ModelSpec("meta-llama/Llama-2-7b-chat-hf", 6.74e9, 32, 4096, 32, 32, 128, 4096),
        ModelSpec("Qwen/Qwen3-8B", 8.19e9, 36, 4096, 32, 8, 128, 40960),
        ModelSpec("mistralai/Mistral-7B-Instruct-v0.3", 7.25e9, 32, 4096, 32, 8, 128, 32768),
        ModelSpec("meta-llama/Llama-3.1-70B-Instruct", 70.6e9, 80, 8192, 64, 8, 128, 131072),
    )
}
MODEL_ALIASES = {
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct",
    "llama-2-7b": "meta-llama/Llama-2-7b-chat-hf",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "mistral-7b": "mistralai/Mistral-7B-Instruct-v0.3",
    "llama-3.1-70b": "meta-llama/Llama-3.1-70B-Instruct",
}

# Vendor data sheets: SXM parts, dense BF16 tensor throughput.
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("H100-80GB", 80 * GB, 3.35e12, 989e12),
        GpuSpec("H200", 141 * GB, 4.8e12, 989e12),
        GpuSpec("A100-80GB", 80 * GB, 2.039e12, 312e12),
        GpuSpec("L40S", 48 * GB, 0.864e12, 362e12),
    )
}

DEFAULT_RUNTIME_OVERHEAD = 2.14 * GB


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
    per_token = spec.kv_bytes_per_token(kv_dtype_bytes) / tensor_parallel
    return max(0, int(budget // per_token))
