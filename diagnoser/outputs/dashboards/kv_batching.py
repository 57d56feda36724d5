"""vLLM / KV cache and batching: what binds the batch (memory, slots, long prefills)."""

from __future__ import annotations

from grafanalib.core import Dashboard, RowPanel, Table

from diagnoser.outputs.dashboards.style import (
    DS,
    Board,
    dashboard,
    series,
    stat,
    table_target,
)
from diagnoser.site import Site

UID = "servediag-kv-batching"


def cache_config_query(g: Board) -> str:
    """``vllm:cache_config_info`` per engine, with the model it serves.

    The info series has CacheConfig's fields and ``engine`` but no ``model_name``, so the
    model comes from the engine's running gauge, joined on (job, instance, engine)."""
    info = [m for m in g.fleet if not m.startswith("model_name")]
    fields = "block_size, cache_dtype, num_gpu_blocks, kv_cache_size_tokens, " + (
        "gpu_memory_utilization, enable_prefix_caching"
    )
    running = f"vllm:num_requests_running{{{', '.join(g.fleet)}}}"
    model = f"max by (job, instance, engine, model_name) ({running})"
    info_sel = ", ".join(info)
    return (
        f"max by (job, instance, engine, {fields}) (vllm:cache_config_info{{{info_sel}}})"
        f" * on (job, instance, engine) group_left (model_name) ({model} * 0 + 1)"
    )


def build(site: Site) -> Dashboard:
    g = Board(site)
    panels: list[object] = [RowPanel(title="KV cache", gridPos=g.place(24, 1))]
    panels += [
        stat(g, "Peak KV cache", "kv_cache_usage", [("orange", 0.9), ("red", 0.98)]),
        stat(g, "Preemptions / s", "preemptions_rate", [("orange", 0.001), ("red", 1.0)]),
        stat(g, "Preemptions per request", "preemptions_per_request", [("orange", 0.01)]),
        stat(g, "Prefix cache hit rate", "prefix_cache_hit_rate"),
    ]
    g.newline()
    panels += [
        series(
            g,
            "KV cache usage by instance",
            [("kv_cache_usage", "{{instance}}")],
            w=12,
            per_instance=True,
        ),
        series(g, "Preemptions / s", [("preemptions_rate", "{{model_name}}")], w=12),
    ]
    panels.append(RowPanel(title="Batching", gridPos=g.place(24, 1)))
    panels += [
        series(
            g,
            "Running and waiting",
            [("requests_running", "running"), ("requests_waiting", "waiting")],
        ),
        series(
            g,
            "Tokens per output batch",
            [("output_batch_tokens_mean", "mean"), ("output_batch_tokens_p99", "p99")],
            description="vllm:iteration_tokens_total: per engine step that produced output, "
            "the tokens generated plus the prompts of the requests whose first token it carries "
            "(uncached tokens only from vLLM 0.23). Not the step's size: a prompt chunked over "
            "many steps counts once, whole, so the p99 follows long prompts whatever "
            "--max-num-batched-tokens is; the p99 tops out at 16384, the last bound.",
        ),
        series(
            g,
            "Long prefills / s (over 5000 uncached tokens)",
            [("long_prefills_rate", "{{model_name}}")],
            description="Requests whose prefill computed more than 5000 prompt tokens (cache "
            "hits excluded; vllm:request_prefill_kv_computed_tokens), counted as they finish. "
            "With a raised --max-num-batched-tokens each one can stall every decoding stream.",
        ),
        series(
            g,
            "Waiting by reason (vLLM >= 0.20)",
            [("requests_waiting_by_reason", "{{reason}}")],
            w=24,
            description="capacity: no free slot or KV room; deferred: held back by the scheduler.",
        ),
    ]
    panels.append(RowPanel(title="Configuration", gridPos=g.place(24, 1)))
    panels.append(
        Table(
            title="Cache configuration (vllm:cache_config_info)",
            dataSource=DS,
            gridPos=g.place(24, 6),
            description="One row per engine: block size, KV dtype, memory share, and KV "
            "capacity (kv_cache_size_tokens, vLLM >= 0.24; num_gpu_blocks is summed over a "
            "server's data-parallel engines). vLLM only: SGLang exports its KV capacity as "
            "sglang:max_total_num_tokens.",
            targets=[table_target(cache_config_query(g))],
        )
    )
    return dashboard(
        site,
        "KV cache and batching",
        UID,
        "KV usage, preemptions, running against waiting, output batches, long prefills.",
        panels,
    )
