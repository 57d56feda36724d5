"""LLM serving / Overview: per model, the service level, latency, throughput, workload and
saturation; speculative decoding and LoRA in rows that matter only where they are on."""

from __future__ import annotations

from grafanalib.core import Dashboard, Stat, Table

from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_series as rs
from diagnoser.metrics import promql_sglang as sg
from diagnoser.outputs.dashboards import diagnosis, models, slo_row
from diagnoser.outputs.dashboards.frame import FIRING_ALERTS, dashboard
from diagnoser.outputs.dashboards.style import (
    FLEET,
    RATE,
    RATIO,
    Board,
    heatmap,
    query,
    series,
    stat,
    stat_panel,
    steps,
    table,
    table_target,
)
from diagnoser.site import Site

UID = "servediag-overview"


def slo_expr(board: Board, kind: str) -> str:
    scope = board.site.scope(window=RATE, matchers=FLEET)
    if kind == "ttft":
        vllm = rs.bucket_share(F.TTFT.name, "$ttft_slo")
        return q.either(vllm, sg.bucket_share(SG.TTFT, "$ttft_slo"))(scope)
    vllm = q.either(*(rs.bucket_share(name, "$itl_slo") for name in F.ITL_NAMES))
    return q.either(vllm, sg.bucket_share(SG.ITL, "$itl_slo"))(scope)


def slo_stat(grid: Board, title: str, kind: str) -> Stat:
    families = (F.TTFT.name,) if kind == "ttft" else F.ITL_NAMES
    return stat_panel(
        grid,
        title,
        [query(slo_expr(grid, kind), grid.legend("{{model_name}}"))],
        unit=RATIO,
        decimals=1,
        thresholds=steps("red", ("orange", 0.9), ("green", 0.99)),
        description=grid.describe(
            "Share of requests (TTFT) or output tokens (ITL) at or under the SLO chosen above; "
            "thresholds are vLLM's bucket bounds, so no interpolation. SGLang's models show "
            "where the threshold is one of SGLang's bounds too (TTFT 1 s, 2 s, ...; ITL 0.1 s, "
            "0.2 s, ...). Below the objective the error budget burns: see the SLO row.",
            families,
        ),
    )


def service_level(g: Board) -> list[object]:
    return [
        g.row("Service level"),
        stat(g, "Requests / s", "request_rate"),
        stat(g, "Input tokens / s", "prompt_tokens_rate"),
        stat(g, "Output tokens / s", "generation_tokens_rate"),
        stat(g, "5xx share", "http_5xx_share", [("orange", 0.001), ("red", 0.01)]),
        stat(
            g,
            "Engines",
            "engines",
            description="Engines reporting now (a data-parallel server has several). Fewer than "
            "you deployed: a server is down or restarting; see Unreachable targets.",
        ),
        stat(
            g,
            "Unreachable targets",
            "targets_down",
            [("red", 1.0)],
            description="The model's vLLM scrape targets that are down (up == 0), a target "
            "counted for the model it served within the last hour. Above 0: a server crashed, "
            "is restarting, or Prometheus cannot reach it.",
        ),
        slo_stat(g, "TTFT SLO attainment", "ttft"),
        slo_stat(g, "ITL SLO attainment", "itl"),
        stat(g, "TTFT p95", "ttft_p95", [("orange", 1.0), ("red", 5.0)]),
        stat(g, "ITL p95", "itl_p95", [("orange", 0.1), ("red", 0.3)]),
        stat(g, "E2E p95", "e2e_p95"),
        stat(g, "Peak KV cache", "kv_cache_usage", [("orange", 0.9), ("red", 0.98)]),
        stat(g, "Prefix cache hit rate", "prefix_cache_hit_rate"),
        stat(g, "Preemptions / s", "preemptions_rate", [("orange", 0.001), ("red", 1.0)]),
        stat(g, "Waiting", "requests_waiting", [("orange", 1.0), ("red", 50.0)]),
        stat(g, "Engine errors", "finished_error_share", [("orange", 0.001), ("red", 0.01)]),
        series(
            g,
            "Restarts and why",
            [
                ("engine_restarts", "restarts (server) {{model_name}}"),
                ("container_restarts", "restarts (container) {{model_name}}"),
                ("container_oom_killed", "OOMKilled {{model_name}}"),
                ("container_crash_looping", "CrashLoopBackOff {{model_name}}"),
                ("container_start_failing", "cannot start {{model_name}}"),
                ("pods_evicted", "evicted {{model_name}}"),
            ],
            w=24,
            description="Restarts per model over five minutes, the server's own (its process "
            "start time changed) and the container's, beside the reasons Kubernetes gives: "
            "containers last ended OOMKilled (at their memory limit), waiting in "
            "CrashLoopBackOff, unable to start (image or configuration), pods evicted. The "
            "reasons need kube-state-metrics, scraped with honor_labels (docs/platform.md).",
        ),
    ]


def latency(g: Board) -> list[object]:
    def pcts(title: str, prefix: str, what: str, w: int = 8) -> object:
        legends = [(f"{prefix}_p{p}", f"p{p} {{{{model_name}}}}") for p in (50, 95, 99)]
        return series(g, title, legends, description=what, w=w)

    return [
        g.row("Latency"),
        pcts(
            "Time to first token",
            "ttft",
            "Time from a request's arrival to its first token, tokenization and queue included. "
            "Rising p95 with a steady p50: a queue or long prompts; against the TTFT SLO above.",
        ),
        pcts(
            "Inter-token latency",
            "itl",
            "Gap between output tokens of a stream. Rising with the running batch is decode "
            "sharing the GPU; spikes are long prefills stalling decode (see the heatmap).",
        ),
        pcts(
            "End-to-end latency",
            "e2e",
            "Whole request, arrival to last token: grows with output length as much as with "
            "slowness, so read it next to the output length below.",
        ),
        pcts(
            "Time per output token (per request)",
            "tpot",
            "Each finished request's mean gap between tokens (decode time over output tokens): "
            "what a reader of one stream sees on average, without the ITL's spikes.",
            w=6,
        ),
        pcts(
            "Queue time",
            "queue_time",
            "Time requests wait for a batch slot and KV room. Above a few hundred ms the engine "
            "is at capacity: slots (--max-num-seqs) or KV cache; see Saturation.",
            w=6,
        ),
        pcts(
            "Decode time",
            "decode_time",
            "Time from a request's first token to its last. Grows with output length and with "
            "the running batch; rising while output length holds steady is decode slowing down "
            "(a bigger batch, longer contexts, prefills stalling it).",
            w=6,
        ),
        series(
            g,
            "Mean time per request phase",
            [
                ("queue_time_mean", "queue {{model_name}}"),
                ("prefill_time_mean", "prefill {{model_name}}"),
                ("decode_time_mean", "decode {{model_name}}"),
            ],
            description="Where a request's time goes, mean per finished request, stacked: "
            "waiting, computing its prompt, generating. A growing queue share is capacity; a "
            "growing prefill share is longer (or less cached) prompts.",
            stack=True,
            w=6,
        ),
        heatmap(
            g,
            "TTFT distribution",
            (F.TTFT.name,),
            "s",
            "First tokens per second in each TTFT bucket. Two bands (a fast one and a slow one) "
            "are two populations, such as cached and uncached prompts, that a percentile hides.",
        ),
        heatmap(
            g,
            "ITL distribution",
            F.ITL_NAMES,
            "s",
            "Output steps per second in each inter-token bucket. A second band high above the "
            "main one is decode stalled behind long prefills (prefill interference); "
            "percentiles average it away.",
        ),
        heatmap(
            g,
            "End-to-end distribution",
            (F.E2E.name,),
            "s",
            "Finished requests per second in each end-to-end latency bucket: a band at the "
            "client's timeout, or at the longest answers, shows here first.",
        ),
        series(
            g,
            "Tokens per decode step",
            [("tokens_per_decode_step", "{{model_name}}")],
            w=12,
            description="Output tokens a decoding request gets per engine step: 1 without "
            "speculation, 1 plus its accepted draft tokens with it, steps where the n-gram "
            "drafter found nothing to propose included. vLLM observes ITL once per step, so "
            "the time per output token is ITL divided by this.",
        ),
        series(
            g,
            "Time per output token",
            [("tpot_mean", "mean {{model_name}}"), ("itl_p50", "ITL p50 {{model_name}}")],
            w=12,
            description="Each finished request's decode time over its tokens, the mean (the "
            "histogram's first bound is 10 ms, too coarse for fast speculative streams), next "
            "to the per-step ITL median. The gap between them is what speculation buys.",
        ),
    ]


def throughput(g: Board) -> list[object]:
    return [
        g.row("Throughput"),
        series(
            g,
            "Token throughput",
            [
                ("prompt_tokens_rate", "input {{model_name}}"),
                ("generation_tokens_rate", "output {{model_name}}"),
            ],
            w=12,
            description="Prompt tokens (cached ones included) and generated tokens per second. "
            "Output falling while requests hold steady: decode slowed down.",
        ),
        series(
            g,
            "Throughput against goodput",
            [("request_rate", "finished"), ("goodput_rate", "within SLO (estimate)")],
            w=12,
        ),
        series(
            g,
            "Finished requests by reason",
            [("finished_rate_by_reason", "{{finished_reason}} {{model_name}}")],
            w=12,
            description="Requests finished per second by finished_reason: stop (the model "
            "ended), length (cut at max_tokens), abort (the client left or the engine dropped "
            "it), error, repetition. Any error or a rise in abort deserves a look.",
        ),
        series(
            g,
            "Finish reason share",
            [("finished_share_by_reason", "{{finished_reason}} {{model_name}}")],
            w=12,
            description="Share of finished requests by finished_reason. A length share that "
            "grows after a model or template change is a stop token no longer matching.",
        ),
    ]


def workload(g: Board) -> list[object]:
    return [
        g.row("Workload"),
        series(
            g,
            "Prompt tokens per request",
            [("prompt_tokens_per_request", "mean"), ("prompt_tokens_p95", "p95")],
            w=12,
        ),
        series(
            g,
            "Output length",
            [
                ("generation_tokens_per_request", "mean {{model_name}}"),
                ("generation_tokens_p50", "p50 {{model_name}}"),
                ("generation_tokens_p95", "p95 {{model_name}}"),
                ("generation_tokens_p99", "p99 {{model_name}}"),
            ],
            description="Output tokens per finished request. Longer answers hold KV cache and a "
            "batch slot longer; a p99 at max_tokens is answers cut short.",
            w=12,
        ),
        series(
            g,
            "Output tokens against max_tokens requested",
            [
                ("generation_tokens_per_request", "output tokens {{model_name}}"),
                ("max_tokens_per_request", "max_tokens requested {{model_name}}"),
            ],
            w=12,
            description="Mean output tokens per finished request next to the mean max_tokens the "
            "requests asked for. Far apart is normal: answers end on their own. The lines "
            "meeting while the length share rises means answers are cut at the cap: when "
            "max_tokens came down to the answers, a client or gateway lowered it; when the "
            "answers rose to max_tokens, a stop token is being ignored.",
        ),
        series(
            g,
            "Stopped at max_tokens (finished_reason=length)",
            [("finished_length_share", "{{model_name}}")],
            w=12,
        ),
    ]


def saturation(g: Board) -> list[object]:
    return [
        g.row("Saturation"),
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


def speculative_decoding(g: Board) -> list[object]:
    return [
        series(
            g,
            "Draft acceptance rate",
            [("spec_decode_acceptance_rate", "{{model_name}}")],
            w=12,
            description="Share of draft tokens the target model accepted. Low (under about "
            "0.5) means the drafter guesses badly for this traffic: verification spends compute "
            "on tokens thrown away, and time per output token can be worse than without "
            "speculation. A large drop against yesterday: speculative-decoding-misfire.",
        ),
        series(
            g,
            "Mean acceptance length",
            [("spec_decode_acceptance_length", "{{model_name}}")],
            w=12,
            description="Tokens each decode step yields per draft (1 + accepted per draft). Near "
            "1, speculation buys nothing; compare with the configured number of draft tokens.",
        ),
        series(
            g,
            "Acceptance by draft position",
            [("spec_decode_acceptance_by_position", "position {{position}} {{model_name}}")],
            w=12,
            description="Share of drafts whose token at each position was accepted; it falls "
            "with the position. A position accepted rarely is a draft token not worth proposing.",
        ),
        series(
            g,
            "Draft tokens proposed and accepted",
            [
                ("spec_decode_draft_tokens_rate", "proposed {{model_name}}"),
                ("spec_decode_accepted_tokens_rate", "accepted {{model_name}}"),
            ],
            w=12,
            description="Draft tokens per second, proposed and accepted; the gap is work the "
            "target model verified for nothing.",
        ),
    ]


def lora(g: Board) -> list[object]:
    selector = ", ".join((*g.site.config.selector, 'job=~"$job"', 'instance=~"$instance"'))
    return [
        table(
            g,
            "LoRA adapters by server",
            [table_target(f"topk by (job, instance) (1, {F.LORA_INFO.name}{{{selector}}})")],
            description=g.describe(
                "Per server, the adapters running and waiting and the slots for them (max_lora), "
                "as last reported. Adapters waiting while as many run as max_lora allows: "
                "requests wait for an adapter slot, not for the GPU; raise --max-loras or "
                "spread the adapters over servers. vLLM only: SGLang exports no adapter "
                "series.",
                (F.LORA_INFO.name,),
            ),
            transformations=[
                {
                    "id": "organize",
                    "options": {"excludeByName": {"Time": True, "Value": True, "__name__": True}},
                }
            ],
        )
    ]


def alerts_table(grid: Board) -> Table:
    """The playbook alerts firing now; each playbook cell opens its runbook."""
    return table(
        grid,
        "Playbook alerts firing",
        [table_target(FIRING_ALERTS)],
        description="Alerts from the generated rules (ALERTS); click a playbook to open its "
        "runbook. Any row here is a known pattern diagnose can explain.",
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
    panels: list[object] = diagnosis.panels(g)
    panels += service_level(g)
    panels += slo_row.panels(g)
    panels += [g.row("Models"), models.summary(g)]
    panels += latency(g) + throughput(g) + workload(g) + saturation(g)
    panels.append(
        g.collapsed_row(
            "Speculative decoding (with --speculative-config)", lambda: speculative_decoding(g)
        )
    )
    panels.append(g.collapsed_row("LoRA adapters (with --enable-lora)", lambda: lora(g)))
    panels += [g.row("Alerts"), alerts_table(g)]
    return dashboard(
        site,
        "Overview",
        UID,
        "Per model: SLO attainment, latency percentiles and distributions, throughput, "
        "workload and saturation.",
        panels,
    )
