"""vLLM / GPU and frontend: DCGM utilisation and memory, API-server CPU, HTTP outcomes."""

from __future__ import annotations

from grafanalib.core import Dashboard, RowPanel

from diagnoser.outputs.dashboards.style import Board, dashboard, series, stat
from diagnoser.site import Site

UID = "servediag-gpu-frontend"


def build(site: Site) -> Dashboard:
    g = Board(site)
    panels: list[object] = [RowPanel(title="GPU (DCGM)", gridPos=g.place(24, 1))]
    panels += [
        series(
            g,
            "GPU utilisation (share of time any kernel runs)",
            [("gpu_utilization", "{{model_name}}")],
            w=12,
            description="Not compute in use: decode is memory-bound, so 100% here can "
            "still have headroom. Judge by latency and tokens/s.",
        ),
        series(
            g, "GPU memory used (fullest GPU)", [("gpu_memory_used_share", "{{model_name}}")], w=12
        ),
    ]
    panels.append(RowPanel(title="API server", gridPos=g.place(24, 1)))
    panels += [
        stat(g, "API-server CPU (cores)", "api_server_cpu", [("orange", 0.8), ("red", 0.95)]),
        stat(g, "4xx share", "http_4xx_share", [("orange", 0.01), ("red", 0.05)]),
        stat(g, "5xx share", "http_5xx_share", [("orange", 0.001), ("red", 0.01)]),
        stat(g, "Restarts", "engine_restarts", [("red", 1.0)]),
    ]
    g.newline()
    panels += [
        series(
            g, "API-server CPU by instance", [("api_server_cpu", "{{instance}}")], per_instance=True
        ),
        series(
            g,
            "Time before the engine (tokenization, API server)",
            [("frontend_time_mean", "{{model_name}}")],
        ),
        series(g, "HTTP outcome shares", [("http_4xx_share", "4xx"), ("http_5xx_share", "5xx")]),
    ]
    return dashboard(
        site,
        "GPU and frontend",
        UID,
        "DCGM utilisation and memory, API-server CPU and HTTP outcomes.",
        panels,
    )
