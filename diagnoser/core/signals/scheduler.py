"""Scheduler and KV-cache signals: the running batch, the queue, KV use, preemptions and
engine steps."""

from __future__ import annotations

from diagnoser.core import promql as q
from diagnoser.core.signals.base import Signal
from diagnoser.core.signals.names import (
    KV_USAGE,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    RUNNING,
    STEP_TOKENS,
    WAITING,
    WAITING_BY_REASON,
)
from diagnoser.core.signals.traffic import REQUEST_RATE


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "requests_running",
            "requests",
            "Requests in the running batch, summed over engines.",
            q.gauge("sum", RUNNING),
            ("vllm_num_requests_running", "sum"),
            per_instance=True,
        ),
        s(
            "requests_waiting",
            "requests",
            "Requests waiting to be scheduled.",
            q.gauge("sum", WAITING),
            ("vllm_num_requests_waiting", "sum"),
            per_instance=True,
        ),
        s(
            "requests_waiting_by_reason",
            "requests",
            "Waiting requests by reason: capacity or deferred (vLLM >= 0.25).",
            q.gauge_by("sum", WAITING_BY_REASON, "reason"),
            ("vllm_num_requests_waiting_by_reason", "sum"),
        ),
        s(
            "kv_cache_usage",
            "ratio",
            "KV-cache blocks in use (0-1), the fullest engine.",
            q.gauge("max", *KV_USAGE),
            ("vllm_kv_cache_usage", "max"),
            per_instance=True,
        ),
        s(
            "preemptions_rate",
            "1/s",
            "Preemptions per second (preempted requests recompute).",
            q.counter_rate(PREEMPTIONS),
            ("vllm_num_preemptions", "rate"),
        ),
        s(
            "preemptions_per_request",
            "ratio",
            "Preemptions per finished request.",
            q.ratio(q.counter_rate(PREEMPTIONS), REQUEST_RATE),
            ("vllm_num_preemptions_per_request", "ratio"),
        ),
        s(
            "tokens_per_step_mean",
            "tokens",
            "Tokens computed per engine step (prefill plus decode), mean.",
            q.hist_mean(STEP_TOKENS),
            ("vllm_iteration_tokens", "mean"),
        ),
        s(
            "tokens_per_step_p99",
            "tokens",
            "Tokens per engine step, 99th percentile (16384 means a larger step).",
            q.quantile(0.99, STEP_TOKENS),
            ("vllm_iteration_tokens", "p99"),
        ),
        s(
            "large_steps_rate",
            "1/s",
            "Engine steps per second with more than 4096 tokens: whole long prefills in one "
            "step (possible only when --max-num-batched-tokens is above 4096).",
            q.rate_above(STEP_TOKENS, "4096.0"),
            ("vllm_iteration_tokens_over_4096", "rate"),
        ),
        s(
            "engine_steps_rate",
            "1/s",
            "Engine steps per second.",
            q.hist_rate(STEP_TOKENS),
            ("vllm_iteration_steps", "rate"),
        ),
        s(
            "prefix_cache_hit_rate",
            "ratio",
            "Share of prompt tokens served from the prefix cache.",
            q.ratio(q.counter_rate(*PREFIX_HITS), q.counter_rate(*PREFIX_QUERIES)),
            ("vllm_prefix_cache_hit", "ratio"),
        ),
    ]
