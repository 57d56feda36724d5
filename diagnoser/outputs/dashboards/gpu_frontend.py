"""LLM serving / GPU and frontend: DCGM utilisation, memory, power, heat, clocks, XID errors and
the node and GPU faults; API-server CPU and HTTP traffic by handler and outcome."""

from __future__ import annotations

from grafanalib.core import Dashboard

from diagnoser.outputs.dashboards.frame import dashboard
from diagnoser.outputs.dashboards.style import RANGE, Board, series, stat
from diagnoser.site import Site

UID = "servediag-gpu-frontend"
GPU_JOIN = (
    " GPUs are matched to models through their pod (dcgm-exporter's Kubernetes pod mapping) "
    "or, without one, through their host."
)


def gpus(g: Board) -> list[object]:
    return [
        g.row("GPU (DCGM)"),
        series(
            g,
            "GPU utilisation (share of time any kernel runs)",
            [("gpu_utilization", "{{model_name}}")],
            description="Not compute in use: decode is memory-bound, so 100% here can still "
            "have headroom. Judge by latency and tokens/s; near 0 with traffic, the GPU "
            "is not the bottleneck (the API server or the queue is)." + GPU_JOIN,
        ),
        series(
            g,
            "GPU memory used (fullest GPU)",
            [("gpu_memory_used_share", "{{model_name}}")],
            description="Framebuffer used over total on the fullest GPU. vLLM takes "
            "--gpu-memory-utilization of it at start; more than that is another process, "
            "which can push vLLM out of memory." + GPU_JOIN,
        ),
        series(
            g,
            "GPU power draw",
            [("gpu_power_watts", "{{model_name}}")],
            description="Watts drawn by the model's GPUs, summed. Near the boards' power limit "
            "the clocks come down (see SM clock) and every step slows." + GPU_JOIN,
        ),
        series(
            g,
            "GPU temperature (hottest GPU)",
            [("gpu_temperature_max", "{{model_name}}")],
            description="The hottest GPU's temperature. Above about 85 C data-centre GPUs "
            "throttle their clocks; a single hot GPU slows its whole tensor-parallel group."
            + GPU_JOIN,
        ),
        series(
            g,
            "SM clock (slowest GPU)",
            [("gpu_sm_clock_min", "{{model_name}}")],
            description="The slowest GPU's SM clock. A busy GPU well below its boost clock "
            "(H100: 1980 MHz) is throttled by power or heat; an idle one sits low." + GPU_JOIN,
        ),
        series(
            g,
            "XID errors (last code)",
            [("gpu_xid_last", "{{model_name}}")],
            description="The last XID error code the driver reported, highest over the "
            "model's GPUs; 0 is none. 13, 31, 43: a kernel or memory fault in the process; "
            "48, 63, 64, 92, 94, 95: ECC errors; 74: NVLink; 79: the GPU fell off the bus. "
            "Any other than 0 deserves the node's kernel log." + GPU_JOIN,
        ),
        series(
            g,
            "Node and GPU faults",
            [
                ("gpu_uncorrectable_errors", "uncorrectable GPU memory errors {{model_name}}"),
                ("node_not_ready", "pods on a node not Ready {{model_name}}"),
                ("node_memory_pressure", "pods on a node under memory pressure {{model_name}}"),
                ("node_disk_pressure", "pods on a node under disk pressure {{model_name}}"),
                ("nodes_lost", "pods lost with their node {{model_name}}"),
                ("node_oom_kills", "host OOM kills {{model_name}}"),
            ],
            w=16,
            description="What the model's nodes and GPUs went through: uncorrectable memory "
            "errors on its GPUs (DCGM: double-bit ECC where enabled, rows remapped), the "
            "model's pods on a node that is not Ready (lost, reclaimed) or under memory or disk "
            "pressure, the pods that went down with their node (kube-state-metrics), and the "
            "kernel's OOM kills on its hosts (node-exporter). A GPU with uncorrectable errors "
            "needs its node drained.",
        ),
    ]


def api_server(g: Board) -> list[object]:
    return [
        g.row("API server"),
        stat(g, "API-server CPU (cores)", "api_server_cpu", [("orange", 0.8), ("red", 0.95)]),
        stat(g, "4xx share", "http_4xx_share", [("orange", 0.01), ("red", 0.05)]),
        stat(g, "5xx share", "http_5xx_share", [("orange", 0.001), ("red", 0.01)]),
        stat(
            g,
            "Restarts",
            "engine_restarts",
            [("red", 1.0)],
            description="API-server restarts over the dashboard's time range (its process "
            "start time changed, or its counters reset). A restart drops every request in "
            "flight; more than one is a crash loop or repeated deploys.",
            window=RANGE,
        ),
        series(
            g, "API-server CPU by instance", [("api_server_cpu", "{{instance}}")], per_instance=True
        ),
        series(
            g,
            "Time before the engine (tokenization, API server)",
            [("frontend_time_mean", "{{model_name}}")],
        ),
        series(g, "HTTP outcome shares", [("http_4xx_share", "4xx"), ("http_5xx_share", "5xx")]),
        series(
            g,
            "HTTP requests by handler and status",
            [("http_requests_by_handler_status", "{{handler}} {{status}} {{model_name}}")],
            w=12,
            description="Requests per second by handler and status class, every endpoint the "
            "API server counts. A 4xx on the completion handlers is usually a prompt over "
            "max_model_len; any 5xx is a failed request users saw.",
        ),
        series(
            g,
            "HTTP mean duration by handler",
            [("http_duration_mean_by_handler", "{{handler}} {{model_name}}")],
            w=12,
            description="Mean time to answer, per handler; for a streamed completion, the whole "
            "stream. Non-inference handlers (/v1/models, /tokenize) slower than milliseconds "
            "mean the API server's event loop is busy.",
        ),
    ]


def build(site: Site) -> Dashboard:
    g = Board(site)
    return dashboard(
        site,
        "GPU and frontend",
        UID,
        "DCGM utilisation, memory, power, temperature, clocks and XID errors; API-server CPU "
        "and HTTP traffic by handler and outcome.",
        [*gpus(g), *api_server(g)],
    )
