"""The live KV capacity each running engine reports in ``vllm:cache_config_info``.

The info series carries CacheConfig's fields and ``engine``, not ``model_name``: the model
comes from the engine's own gauges, matched on (job, instance, engine). Its
``num_gpu_blocks`` is the API server's sum over its data-parallel engines; from vLLM 0.24
``kv_cache_size_tokens`` is each engine's own capacity, in tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from diagnoser.kvbudget.budget import blocks_for
from diagnoser.metrics import exporters
from diagnoser.metrics import families as F
from diagnoser.plumbing.printable import printable
from diagnoser.plumbing.source import MetricSource

_PROM = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}  # a float as Prometheus writes it
# Ray's stat logger sanitises the colon away (see reference/engine-metrics.md).
CACHE_INFO_NAMES = "vllm:cache_config_info|vllm_cache_config_info"


def cache_info(selector: tuple[str, ...] = ()) -> str:
    """The cache-config series under either name, within the site's selector."""
    return "{" + ", ".join((f'__name__=~"{CACHE_INFO_NAMES}"', *selector)) + "}"


@dataclass(frozen=True)
class LiveEngine:
    """One engine's KV cache as it reports it in ``vllm:cache_config_info``."""

    job: str
    instance: str
    engine: str
    model_name: str
    num_gpu_blocks: int | None
    block_size: int | None
    cache_dtype: str
    gpu_memory_utilization: str
    enable_prefix_caching: str
    capacity_tokens: int | None
    full_length_sequences: int | None
    users_fit: int | None


def live_capacity(
    source: MetricSource,
    at: float,
    max_model_len: int | None,
    context: int | None,
    selector: tuple[str, ...] = (),
) -> list[LiveEngine]:
    """Each (job, instance, engine)'s newest ``vllm:cache_config_info``, as capacity.

    ``timestamp()`` gives when each series was last scraped, so after a restart with new
    settings the new series wins over the old one still inside the lookback window.
    """
    newest: dict[tuple[str, str, str], tuple[float, dict[str, str]]] = {}
    for s in source.query(f"timestamp({cache_info(selector)})", at):
        lb = s.labels
        key = (lb.get("job", ""), lb.get("instance", ""), lb.get("engine", ""))
        seen = float(s.v[-1]) if len(s.v) else 0.0
        if key not in newest or seen > newest[key][0]:
            newest[key] = (seen, lb)
    models = _models(source, at, selector) if newest else {}
    engines_of: dict[tuple[str, str], int] = {}
    for job, instance, _engine in newest:
        engines_of[(job, instance)] = engines_of.get((job, instance), 0) + 1
    out = []
    for (job, instance, engine), (_, lb) in sorted(newest.items()):
        size = _int(lb.get("block_size"))
        tokens = _int(lb.get("kv_cache_size_tokens"))
        summed = _int(lb.get("num_gpu_blocks"))
        if tokens is not None and size:
            blocks: int | None = tokens // size
        elif summed is not None:
            blocks = summed // engines_of[(job, instance)]
            tokens = blocks * size if size else None
        else:
            blocks = None
        out.append(
            LiveEngine(
                job=job,
                instance=instance,
                engine=engine,
                model_name=models.get((job, instance, engine), lb.get("model_name", "")),
                num_gpu_blocks=blocks,
                block_size=size,
                cache_dtype=lb.get("cache_dtype", ""),
                gpu_memory_utilization=lb.get("gpu_memory_utilization", ""),
                enable_prefix_caching=lb.get("enable_prefix_caching", ""),
                capacity_tokens=tokens,
                full_length_sequences=_fit(blocks, size, max_model_len),
                users_fit=_fit(blocks, size, context),
            )
        )
    return out


def _models(
    source: MetricSource, at: float, selector: tuple[str, ...]
) -> dict[tuple[str, str, str], str]:
    """Each engine's model, from its running-requests gauge."""
    sel = "{" + ", ".join(selector) + "}" if selector else ""
    query = f"max by (job, instance, engine, model_name) ({F.RUNNING.name}{sel})"
    out = {}
    for s in source.query(query, at):
        lb = s.labels
        key = (lb.get("job", ""), lb.get("instance", ""), lb.get("engine", ""))
        out[key] = lb.get("model_name", "")
    return out


def _int(text: str | None) -> int | None:
    """A positive count, else None ("None" before vLLM has profiled the memory)."""
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if 0 < value < 1 << 48 else None


def _fit(blocks: int | None, size: int | None, tokens: int | None) -> int | None:
    if blocks is None or not size or not tokens:
        return None
    return blocks // blocks_for(tokens, size)


@dataclass(frozen=True)
class Live:
    """The live reading: when, what it counted against, and every engine."""

    at: float
    max_model_len: int | None
    context: int | None
    engines: list[LiveEngine]


def read_live(
    source: MetricSource,
    at: float,
    max_model_len: int | None,
    context: int | None,
    selector: tuple[str, ...] = (),
) -> Live:
    engines = live_capacity(source, at, max_model_len, context, selector)
    return Live(at, max_model_len, context, engines)


def dcgm_gpu(source: MetricSource, at: float) -> tuple[str, float] | None:
    """The servers' GPU as dcgm-exporter reports it: its ``modelName`` and memory (framebuffer
    used plus free, MiB, as bytes); None without DCGM series (a series without a point, or
    of no memory, is none). Several GPU models are ambiguous for one plan: ``UserError`` asks
    for --gpu. A memory that is no size (``+Inf``, ``NaN``) is the source's garbage:
    ``SourceError`` names it and asks for --gpu."""
    from diagnoser.plumbing.errors import UserError
    from diagnoser.plumbing.source import SourceError

    used, free = exporters.GPU_FB_USED.name, exporters.GPU_FB_FREE.name
    query = f"max by (modelName) ({used} + {free})"
    found = {
        s.labels.get("modelName", ""): float(s.v[-1]) for s in source.query(query, at) if len(s.v)
    }
    for name, mib in found.items():
        if not math.isfinite(mib):
            raise SourceError(
                f"DCGM reports the framebuffer of {printable(name) or 'a GPU'} ({used} + {free}) "
                f"as {_PROM.get(str(mib), mib)} MiB, not a size: give --gpu"
            )
    found = {k: v for k, v in found.items() if v > 0}
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(printable(n) for n in sorted(found))
        raise UserError(f"DCGM reports several GPU models ({names}): give --gpu for the plan")
    ((name, mib),) = found.items()
    return name or "GPU from DCGM", mib * 2**20
