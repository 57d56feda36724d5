"""vLLM / KV cache and batching: what binds the batch (memory, slots, the step budget)."""

from __future__ import annotations

from grafanalib.core import Dashboard, RowPanel, Table, Target

from diagnoser.dashboards.style import DS, FLEET, Grid, dashboard, series, stat

UID = "servediag-kv-batching"


def build() -> Dashboard:
    g = Grid()
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
            "Tokens per engine step",
            [("tokens_per_step_mean", "mean"), ("tokens_per_step_p99", "p99")],
            description="Against --max-num-batched-tokens: steps far above a few hundred "
            "tokens carry whole prefills and stall everyone's decode.",
        ),
        series(g, "Engine steps over 4096 tokens / s", [("large_steps_rate", "{{model_name}}")]),
        series(
            g,
            "Waiting by reason (vLLM >= 0.25)",
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
            description="One row per engine: block size, KV dtype, GPU blocks, memory share.",
            targets=[
                Target(
                    expr=f"max by (model_name, instance, engine, block_size, cache_dtype, "
                    f"num_gpu_blocks, gpu_memory_utilization, enable_prefix_caching) "
                    f"(vllm:cache_config_info{{{', '.join(FLEET)}}})",
                    instant=True,
                    format="table",
                    refId="A",
                    datasource=DS,
                )
            ],
        )
    )
    return dashboard(
        "KV cache and batching",
        UID,
        "KV usage, preemptions, running against waiting, tokens per engine step.",
        panels,
    )
