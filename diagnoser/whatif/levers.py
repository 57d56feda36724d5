"""A lever turned on today's replayed configuration: the configuration it gives, and what
changed, in words (``0.8 -> 0.85``). A lever that changes nothing here, or that needs what
the window cannot tell, raises ``LeverError`` with the reason.

Each knob of the catalog's lever grammar (``catalog.levers.KNOBS``) has its replay here, one
function registered under the knob's name with ``@turns``; a new lever is a knob there and a
function here (a test holds the two lists equal).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from diagnoser.catalog.levers import Lever, LeverError
from diagnoser.hardware.presets import GB
from diagnoser.sim.engine import EngineConfig
from diagnoser.whatif.fit import Fit
from diagnoser.whatif.replay import Config, Setup, capacity_tokens, kv_dtype_bytes

# A knob's replay: the engine's flags changed in place (returns what changed, in words), or a
# new configuration where the lever is outside the engine (returns it with the words).
Turn = Callable[[Lever, EngineConfig, Config, Fit, Setup], "str | tuple[Config, str]"]
TURNS: dict[str, Turn] = {}


def turns(name: str) -> Callable[[Turn], Turn]:
    """Register the replay of the knob ``name``."""

    def register(fn: Turn) -> Turn:
        if name in TURNS:
            raise ValueError(f"lever {name} has two replays")
        TURNS[name] = fn
        return fn

    return register


def turn(lever: Lever, cfg: Config, fit: Fit, setup: Setup) -> tuple[Config, str]:
    """``cfg`` with ``lever`` turned, and the change as text."""
    replay = TURNS.get(lever.name)
    if replay is None:  # pragma: no cover - a test holds the knobs and the replays equal
        raise LeverError(f"lever {lever.name} has no replay")
    e = dataclasses.replace(cfg.engine)
    done = replay(lever, e, cfg, fit, setup)
    if isinstance(done, tuple):
        return done
    said = done
    if e == cfg.engine:
        raise LeverError(f"{lever.text} changes nothing here ({said})")
    if e.num_gpu_blocks(setup.spec, setup.gpu) < 1 or capacity_tokens(setup, e) < e.max_model_len:
        raise LeverError(
            f"{lever.text}: the engine would not start (the KV cache cannot hold one "
            f"{e.max_model_len:,}-token sequence)"
        )
    return dataclasses.replace(cfg, engine=e), said


@turns("gpu_memory_utilization")
def _memory_share(lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup) -> str:
    new = round(lever.apply(e.gpu_memory_utilization), 4)
    said = f"{e.gpu_memory_utilization:g} -> {new:g}"
    e.gpu_memory_utilization = new
    return said


@turns("kv_cache_dtype")
def _kv_dtype(lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup) -> str:
    width = kv_dtype_bytes(lever.value, setup.spec)
    if width == e.kv_cache_dtype_bytes:
        raise LeverError(f"the KV cache is already {fit.cache.cache_dtype}")
    e.kv_cache_dtype_bytes = width
    return f"{fit.cache.cache_dtype} -> {lever.value}"


@turns("num_gpu_blocks")
def _blocks(lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup) -> str:
    blocks = e.num_gpu_blocks(setup.spec, setup.gpu)
    new_blocks = max(1, round(lever.apply(blocks)))
    # The memory left to the runtime, solved so the cache holds exactly the blocks asked for
    # (--num-gpu-blocks-override: vLLM takes the count and no longer sizes the cache).
    per_block = e.block_size * setup.spec.kv_bytes_per_token(
        e.kv_cache_dtype_bytes, e.tensor_parallel
    )
    e.runtime_overhead_gb -= (new_blocks - blocks) * per_block / GB
    got = e.num_gpu_blocks(setup.spec, setup.gpu)
    e.runtime_overhead_gb -= (new_blocks - got + 0.5 * (new_blocks != got)) * per_block / GB
    return f"{blocks:,} -> {new_blocks:,}"


@turns("max_num_seqs")
def _seqs(lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup) -> str:
    new_seqs = max(1, round(lever.apply(e.max_num_seqs)))
    said = f"{e.max_num_seqs} -> {new_seqs}"
    e.max_num_seqs = new_seqs
    return said


@turns("max_num_batched_tokens")
def _step_tokens(lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup) -> str:
    new_tokens = max(16, round(lever.apply(e.max_num_batched_tokens)))
    said = f"{e.max_num_batched_tokens} -> {new_tokens}"
    e.max_num_batched_tokens = new_tokens
    return said


@turns("replicas")
def _replicas(
    lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup
) -> tuple[Config, str]:
    servers = max(1, round(lever.apply(cfg.instances)))
    return dataclasses.replace(cfg, instances=servers), f"{cfg.instances} -> {servers}"


@turns("max_tokens")
def _max_tokens(
    lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup
) -> tuple[Config, str]:
    cap = max(1, round(lever.apply(cfg.max_tokens)))
    return dataclasses.replace(cfg, max_tokens=cap), f"{cfg.max_tokens} -> {cap}"


@turns("enable_prefix_caching")
def _prefix_caching(lever: Lever, e: EngineConfig, cfg: Config, fit: Fit, setup: Setup) -> str:
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
    return said
