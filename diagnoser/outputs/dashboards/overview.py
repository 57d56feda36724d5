"""vLLM / Overview: per model, the service level, latency, workload and saturation."""

from __future__ import annotations

from grafanalib.core import Dashboard, RowPanel, Stat, Table, Target, Threshold

from diagnoser.core import families_sglang as SG
from diagnoser.core import promql as q
from diagnoser.core import promql_sglang as sg
from diagnoser.core.signals.names import ITL, TTFT
from diagnoser.outputs.dashboards import slo_row
from diagnoser.outputs.dashboards.style import (
    DS,
    FIRING_ALERTS,
    FLEET,
    RATE,
    Board,
    dashboard,
    series,
    stat,
    table_target,
)
from diagnoser.site import Site

UID = "servediag-overview"


def slo_expr(board: Board, kind: str) -> str:
    scope = board.site.scope(window=RATE, matchers=FLEET)
    if kind == "ttft":
        vllm = q.bucket_share(TTFT, "$ttft_slo")
        return q.either(vllm, sg.bucket_share(SG.TTFT, "$ttft_slo"))(scope)
    vllm = q.either(*(q.bucket_share(name, "$itl_slo") for name in ITL))
    return q.either(vllm, sg.bucket_share(SG.ITL, "$itl_slo"))(scope)


def slo_stat(grid: Board, title: str, kind: str) -> Stat:
    return Stat(
        title=title,
        dataSource=DS,
        format="percentunit",
        gridPos=grid.place(3, 4),
        reduceCalc="lastNotNull",
        decimals=1,
        description="Share of requests (TTFT) or output tokens (ITL) at or under the SLO "
        "chosen above; thresholds are vLLM's bucket bounds, so no interpolation. SGLang's "
        "models show where the threshold is one of SGLang's bounds too (TTFT 1 s, 2 s, ...; "
        "ITL 0.1 s, 0.2 s, ...).",
        targets=[Target(expr=slo_expr(grid, kind), refId="A", datasource=DS)],
        thresholds=[
            Threshold("red", 0, 0.0),
            Threshold("orange", 1, 0.9),
            Threshold("green", 2, 0.99),
        ],
    )


def alerts_table(grid: Board) -> Table:
    """The playbook alerts firing now; each playbook cell opens its runbook."""
    return Table(
        title="Playbook alerts firing",
        dataSource=DS,
        gridPos=grid.place(24, 6),
        description="Alerts from the generated rules; click a playbook to open its runbook.",
        targets=[table_target(FIRING_ALERTS)],
        transformations=[
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value": True, "__name__": True},
                    "indexByName": {
                        "alertname": 0,
                        "severity": 1,
                        "playbook": 2,
                        "model_name": 3,
                        "instance": 4,
                    },
                },
            }
        ],
        overrides=[
            {
                "matcher": {"id": "byName", "options": "playbook"},
                "properties": [
                    {
                        "id": "links",
                        "value": [
                            {
                                "title": "Runbook: ${__value.text}",
                                "url": grid.site.runbook("${__value.raw}"),
                                "targetBlank": True,
                            }
                        ],
                    }
                ],
            }
        ],
    )


def build(site: Site) -> Dashboard:
    g = Board(site)
    panels: list[object] = [RowPanel(title="Service level", gridPos=g.place(24, 1))]
    panels += [
        stat(g, "Requests / s", "request_rate"),
        stat(g, "Output tokens / s", "generation_tokens_rate"),
        stat(g, "5xx share", "http_5xx_share", [("orange", 0.001), ("red", 0.01)]),
        stat(g, "Peak KV cache", "kv_cache_usage", [("orange", 0.9), ("red", 0.98)]),
        stat(g, "Preemptions / s", "preemptions_rate", [("orange", 0.001), ("red", 1.0)]),
        stat(g, "Waiting", "requests_waiting", [("orange", 1.0), ("red", 50.0)]),
        slo_stat(g, "TTFT SLO attainment", "ttft"),
        slo_stat(g, "ITL SLO attainment", "itl"),
    ]
    panels += slo_row.panels(g)
    panels.append(RowPanel(title="Latency", gridPos=g.place(24, 1)))
    panels += [
        series(
            g,
            "Time to first token",
            [
                ("ttft_p50", "p50 {{model_name}}"),
                ("ttft_p95", "p95 {{model_name}}"),
                ("ttft_p99", "p99 {{model_name}}"),
            ],
        ),
        series(
            g,
            "Inter-token latency",
            [
                ("itl_p50", "p50 {{model_name}}"),
                ("itl_p95", "p95 {{model_name}}"),
                ("itl_p99", "p99 {{model_name}}"),
            ],
        ),
        series(
            g,
            "End-to-end latency",
            [
                ("e2e_p50", "p50 {{model_name}}"),
                ("e2e_p95", "p95 {{model_name}}"),
                ("e2e_p99", "p99 {{model_name}}"),
            ],
        ),
    ]
    panels.append(RowPanel(title="Workload", gridPos=g.place(24, 1)))
    panels += [
        series(
            g,
            "Prompt tokens per request",
            [("prompt_tokens_per_request", "mean"), ("prompt_tokens_p95", "p95")],
        ),
        series(
            g,
            "Stopped at max_tokens (finished_reason=length)",
            [("finished_length_share", "{{model_name}}")],
        ),
        series(
            g,
            "Throughput against goodput",
            [("request_rate", "finished"), ("goodput_rate", "within SLO (estimate)")],
        ),
    ]
    panels.append(RowPanel(title="Saturation", gridPos=g.place(24, 1)))
    panels += [
        series(
            g, "KV cache usage by instance", [("kv_cache_usage", "{{instance}}")], per_instance=True
        ),
        series(
            g,
            "Running and waiting",
            [("requests_running", "running"), ("requests_waiting", "waiting")],
        ),
        series(g, "Preemptions / s", [("preemptions_rate", "{{model_name}}")]),
    ]
    panels.append(RowPanel(title="Alerts", gridPos=g.place(24, 1)))
    panels.append(alerts_table(g))
    return dashboard(
        site,
        "Overview",
        UID,
        "Per model: SLO attainment, latency percentiles, workload and saturation.",
        panels,
    )
