"""LLM serving / Latency by prompt length: what users see per prompt class (probe) and the
server."""

from __future__ import annotations

from grafanalib.core import Dashboard

from diagnoser.metrics import families as F
from diagnoser.outputs.dashboards.frame import dashboard
from diagnoser.outputs.dashboards.style import Board, heatmap, series
from diagnoser.site import Site

UID = "servediag-prompt-length"


def build(site: Site) -> Dashboard:
    g = Board(site)
    panels: list[object] = [g.row("Client side (synthetic probe)")]
    panels += [
        series(
            g,
            "Client TTFT p95 by prompt class",
            [("probe_ttft_p95_by_bucket", "{{prompt_bucket}}")],
            w=12,
        ),
        series(
            g,
            "Client ITL p95 by prompt class",
            [("probe_itl_p95_by_bucket", "{{prompt_bucket}}")],
            w=12,
        ),
        series(
            g,
            "Time lost outside the engine",
            [("ttft_outside_engine", "{{model_name}}")],
            w=12,
            description="Client TTFT p95 of the fastest prompt class minus server TTFT p95: "
            "a buffering proxy, gateway or network.",
        ),
        series(
            g,
            "Client first token over end-to-end",
            [("probe_first_token_share_of_e2e", "{{model_name}}")],
            w=12,
            description="Near 100%: the stream arrives in one burst (buffered).",
        ),
    ]
    panels.append(g.row("Server side"))
    panels += [
        heatmap(
            g,
            "Prompt length distribution (requests per bucket)",
            (F.PROMPT.name,),
            "short",
            "Finished requests per second in each prompt-token bucket: a new band of long "
            "prompts (a retrieval launch, a longer history) shows here before it shows in the "
            "percentiles, and before TTFT rises.",
            w=24,
        ),
        series(
            g,
            "Prompt tokens per request",
            [
                ("prompt_tokens_p50", "p50"),
                ("prompt_tokens_p95", "p95"),
                ("prompt_tokens_p99", "p99"),
            ],
            w=12,
        ),
        series(g, "Server TTFT", [("ttft_p50", "p50"), ("ttft_p95", "p95")], w=12),
        series(
            g,
            "Prefill seconds per prompt token",
            [("prefill_seconds_per_prompt_token", "{{model_name}}")],
            w=12,
            description="Rises when prefill grows faster than the prompt (attention).",
        ),
        series(
            g,
            "Queue and prefill time",
            [("queue_time_mean", "queue"), ("prefill_time_mean", "prefill")],
            w=12,
        ),
    ]
    return dashboard(
        site,
        "Latency by prompt length",
        UID,
        "Client-side TTFT and ITL per prompt class next to the server's view.",
        panels,
    )
