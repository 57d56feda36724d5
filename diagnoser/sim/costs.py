"""What one engine step costs, from the hardware and the model's shape.

A step runs the linear layers over every token it carries (one per decoding sequence, plus
the prefill chunk), then attention, then sampling. Each part is bound by the GPU resource it
exhausts, and the parts run one after another, so their times add::

    step = overhead + per_sequence x decodes
         + max(weights / BW, 2 x params x tokens / FLOPS)    linear layers: a roofline
         + decodes' KV cache / BW                            decode attention reads the cache
         + attention FLOPs of the chunk / FLOPS              prefill attention computes

with BW = peak bandwidth x ``mbu`` and FLOPS = peak FLOP/s x ``mfu``; on a host-bound
device (vLLM's CPU build) the linear layers' read and compute add up instead (``overlap``).
Small decode batches are bandwidth-bound (the weights are read once per step whatever the
batch), prefill is compute-bound, and a decode batch sharing a step with a prefill chunk pays
for both the chunk's compute and its own KV reads: taking max(memory, compute) over the whole
step would hide the decodes behind the chunk, which the measurements below do not show.

The efficiencies are fitted to step times measured on an H200 for a Llama-3.1-8B-shaped
model (tests/data/gpu-step-costs.json, extracted by scripts/extract-reference):
the simulated step is 1.01x-1.28x every prefill and decode measurement (those are lower
bounds for a serving engine) and 0.76x-1.16x the mixed steps, whose chunk attention was
measured with an explicit mask rather than the flash path an engine takes.
``tests/test_step_costs.py`` holds the model to that table.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.hardware.presets import GpuSpec, ModelSpec

# Share of peak bf16 FLOP/s the compute-bound parts reach. Measured prefill reaches 71-78% of
# the H200's 989 TFLOP/s (512 tokens: 11.7 ms; 32,768 tokens: 1,141.8 ms counting the causal
# attention FLOPs below); 0.70 keeps every simulated prefill at or above its measurement.
MFU = 0.70
# Share of peak HBM bandwidth decode reaches. Measured decode at batch 1 and 1,024 tokens of
# context reads 16.2 GB in 4.64 ms, 73% of the H200's 4.8 TB/s; 0.70 keeps the batch-128
# decode (10.50 ms, where the linear layers start to leave the bandwidth roof) a bound too.
MBU = 0.70
# Seconds per step outside the measured forward pass: the gap between two steps with async
# scheduling, on by default in vLLM V1 (config/vllm.py: async_scheduling None -> True unless
# incompatible), 0.15-0.17 ms at batch 256 against 5-6 ms synchronous (vllm#11133); plus
# top-k/top-p sampling over a 128k vocabulary, ~0.3 ms at batch 64-128 (vllm#40376).
STEP_OVERHEAD = 0.17e-3 + 0.3e-3
# Seconds per decoding sequence per step: sampling's growth with the batch, ~2 us a sequence
# between batch 128 (~0.3 ms) and 512 (~1.1 ms) in the same benchmark (vllm#40376).
PER_SEQUENCE = 2e-6


def attention_flops(spec: ModelSpec, done: int, todo: int) -> float:
    """FLOPs of causal attention for prefilling ``todo`` tokens after ``done`` cached ones:
    QK^T and PV, 2 x 2 x hidden FLOPs per (query, key) pair and layer."""
    return 4.0 * spec.layers * spec.hidden * todo * (done + todo / 2)


@dataclass(frozen=True)
class StepCosts:
    """Step times of one engine (all its tensor-parallel GPUs), in seconds."""

    weight_bytes: float  # read from HBM by every step, per GPU
    kv_bytes_per_token: float  # per GPU
    params: float
    flops: float  # achieved FLOP/s over all tensor-parallel GPUs
    bandwidth: float  # achieved bytes/s of one GPU
    overhead: float  # seconds per step
    per_sequence: float  # seconds per decoding sequence per step
    # Whether reading the weights and computing with them overlap (a GPU: the linear layers
    # take the longer of the two). On a CPU they add up: the same cores load and multiply.
    overlap: bool = True

    @classmethod
    def build(
        cls,
        spec: ModelSpec,
        g: GpuSpec,
        *,
        mfu: float = MFU,
        mbu: float = MBU,
        overhead: float = STEP_OVERHEAD,
        per_sequence: float = PER_SEQUENCE,
        kv_dtype_bytes: int = 2,
        tensor_parallel: int = 1,
        overlap: bool = True,
    ) -> StepCosts:
        return cls(
            weight_bytes=spec.weight_bytes / tensor_parallel,
            kv_bytes_per_token=spec.kv_bytes_per_token(kv_dtype_bytes, tensor_parallel),
            params=spec.params,
            flops=g.flops * mfu * tensor_parallel,
            bandwidth=g.bandwidth * mbu,
            overhead=overhead,
            per_sequence=per_sequence,
            overlap=overlap,
        )

    def step(
        self, n_dec: int, context_tokens: float, chunk: float = 0, attn_flops: float = 0.0
    ) -> float:
        """One step: ``n_dec`` decoding sequences holding ``context_tokens`` in all, plus a
        prefill chunk of ``chunk`` tokens whose attention costs ``attn_flops``."""
        read = self.weight_bytes / self.bandwidth
        compute = 2 * self.params * (n_dec + chunk) / self.flops
        linear = max(read, compute) if self.overlap else read + compute
        kv_read = context_tokens * self.kv_bytes_per_token / self.bandwidth
        return (
            self.overhead + self.per_sequence * n_dec + linear + kv_read + attn_flops / self.flops
        )
