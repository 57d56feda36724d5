"""Scheduler and KV-cache signals: the running batch, the queue, KV use, preemptions and
engine steps."""

from __future__ import annotations

from diagnoser.core import families_sglang as SG
from diagnoser.core import promql as q
from diagnoser.core import promql_sglang as sg
from diagnoser.core.buckets import le_label
from diagnoser.core.signals.base import Signal
from diagnoser.core.signals.names import (
    GENERATION_TOKENS,
    KV_USAGE,
    PREEMPTIONS,
    PREFILL_COMPUTED,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT,
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    RUNNING,
    STEP_TOKENS,
    WAITING,
    WAITING_BY_REASON,
)
from diagnoser.core.signals.traffic import REQUEST_RATE, SGLANG_REQUEST_RATE

# A prompt this long is a long prefill: the 1-2-5 token buckets' first bound above 4096 (and a
# bound of SGLang's token buckets).
LONG_PREFILL = le_label(5000)
# Retractions are SGLang's preemptions: a running request's KV freed, to be recomputed.
SGLANG_RETRACTIONS = sg.or_zero(sg.counter_rate(SG.RETRACTIONS))
NO_STEP_TOKENS = "SGLang exports no histogram of tokens per engine step"


def _load_imbalance(running: str, waiting: str) -> q.Expr:
    """The busiest server's load over the mean server's, per model: each server's requests
    in the engine (running plus waiting), averaged over the rate window so that a burst is
    not taken for a router's preference."""

    def build(scope: q.Scope) -> str:
        w = scope.window
        each = (
            f"avg_over_time({q.selector(running, scope.matchers)}[{w}]) "
            f"+ avg_over_time({q.selector(waiting, scope.matchers)}[{w}])"
        )
        keys = [k for k in ("job", "instance") if k not in scope.by]
        per_server = q.agg("sum", scope, each, *keys)
        return f"{q.agg('max', scope, per_server)} / ({q.agg('avg', scope, per_server)} > 0)"

    return build


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "load_imbalance",
            "x",
            "The busiest server's requests in the engine (running plus waiting, averaged over "
            "the rate window) over the mean of the model's servers: 1 when the router spreads "
            "the load evenly, the number of servers when one takes it all.",
            _load_imbalance(RUNNING, WAITING),
            ("vllm_server_load_imbalance", "ratio"),
            sglang=_load_imbalance(SG.RUNNING.name, SG.WAITING.name),
        ),
        s(
            "engines",
            "engines",
            "Engines reporting (one per data-parallel rank of each server), counted now.",
            q.gauge("count", RUNNING),
            ("vllm_engines", "count"),
            sglang=sg.gauge("count", SG.RUNNING),
        ),
        s(
            "requests_running",
            "requests",
            "Requests in the running batch, summed over engines.",
            q.gauge("sum", RUNNING),
            ("vllm_num_requests_running", "sum"),
            per_instance=True,
            sglang=sg.gauge("sum", SG.RUNNING),
        ),
        s(
            "requests_waiting",
            "requests",
            "Requests waiting to be scheduled.",
            q.gauge("sum", WAITING),
            ("vllm_num_requests_waiting", "sum"),
            per_instance=True,
            sglang=sg.gauge("sum", SG.WAITING),
        ),
        s(
            "requests_waiting_by_reason",
            "requests",
            "Waiting requests by reason: capacity or deferred (vLLM >= 0.20).",
            q.gauge_by("sum", WAITING_BY_REASON, "reason"),
            ("vllm_num_requests_waiting_by_reason", "sum"),
            sglang_gap="SGLang does not say why a request waits",
        ),
        s(
            "kv_cache_usage",
            "ratio",
            "KV-cache blocks in use (0-1), the fullest engine (SGLang: sglang:token_usage, "
            "the fullest of its token pools).",
            q.gauge("max", *KV_USAGE),
            ("vllm_kv_cache_usage", "max"),
            per_instance=True,
            sglang=sg.gauge("max", SG.TOKEN_USAGE),
        ),
        s(
            "stalled_engines",
            "engines",
            "Engines holding running requests that produced no token in the last two minutes "
            "(or the rate window, if shorter): vllm:num_requests_running above 0, "
            "vllm:generation_tokens_total flat; SGLang: sglang:num_running_reqs and "
            "sglang:realtime_tokens_total. Hung, not idle. An engine whose counter has too few "
            "samples for a rate (just started) is not judged.",
            q.stalled(
                lambda scope: q.selector(RUNNING, scope.matchers),
                lambda scope: (
                    f"rate({q.selector(GENERATION_TOKENS, scope.matchers)}[{scope.window}])"
                ),
            ),
            ("vllm_engines_stalled", "count"),
            per_instance=True,
            sglang=sg.stalled(),
        ),
        s(
            "preemptions_rate",
            "1/s",
            "Preemptions per second (preempted requests recompute); SGLang's retractions.",
            q.counter_rate(PREEMPTIONS),
            ("vllm_num_preemptions", "rate"),
            sglang=SGLANG_RETRACTIONS,
        ),
        s(
            "preemptions_per_request",
            "ratio",
            "Preemptions per finished request.",
            q.ratio(q.counter_rate(PREEMPTIONS), REQUEST_RATE),
            ("vllm_num_preemptions_per_request", "ratio"),
            sglang=q.ratio(SGLANG_RETRACTIONS, SGLANG_REQUEST_RATE),
        ),
        s(
            "output_batch_tokens_mean",
            "tokens",
            "Tokens per engine output batch, mean: the tokens generated in it plus the prompts "
            "of the requests whose first token it carries, uncached tokens only from vLLM 0.23 "
            "(vllm:iteration_tokens_total). Not a step's size: a chunked prompt counts once, "
            "whole, in the batch that ends its prefill; steps with no output are not counted.",
            q.hist_mean(STEP_TOKENS),
            ("vllm_iteration_tokens", "mean"),
            sglang_gap=NO_STEP_TOKENS,
        ),
        s(
            "output_batch_tokens_p99",
            "tokens",
            "Tokens per engine output batch, 99th percentile (16384 means more).",
            q.quantile(0.99, STEP_TOKENS),
            ("vllm_iteration_tokens", "p99"),
            sglang_gap=NO_STEP_TOKENS,
        ),
        s(
            "output_batches_rate",
            "1/s",
            "Engine steps per second that produced output (one observation each).",
            q.hist_rate(STEP_TOKENS),
            ("vllm_iteration_steps", "rate"),
            sglang_gap=NO_STEP_TOKENS,
        ),
        s(
            "long_prefills_rate",
            "1/s",
            "Requests per second whose prefill computed more than 5000 prompt tokens, cached "
            "ones excluded (vllm:request_prefill_kv_computed_tokens, vLLM >= 0.13; before, "
            "the prompt length; SGLang: sglang:uncached_prompt_tokens_histogram). Observed as "
            "each finishes.",
            q.either(
                q.rate_above(PREFILL_COMPUTED, LONG_PREFILL),
                q.rate_above(PROMPT, LONG_PREFILL),
            ),
            ("vllm_request_prefill_computed_over_5000", "rate"),
            sglang=sg.rate_above(SG.PROMPT_UNCACHED, LONG_PREFILL),
        ),
        s(
            "prompt_tokens_computed_rate",
            "tokens/s",
            "Prompt tokens prefilled per second, prefix-cache hits excluded "
            "(vllm:prompt_tokens_by_source_total, vLLM >= 0.16; before, all prompt tokens; "
            "SGLang: sglang:uncached_prompt_tokens_histogram's sum, as requests finish).",
            q.either(
                q.counter_rate(PROMPT_TOKENS_BY_SOURCE, extra=('source="local_compute"',)),
                q.counter_rate(PROMPT_TOKENS),
            ),
            ("vllm_prompt_tokens_computed", "rate"),
            sglang=sg.hist_sum_rate(SG.PROMPT_UNCACHED),
        ),
        s(
            "prompt_tokens_by_source_rate",
            "tokens/s",
            "Prompt tokens per second by where their KV came from: local_compute (prefilled), "
            "local_cache_hit (the prefix cache), external_kv_transfer (another instance, "
            "disaggregated prefill); vllm:prompt_tokens_by_source_total, vLLM >= 0.16.",
            q.counter_rate_by(PROMPT_TOKENS_BY_SOURCE, "source"),
            ("vllm_prompt_tokens_by_source", "rate"),
            sglang_gap="SGLang counts cached prompt tokens, not tokens by source",
        ),
        s(
            "prefix_cache_hit_rate",
            "ratio",
            "Share of prompt tokens served from the prefix cache.",
            q.ratio(q.counter_rate(*PREFIX_HITS), q.counter_rate(*PREFIX_QUERIES)),
            ("vllm_prefix_cache_hit", "ratio"),
            sglang=q.ratio(
                sg.or_zero(sg.counter_rate(SG.CACHED_TOKENS)), sg.counter_rate(SG.PROMPT_TOKENS)
            ),
        ),
    ]
