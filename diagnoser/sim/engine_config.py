"""An engine's flags: vLLM's, and SGLang's where the simulated SGLang server maps them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from diagnoser.hardware.presets import GB, GpuSpec, ModelSpec, kv_capacity_tokens
from diagnoser.sim import costs

SGLANG_NEW_TOKEN_RATIO = 0.7 * 0.14  # SGLang's new_token_ratio once decayed (see below)


@dataclass
class EngineConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 32768
    block_size: int = 16
    kv_cache_dtype_bytes: int = 2
    tensor_parallel: int = 1
    enable_prefix_caching: bool = True
    prefix_hit_share: float = 0.0  # share of prompt tokens found in the prefix cache
    runtime_overhead_gb: float = 2.14
    mfu: float = costs.MFU  # share of peak FLOP/s prefill achieves
    mbu: float = costs.MBU  # share of peak bandwidth decode achieves
    # Seconds per step (inter-step gap, sampling) and per decoding sequence per step; None:
    # the device's (a host-bound device's measured costs, else a GPU's, sim/costs.py).
    step_overhead: float | None = None
    step_overhead_per_seq: float | None = None
    phase_quantum: float = 0.25  # longest decode phase, seconds
    # Speculative decoding (--speculative-config): draft tokens proposed per sequence per
    # step (0: off). The target model verifies them with its own token in one forward pass.
    num_speculative_tokens: int = 0
    draft_overhead: float = 0.05  # the drafter's time, as a share of the target's step
    # LoRA (--enable-lora --max-loras): adapters a step may serve at once (0: LoRA off). A
    # waiting request whose adapter is not among the running requests' waits while all the
    # slots are taken, however much room the batch and the KV cache have.
    max_loras: int = 0
    # Disaggregated prefill (--kv-transfer-config, NixlConnector, kv_role kv_consumer): the
    # decode side. Each prompt's KV comes from a prefill instance (not simulated): the request
    # waits for the transfer, then computes only the prompt's last token.
    kv_consumer: bool = False
    # The prefill side of the same deployment (kv_role kv_producer): its connector registers
    # NIXL's families (at zero: the decode side pulls, so no transfer is counted here), and
    # the proxy sends it every request with max_tokens=1, so each ends with "length" after
    # one token (give the model entry ``max_tokens: 1``). Its instances are named
    # ``<model>-prefill-<i>``, so a decode entry of the same model can sit beside it.
    kv_producer: bool = False
    # Whether a step that prefills also decodes every running sequence (vLLM's chunked
    # prefill; SGLang's --enable-mixed-chunk). SGLang's default is off: a prefill batch runs
    # alone, before the decode step, chunk after chunk for a prompt longer than the chunk, so
    # every running stream's next token waits for all of it (scheduler.py:3993-4001,
    # 4097-4100 of 0.5.23), and the chunk budget is the prefill's alone.
    mixed_chunk: bool = True
    # The share of each running request's remaining max_tokens (clipped at 4096) that
    # admission keeps free in the KV cache: SGLang's new_token_ratio, 0.7 at start and after
    # an idle spell, decayed over 600 decode steps to 0.7 x 0.14 (environ.py:646-648,
    # schedule_policy.py:785-794 of 0.5.23); vLLM keeps none. A simulated SGLang server keeps
    # the decayed ratio (a busy server passes 600 decode steps in seconds).
    new_token_ratio: float = 0.0
    # Whether a request preempted and admitted again finds its blocks that no one has taken
    # since in the prefix cache (vLLM V1 with prefix caching); SGLang's retraction is
    # replayed whole here.
    cached_recompute: bool = True
    # --custom-histogram-buckets (vLLM 0.33): a family's bounds by the flag's key
    # (time_to_first_token, inter_token_latency), in place of vLLM's defaults.
    histogram_buckets: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # SGLang's --collect-tokens-histogram: the prompt, uncached-prompt and generation length
    # histograms. Off by default, as in SGLang's ServerArgs (``collect_tokens_histogram =
    # False`` up to 0.5.10.post1; 0.5.11 and later observe them always, as this flag on).
    collect_tokens_histogram: bool = False

    def step_costs(self, g: GpuSpec) -> tuple[float, float]:
        """(seconds per step, per decoding sequence per step) on ``g``: the flags' when set,
        else the device's."""
        overhead = self.step_overhead
        if overhead is None:
            overhead = g.step_overhead if g.step_overhead is not None else costs.STEP_OVERHEAD
        per_seq = self.step_overhead_per_seq
        if per_seq is None:
            per_seq = g.per_sequence if g.per_sequence is not None else costs.PER_SEQUENCE
        return overhead, per_seq

    def num_gpu_blocks(self, spec: ModelSpec, g: GpuSpec) -> int:
        tokens = kv_capacity_tokens(
            spec,
            g,
            self.gpu_memory_utilization,
            self.runtime_overhead_gb * GB,
            self.kv_cache_dtype_bytes,
            self.tensor_parallel,
        )
        return tokens // self.block_size

    def as_sglang(self, given: Mapping[str, Any]) -> None:
        """SGLang's scheduler, for what the scenario's engine flags (``given``) leave unset:
        each prefill batch runs alone (no --enable-mixed-chunk), and admission keeps room for
        the running requests' output."""
        self.mixed_chunk = self.mixed_chunk and "mixed_chunk" in given
        if "new_token_ratio" not in given:
            self.new_token_ratio = SGLANG_NEW_TOKEN_RATIO
        self.cached_recompute = "cached_recompute" in given and self.cached_recompute
