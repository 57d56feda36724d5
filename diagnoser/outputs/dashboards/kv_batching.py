"""vLLM / KV cache and batching: what binds the batch (memory, slots, the step budget)."""

from __future__ import annotations

from grafanalib.core import Dashboard, RowPanel, Table, Target, TimeSeries

from diagnoser.outputs.dashboards.style import (
    DS,
    Board,
    custom,
    dashboard,
    series,
    stat,
    table_target,
)
from diagnoser.site import Site

UID = "servediag-kv-batching"


def budget_series(g: Board) -> TimeSeries:
    """Tokens per step against the step budget, which vLLM does not export: the
    ``step_budget`` variable holds the pool's --max-num-batched-tokens."""
    panel = series(
        g,
        "Tokens per engine step against the budget",
        [("tokens_per_step_mean", "mean"), ("tokens_per_step_p99", "p99")],
        description="Against --max-num-batched-tokens (set the step_budget variable to the "
        "pool's value; vLLM does not export it). Steps far above a few hundred tokens carry "
        "whole prefills and stall everyone's decode; the p99 tops out at 16384, the "
        "histogram's last bound.",
    )
    panel.targets.append(
        Target(expr="vector($step_budget)", legendFormat="budget", refId="C", datasource=DS)
    )
    return panel


STEP_BUDGET = custom(
    "step_budget",
    "Step budget (--max-num-batched-tokens)",
    ["2048", "4096", "8192", "16384", "32768"],
    "8192",
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
        budget_series(g),
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
                table_target(
                    f"max by (model_name, instance, engine, block_size, cache_dtype, "
                    f"num_gpu_blocks, gpu_memory_utilization, enable_prefix_caching) "
                    f"(vllm:cache_config_info{{{', '.join(g.fleet)}}})"
                )
            ],
        )
    )
    return dashboard(
        site,
        "KV cache and batching",
        UID,
        "KV usage, preemptions, running against waiting, tokens per engine step.",
        panels,
        extra_variables=(STEP_BUDGET,),
    )
