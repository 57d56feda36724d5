"""LLM serving / KV cache and batching: what binds the batch (memory, slots, long prefills); KV
offloading and KV transfer in rows that matter only where a KV connector is configured."""

from __future__ import annotations

from grafanalib.core import Dashboard

from diagnoser.metrics import families as F
from diagnoser.metrics.sides import SIDES
from diagnoser.outputs.dashboards.frame import dashboard
from diagnoser.outputs.dashboards.style import (
    Board,
    series,
    stat,
    table,
    table_target,
    timeseries,
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


def kv_offload(g: Board) -> list[object]:
    return [
        series(
            g,
            "KV offload traffic",
            [
                ("kv_offload_store_bytes_rate", "stored {{model_name}}"),
                ("kv_offload_load_bytes_rate", "loaded {{model_name}}"),
            ],
            w=12,
            description="KV-cache bytes per second stored to the offload tier (CPU memory, "
            "disk) and loaded back to the GPU. Loads are prefill work saved; stores without "
            "loads are offloading that no request reuses.",
        ),
        series(
            g,
            "KV offload bandwidth",
            [
                ("kv_offload_store_bandwidth", "store {{model_name}}"),
                ("kv_offload_load_bandwidth", "load {{model_name}}"),
            ],
            w=12,
            description="Bytes moved per second spent moving them. Far below the link "
            "(PCIe, disk) it runs on: the tier is contended, and loading a prefix can cost "
            "more than computing it.",
        ),
        series(
            g,
            "CPU KV-cache space in flight",
            [("kv_offload_cpu_cache_usage", "{{model_name}}")],
            w=12,
            description="CPU KV-cache space pinned by transfers in flight (0-1), the fullest "
            "engine. Sustained near 1, stores and promotions are dropped.",
        ),
        series(
            g,
            "KV offload allocation failures / s",
            [("kv_offload_allocation_failures_rate", "{{model_name}}")],
            w=12,
            description="Stores that found no room in the offload tier. Above 0 the tier is "
            "too small for what is offloaded: blocks are lost and recomputed later.",
        ),
    ]


VLLM_SIDES = "vLLM only: the sides are told from vLLM's KV-connector series (or the site's config)."
# Panels with a line for each side of a disaggregated deployment: (title, signal, legend,
# description). Each signal is read on its own side elsewhere; here both sides are drawn.
BY_SIDE = (
    (
        "Finished requests by side / s",
        "finished_rate_by_reason",
        "{{finished_reason}}",
        "Finished requests per second by finished_reason, on each side. The prefill side "
        'ends every request with "length" after the one token it is asked for: by design, '
        "so the finish reasons, answers and their alerts are read on the decode side. "
        + VLLM_SIDES,
    ),
    (
        "Output tokens per request by side",
        "generation_tokens_per_request",
        "",
        "Output tokens per finished request, mean, on each side: 1 on the prefill side, the "
        "answers' length on the decode side. " + VLLM_SIDES,
    ),
    (
        "Prefill time p95 by side",
        "prefill_time_p95",
        "",
        "Prefill time, 95th percentile, on each side: the prompt's compute on the prefill "
        "side; on the decode side only what the transferred KV did not cover. " + VLLM_SIDES,
    ),
)


def by_side(g: Board) -> list[object]:
    """The two sides of a disaggregated deployment apart (a server on neither side, not
    disaggregated, is drawn on both)."""
    panels: list[object] = []
    for title, signal, legend, description in BY_SIDE:
        targets = [
            g.target(
                signal, f"{side} {legend} {{{{model_name}}}}".replace("  ", " "), ref, side=side
            )
            for ref, side in zip("AB", SIDES, strict=True)
        ]
        panels.append(
            timeseries(
                g,
                title,
                targets,
                unit=g.unit(signal),
                description=g.describe(description, g.families(signal)),
                w=8,
            )
        )
    return panels


def kv_transfer(g: Board) -> list[object]:
    return [
        *by_side(g),
        series(
            g,
            "Prompt tokens from other instances / s",
            [("kv_transfer_tokens_rate", "{{model_name}}")],
            w=12,
            description="Prompt tokens whose KV arrived from another instance (a prefill "
            "server) instead of being computed here. Falling to 0 on a decode server: transfers "
            "fail and it prefills itself.",
        ),
        series(
            g,
            "NIXL transfer time p95",
            [("nixl_transfer_time_p95", "{{model_name}}")],
            w=12,
            description="Duration of a KV transfer over NIXL, 95th percentile. It adds to the "
            "TTFT of every request that waits for one; hundreds of ms point at the network.",
        ),
        series(
            g,
            "KV loads failing",
            [("kv_transfer_failure_share", "{{model_name}}")],
            w=12,
            description="Share of the KV loads from the prefill instances that failed "
            "(kv-transfer-failures). Under vLLM's default kv_load_failure_policy each is a "
            "request that ends with an error; above 2% for 10 minutes is an alert.",
        ),
        series(
            g,
            "NIXL failed transfers / s",
            [("nixl_failed_transfers_rate", "{{model_name}}")],
            w=12,
            description="Failed KV transfers (handshakes and notifications included). Any "
            "sustained rate fails requests or makes the decode side prefill them again.",
        ),
        series(
            g,
            "Waiting for KV from other instances",
            [("kv_fetch_waiting_by_stage", "{{stage}} {{model_name}}")],
            w=12,
            description="Waiting requests by stage of their KV load: waiting_to_start, "
            "in_progress, completed_waiting. A growing waiting_to_start is a transfer backlog.",
        ),
    ]


def lora_info_query(g: Board) -> str:
    """Each server's current ``vllm:lora_requests_info``: the series with the latest time
    (vLLM keeps every list of adapters it has seen, frozen at the time it was last current)."""
    info = ", ".join(m for m in g.fleet if not m.startswith("model_name"))
    return f"topk by (job, instance) (1, vllm:lora_requests_info{{{info}}})"


def lora(g: Board) -> list[object]:
    return [
        series(
            g,
            "Waiting behind full adapter slots",
            [("lora_slot_waits", "{{model_name}}")],
            w=12,
            description="Share of the time requests waited while every LoRA adapter slot "
            "(--max-loras) was taken, averaged over the model's servers "
            "(lora-adapter-slots). Requests skipped for their adapter count as deferred in "
            "Waiting by reason.",
        ),
        table(
            g,
            "Adapters in use (vllm:lora_requests_info)",
            [table_target(lora_info_query(g))],
            description=g.describe(
                "One row per server: max_lora (--max-loras) and the adapters with requests in "
                "the engine. vLLM fills running_lora_adapters and waiting_lora_adapters with "
                "the same list, and a request joins it with its first token, so an adapter "
                "whose requests all wait for a slot is not listed: a list as long as max_lora "
                "is full slots. vLLM only: SGLang counts its adapter slots in "
                "sglang:lora_pool_slots_used and sglang:lora_pool_slots_total.",
                ("vllm:lora_requests_info",),
            ),
            transformations=[
                {
                    "id": "organize",
                    "options": {
                        "excludeByName": {
                            "Time": True,
                            "Value": True,
                            "__name__": True,
                            "waiting_lora_adapters": True,
                        }
                    },
                }
            ],
        ),
    ]


def build(site: Site) -> Dashboard:
    g = Board(site)
    panels: list[object] = [g.row("KV cache")]
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
            per_instance=True,
            description="KV-cache blocks in use (0-1) per instance, the fullest engine. Near 1 "
            "new requests wait for room and running ones are preempted.",
        ),
        series(g, "Preemptions / s", [("preemptions_rate", "{{model_name}}")]),
        series(
            g,
            "Prefix cache hit rate",
            [("prefix_cache_hit_rate", "{{model_name}}")],
            description="Share of prompt tokens served from the prefix cache instead of "
            "computed. A drop with the same traffic is a changed system prompt or template, "
            "or a cache too small to keep shared prefixes: prefill work and TTFT go up.",
        ),
    ]
    panels.append(
        series(
            g,
            "Prompt tokens by source (vLLM >= 0.16)",
            [("prompt_tokens_by_source_rate", "{{source}}")],
            w=12,
            description="Where each prompt token's KV came from: computed here (local_compute), "
            "the prefix cache (local_cache_hit) or another instance (external_kv_transfer). "
            "local_compute jumping while the total holds is a prefix cache that stopped "
            "hitting (prefix-cache-collapse).",
        )
    )
    panels.append(
        series(
            g,
            "Prefix-cache hits by tier (vLLM >= 0.32)",
            [("prefix_hits_by_tier_rate", "{{source}}")],
            w=12,
            description="Prefix-cache hit tokens per second by the tier that held them: "
            "device (GPU memory), host and disk (a KV offloading connector), p2p (another "
            "instance). Hits moving from device to host are a GPU cache too small for the "
            "shared prefixes; hits that vanish from every tier are prefix-cache-collapse.",
        )
    )
    panels.append(g.row("Batching"))
    panels += [
        series(
            g,
            "Running and waiting",
            [("requests_running", "running"), ("requests_waiting", "waiting")],
        ),
        series(
            g,
            "Requests in the engine by instance",
            [
                ("requests_running", "running {{instance}}"),
                ("requests_waiting", "waiting {{instance}}"),
            ],
            per_instance=True,
            description="Each replica's running batch and queue. One replica full and queueing "
            "while the others run half empty is the router's doing (replica-imbalance).",
        ),
        series(
            g,
            "Replica load imbalance",
            [("load_imbalance", "{{model_name}}")],
            description="The busiest replica's requests in the engine (running plus waiting, "
            "over the rate window) over the mean replica's: 1 is an even spread, the number of "
            "replicas is one taking all. Above 1.5 for a quarter of an hour is an alert.",
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
            "Stalled engines",
            [("stalled_engines", "{{instance}}")],
            per_instance=True,
            description="Engines holding running requests that produced no token over the "
            "rate window: hung, not idle (engine-hang). Any value above 0 for minutes means "
            "requests on that server get nothing.",
        ),
        series(
            g,
            "Waiting by reason (vLLM >= 0.20)",
            [("requests_waiting_by_reason", "{{reason}}")],
            description="capacity: no free slot or KV room; deferred: skipped by the "
            "scheduler (a LoRA adapter slot, a KV transfer, a grammar being compiled). A "
            "standing capacity queue is the engine full; a standing deferred queue on a LoRA "
            "server is adapters waiting for a slot (lora-adapter-slots).",
        ),
    ]
    panels.append(g.row("Configuration"))
    panels.append(
        table(
            g,
            "Cache configuration (vllm:cache_config_info)",
            [table_target(cache_config_query(g))],
            description=g.describe(
                "One row per engine: block size, KV dtype, memory share, and KV capacity "
                "(kv_cache_size_tokens, vLLM >= 0.24; num_gpu_blocks is summed over a server's "
                "data-parallel engines). Engines of one model that differ here are a partial "
                "rollout. vLLM only: SGLang exports its KV capacity as "
                "sglang:max_total_num_tokens.",
                (F.CACHE_CONFIG.name, "vllm:num_requests_running"),
            ),
            transformations=[
                {"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}
            ],
        )
    )
    panels.append(g.collapsed_row("LoRA adapters (with --enable-lora)", lambda: lora(g)))
    panels.append(
        g.collapsed_row("KV offloading (with a KV offloading connector)", lambda: kv_offload(g))
    )
    panels.append(
        g.collapsed_row(
            "KV transfer between instances (disaggregated prefill)", lambda: kv_transfer(g)
        )
    )
    return dashboard(
        site,
        "KV cache and batching",
        UID,
        "KV usage, preemptions, prefix caching, running against waiting, output batches, long "
        "prefills; KV offloading and transfer where configured.",
        panels,
    )
