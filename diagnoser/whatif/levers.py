"""A lever turned on today's replayed configuration: the configuration it gives, and what
changed, in words (``0.8 -> 0.85``). A lever that changes nothing here, or that needs what
the window cannot tell, raises ``LeverError`` with the reason."""

from __future__ import annotations

import dataclasses

from diagnoser.catalog.levers import Lever, LeverError
from diagnoser.hardware.presets import GB
from diagnoser.whatif.fit import Fit
from diagnoser.whatif.replay import Config, Setup, capacity_tokens, kv_dtype_bytes


def turn(lever: Lever, cfg: Config, fit: Fit, setup: Setup) -> tuple[Config, str]:
    """``cfg`` with ``lever`` turned, and the change as text."""
    e = dataclasses.replace(cfg.engine)
    name = lever.name
    if name == "gpu_memory_utilization":
        new = round(lever.apply(e.gpu_memory_utilization), 4)
        said = f"{e.gpu_memory_utilization:g} -> {new:g}"
        e.gpu_memory_utilization = new
    elif name == "kv_cache_dtype":
        width = kv_dtype_bytes(lever.value, setup.spec)
        if width == e.kv_cache_dtype_bytes:
            raise LeverError(f"the KV cache is already {fit.cache.cache_dtype}")
        said = f"{fit.cache.cache_dtype} -> {lever.value}"
        e.kv_cache_dtype_bytes = width
    elif name == "num_gpu_blocks":
        blocks = e.num_gpu_blocks(setup.spec, setup.gpu)
        new_blocks = max(1, round(lever.apply(blocks)))
        said = f"{blocks:,} -> {new_blocks:,}"
        # The memory left to the runtime, solved so the cache holds exactly the blocks asked
        # for (--num-gpu-blocks-override: vLLM takes the count and no longer sizes the cache).
        per_block = e.block_size * setup.spec.kv_bytes_per_token(
            e.kv_cache_dtype_bytes, e.tensor_parallel
        )
        e.runtime_overhead_gb -= (new_blocks - blocks) * per_block / GB
        got = e.num_gpu_blocks(setup.spec, setup.gpu)
        e.runtime_overhead_gb -= (new_blocks - got + 0.5 * (new_blocks != got)) * per_block / GB
    elif name == "max_num_seqs":
        new_seqs = max(1, round(lever.apply(e.max_num_seqs)))
        said = f"{e.max_num_seqs} -> {new_seqs}"
        e.max_num_seqs = new_seqs
    elif name == "max_num_batched_tokens":
        new_tokens = max(16, round(lever.apply(e.max_num_batched_tokens)))
        said = f"{e.max_num_batched_tokens} -> {new_tokens}"
        e.max_num_batched_tokens = new_tokens
    elif name == "replicas":
        servers = max(1, round(lever.apply(cfg.instances)))
        return dataclasses.replace(cfg, instances=servers), f"{cfg.instances} -> {servers}"
    elif name == "max_tokens":
        cap = max(1, round(lever.apply(cfg.max_tokens)))
        return dataclasses.replace(cfg, max_tokens=cap), f"{cfg.max_tokens} -> {cap}"
    elif name == "enable_prefix_caching":
        if e.enable_prefix_caching and not lever.value:
            hit = fit.prefix_hit or 0.0
            raise LeverError(f"prefix caching is already on (hit rate {hit:.0%})")
        share = float(lever.value) if lever.value else fit.prefix_hit
        if share is None:
            raise LeverError(
                "no prefix-cache hit rate was measured: give the share expected "
                "(enable_prefix_caching:0.3)"
            )
        said = f"{'on' if e.enable_prefix_caching else 'off'} -> on at {share:.0%} hits"
        e.enable_prefix_caching, e.prefix_hit_share = True, share
    else:  # pragma: no cover - the knob table and this function list the same names
        raise LeverError(f"lever {name} has no replay")
    if e == cfg.engine:
        raise LeverError(f"{lever.text} changes nothing here ({said})")
    if e.num_gpu_blocks(setup.spec, setup.gpu) < 1 or capacity_tokens(setup, e) < e.max_model_len:
        raise LeverError(
            f"{lever.text}: the engine would not start (the KV cache cannot hold one "
            f"{e.max_model_len:,}-token sequence)"
        )
    return dataclasses.replace(cfg, engine=e), said
