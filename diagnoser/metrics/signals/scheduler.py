"""Scheduler and KV-cache signals: the running batch, the queue, KV use, preemptions and
engine steps."""

from __future__ import annotations

from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_series as rs
from diagnoser.metrics import promql_sglang as sg
from diagnoser.metrics import sides as sd
from diagnoser.metrics.buckets import le_label
from diagnoser.metrics.engines import Gap
from diagnoser.metrics.promql_progress import stalled
from diagnoser.metrics.signals.base import Signal, StandIn, on
from diagnoser.metrics.signals.traffic import REQUEST_RATE, SGLANG_REQUEST_RATE

# A prompt this long is a long prefill: the 1-2-5 token buckets' first bound above 4096 (and a
# bound of SGLang's token buckets). vLLM's token buckets end at its max_model_len (1, 2, 5,
# ... up to it), so a server with a max_model_len under 5000 has no 5000 bound: there the
# bound it has below, 2000 (a max_model_len of 2000-4999 tokens), is the threshold read.
LONG_PREFILL = le_label(5000)
LONG_PREFILL_BOUNDS = (LONG_PREFILL, le_label(2000))
# Retractions are SGLang's preemptions: a running request's KV freed, to be recomputed.
SGLANG_RETRACTIONS = sg.or_zero(sg.counter_rate(SG.RETRACTIONS))
# vLLM's preemption counter, 0 where the model's finished requests are counted: a counter is
# born at its first increment where the exporter creates no child ahead of it (vLLM 0.8).
PREEMPTION_RATE = rs.zero_where(q.counter_rate(F.PREEMPTIONS.name), REQUEST_RATE)
# Without the uncached-prompt histogram (SGLang at its defaults), the long prefills are read
# from the prefill chunks of prompts longer than one forward pass takes.
CHUNKS_FOR_LONG_PREFILLS = StandIn(
    "chunked_prefills_rate",
    "prefill chunks per second of prompts longer than --chunked-prefill-size, not requests "
    "over 5000 tokens: the server exports no uncached-prompt histogram (SGLang without "
    "--collect-tokens-histogram)",
)
NO_STEP_TOKENS = "SGLang exports no histogram of tokens per engine step"


def _load_imbalance(running: str, waiting: str) -> q.Expr:
    """The busiest server's load over the mean server's, per model: each server's requests
    in the engine (running plus waiting), averaged over the rate window so that a burst is
    not taken for a router's preference."""

    def build(scope: q.Scope) -> str:
        w = scope.window
        each = q.kept(
            scope,
            f"avg_over_time({q.selector(running, scope.matchers)}[{w}]) "
            f"+ avg_over_time({q.selector(waiting, scope.matchers)}[{w}])",
        )
        keys = [k for k in ("job", "instance") if k not in scope.by]
        per_server = q.agg("sum", scope, each, *keys)
        return f"{q.agg('max', scope, per_server)} / ({q.agg('avg', scope, per_server)} > 0)"

    return build


# Adapter slots are judged up to this --max-loras (a regex per value: PromQL cannot count
# the names in a label); a server with more slots gives no series.
MAX_LORAS_JUDGED = 16


def _lora_slot_waits() -> q.Expr:
    """Per model, the share of its servers' time (over the rate window) in which requests
    waited while all their adapter slots were taken.

    vLLM sets ``lora_requests_info`` to the time of its latest stats, under labels that list
    the adapters with requests in the engine (a list keeps its series, frozen at the time it
    was last current), so the series with the highest value is the current list. Both
    adapter labels list the same adapters (``LoRARequestStates`` keeps one entry per adapter
    with any live request, and a request's QUEUED event reaches it only with its first
    output), so the labels show the adapters *in use*, never the ones whose requests wait for
    a slot: the slots are full when the list holds ``max_lora`` names, and a request the
    scheduler skipped then (``num_requests_waiting_by_reason{reason="deferred"}``, vLLM 0.20
    and later; before it, any waiting request) is waiting for one. Lists change by the
    second, so the share is taken over a subquery at the server's evaluation interval (coarser
    over windows longer than an hour: ``promql.subquery_range``)."""

    def inner(matchers: tuple[str, ...], window: str, keep: tuple[str, ...]) -> str:
        by = ", ".join(("job", "instance", *keep))
        latest = f"topk by ({by}) (1, {q.selector(F.LORA_INFO.name, matchers)})"
        full = " or ".join(
            q.selector(
                F.LORA_INFO.name,
                matchers,
                f'max_lora="{k}"',
                'running_lora_adapters=~"[^,]+' + (f'(,[^,]+){{{k - 1}}}"' if k > 1 else '"'),
            )
            for k in range(1, MAX_LORAS_JUDGED + 1)
        )
        # Deferred: skipped by the scheduler (an adapter slot among the reasons; vLLM >= 0.20),
        # else every waiting request.
        deferred = q.selector(F.WAITING_BY_REASON.name, matchers, 'reason="deferred"')
        every = q.selector(F.WAITING.name, matchers)
        waiting = f"(sum by ({by}) ({deferred}) or sum by ({by}) ({every})) > 0"
        now = (
            f"(count by ({by}) ({latest} and ({full})) and on ({by}) ({waiting}))"
            f" or (count by ({by}) ({latest}) * 0)"
        )
        return f"avg_over_time(({now}){q.subquery_range(window)})"

    return q.on_targets(inner, fn="avg")


def _sglang_lora_slot_waits(scope: q.Scope) -> str:
    """SGLang's own count of the adapter slots in use (the distinct adapters of the running
    batch over --max-loras-per-batch) at 1, while requests are queued: the same share."""
    per_server = scope.with_by(*dict.fromkeys((*scope.by, "job", "instance")))
    keys = ", ".join(per_server.by)
    full = sg.gauge("max", SG.LORA_UTILIZATION)(per_server)
    queued = sg.gauge("sum", SG.WAITING)(per_server)
    both = f"({full} >= bool 1) * on ({keys}) ({queued} > bool 0)"
    return q.agg("avg", scope, f"avg_over_time(({both}){q.subquery_range(scope.window)})")


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "load_imbalance",
            "x",
            "The busiest server's requests in the engine (running plus waiting, averaged over "
            "the rate window) over the mean of the model's servers: 1 when the router spreads "
            "the load evenly, the number of servers when one takes it all. A disaggregated "
            "deployment's prefill and decode servers are compared within their side, the "
            "larger of the two.",
            on(
                vllm=sd.within_each_side(_load_imbalance(F.RUNNING.name, F.WAITING.name)),
                sglang=_load_imbalance(SG.RUNNING.name, SG.WAITING.name),
            ),
            ("vllm_server_load_imbalance", "ratio"),
        ),
        s(
            "lora_slot_waits",
            "ratio",
            "Share of the time (over the rate window, averaged over the model's servers) in "
            "which requests waited while all LoRA adapter slots were taken (as many adapters "
            "with requests in the engine as --max-loras); no series without --enable-lora, or "
            f"with --max-loras above {MAX_LORAS_JUDGED}.",
            on(vllm=_lora_slot_waits(), sglang=_sglang_lora_slot_waits),
            ("vllm_lora_slot_waits", "ratio"),
            optional=(F.WAITING_BY_REASON.name,),
        ),
        s(
            "engines",
            "engines",
            "Engines reporting (one per data-parallel rank of each server), counted now.",
            on(vllm=q.gauge("count", F.RUNNING.name), sglang=sg.gauge("count", SG.RUNNING)),
            ("vllm_engines", "count"),
        ),
        s(
            "requests_running",
            "requests",
            "Requests in the running batch, summed over engines.",
            on(vllm=q.gauge("sum", F.RUNNING.name), sglang=sg.gauge("sum", SG.RUNNING)),
            ("vllm_num_requests_running", "sum"),
            per_instance=True,
        ),
        s(
            "requests_waiting",
            "requests",
            "Requests waiting to be scheduled.",
            on(vllm=q.gauge("sum", F.WAITING.name), sglang=sg.gauge("sum", SG.WAITING)),
            ("vllm_num_requests_waiting", "sum"),
            per_instance=True,
        ),
        s(
            "requests_waiting_by_reason",
            "requests",
            "Waiting requests by reason: capacity or deferred (vLLM >= 0.20).",
            on(
                vllm=q.gauge_by("sum", F.WAITING_BY_REASON.name, "reason"),
                sglang=Gap("SGLang does not say why a request waits"),
            ),
            ("vllm_num_requests_waiting_by_reason", "sum"),
        ),
        s(
            "kv_cache_usage",
            "ratio",
            "KV-cache blocks in use (0-1), the fullest engine (SGLang: sglang:token_usage, "
            "the fullest of its token pools).",
            on(vllm=q.gauge("max", *F.KV_USAGE_NAMES), sglang=sg.gauge("max", SG.TOKEN_USAGE)),
            ("vllm_kv_cache_usage", "max"),
            per_instance=True,
        ),
        s(
            "stalled_engines",
            "engines",
            "Engines holding running requests that produced no token in the last two minutes "
            "(or the rate window, if shorter): vllm:num_requests_running above 0, "
            "vllm:generation_tokens_total flat; SGLang: sglang:num_running_reqs and "
            "sglang:realtime_tokens_total. Hung, not idle. An engine whose counter has too few "
            "samples for a rate (just started) is not judged.",
            on(
                vllm=stalled(
                    lambda scope: q.selector(F.RUNNING.name, scope.matchers),
                    lambda scope: (
                        f"rate({q.selector(F.GENERATION_TOKENS.name, scope.matchers)}"
                        f"[{scope.window}])"
                    ),
                ),
                sglang=sg.stalled(),
            ),
            ("vllm_engines_stalled", "count"),
            per_instance=True,
        ),
        s(
            "preemptions_rate",
            "1/s",
            "Preemptions per second (preempted requests recompute); SGLang's retractions.",
            on(vllm=PREEMPTION_RATE, sglang=SGLANG_RETRACTIONS),
            ("vllm_num_preemptions", "rate"),
        ),
        s(
            "preemptions_per_request",
            "ratio",
            "Preemptions per finished request.",
            on(
                vllm=q.ratio(PREEMPTION_RATE, REQUEST_RATE),
                sglang=q.ratio(SGLANG_RETRACTIONS, SGLANG_REQUEST_RATE),
            ),
            ("vllm_num_preemptions_per_request", "ratio"),
        ),
        s(
            "output_batch_tokens_mean",
            "tokens",
            "Tokens per engine output batch, mean: the tokens generated in it plus the prompts "
            "of the requests whose first token it carries, uncached tokens only from vLLM 0.23 "
            "(vllm:iteration_tokens_total). Not a step's size: a chunked prompt counts once, "
            "whole, in the batch that ends its prefill; steps with no output are not counted.",
            on(vllm=q.hist_mean(F.STEP_TOKENS.name), sglang=Gap(NO_STEP_TOKENS)),
            ("vllm_iteration_tokens", "mean"),
        ),
        s(
            "output_batch_tokens_p99",
            "tokens",
            "Tokens per engine output batch, 99th percentile (16384 means more).",
            on(vllm=q.quantile(0.99, F.STEP_TOKENS.name), sglang=Gap(NO_STEP_TOKENS)),
            ("vllm_iteration_tokens", "p99"),
        ),
        s(
            "output_batches_rate",
            "1/s",
            "Engine steps per second that produced output (one observation each).",
            on(vllm=q.hist_rate(F.STEP_TOKENS.name), sglang=Gap(NO_STEP_TOKENS)),
            ("vllm_iteration_steps", "rate"),
        ),
        s(
            "long_prefills_rate",
            "1/s",
            "Requests per second whose prefill computed more than 5000 prompt tokens, cached "
            "ones excluded (vllm:request_prefill_kv_computed_tokens, vLLM >= 0.13; before, "
            "the prompt length; SGLang: sglang:uncached_prompt_tokens_histogram). Observed as "
            "each finishes. The bound is read from the server's buckets: where they end below "
            "5000 (a max_model_len under 5000), more than 2000.",
            on(
                vllm=q.either(
                    *(rs.rate_above(F.PREFILL_COMPUTED.name, le) for le in LONG_PREFILL_BOUNDS),
                    *(rs.rate_above(F.PROMPT.name, le) for le in LONG_PREFILL_BOUNDS),
                ),
                sglang=sg.rate_above(SG.PROMPT_UNCACHED, LONG_PREFILL),
            ),
            ("vllm_request_prefill_computed_over_5000", "rate"),
            stand_in={"sglang": CHUNKS_FOR_LONG_PREFILLS},
        ),
        s(
            "chunked_prefills_rate",
            "1/s",
            "Prefill chunks per second that ended with more of their prompt to come "
            '(sglang:per_stage_req_latency_seconds{stage="chunked_prefill"}): prompts longer '
            "than --chunked-prefill-size, prefilled over several forward passes, at least one "
            "per such request. Observed as each chunk ends.",
            on(
                vllm=Gap("vLLM does not observe a prompt's prefill chunks apart"),
                sglang=sg.or_zero(sg.hist_rate(SG.STAGE, ('stage="chunked_prefill"',))),
            ),
            ("sglang_chunked_prefills", "rate"),
        ),
        s(
            "prompt_tokens_computed_rate",
            "tokens/s",
            "Prompt tokens prefilled per second, prefix-cache hits excluded "
            "(vllm:prompt_tokens_by_source_total, vLLM >= 0.16; before, all prompt tokens; "
            'SGLang: sglang:prefill_effective_tokens_total{mode="input"}, as each prefill '
            "chunk runs, retraction replays excluded; else the uncached prompt histogram's "
            "sum, as requests finish).",
            on(
                vllm=q.either(
                    q.counter_rate(
                        F.PROMPT_TOKENS_BY_SOURCE.name, extra=('source="local_compute"',)
                    ),
                    q.counter_rate(F.PROMPT_TOKENS.name),
                ),
                sglang=q.either(
                    sg.counter_rate(SG.PREFILL_EFFECTIVE_TOKENS, ('mode="input"',)),
                    sg.hist_sum_rate(SG.PROMPT_UNCACHED),
                ),
            ),
            ("vllm_prompt_tokens_computed", "rate"),
        ),
        s(
            "prompt_tokens_by_source_rate",
            "tokens/s",
            "Prompt tokens per second by where their KV came from: local_compute (prefilled), "
            "local_cache_hit (the prefix cache), external_kv_transfer (another instance, "
            "disaggregated prefill); vllm:prompt_tokens_by_source_total, vLLM >= 0.16.",
            on(
                vllm=q.counter_rate_by(F.PROMPT_TOKENS_BY_SOURCE.name, "source"),
                sglang=Gap("SGLang counts cached prompt tokens, not tokens by source"),
            ),
            ("vllm_prompt_tokens_by_source", "rate"),
        ),
        s(
            "prefix_hits_by_tier_rate",
            "tokens/s",
            "Prefix-cache hit tokens per second by the tier that held them: device (GPU "
            "memory), host (offloaded to CPU memory), disk, p2p (another vLLM instance), "
            "external_unspecified; vllm:prompt_tokens_cached_by_source_total, vLLM >= 0.32.",
            on(
                vllm=q.counter_rate_by(F.PROMPT_TOKENS_CACHED_BY_SOURCE.name, "source"),
                sglang=Gap("SGLang counts cached prompt tokens, not hits by tier"),
            ),
            ("vllm_prompt_tokens_cached_by_source", "rate"),
        ),
        s(
            "prefix_cache_hit_rate",
            "ratio",
            "Share of prompt tokens served from the prefix cache.",
            on(
                vllm=q.ratio(
                    q.counter_rate(*F.PREFIX_HITS_NAMES), q.counter_rate(*F.PREFIX_QUERIES_NAMES)
                ),
                sglang=q.ratio(
                    sg.or_zero(sg.counter_rate(SG.CACHED_TOKENS)), sg.counter_rate(SG.PROMPT_TOKENS)
                ),
            ),
            ("vllm_prefix_cache_hit", "ratio"),
        ),
    ]
