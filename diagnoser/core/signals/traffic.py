"""Traffic and outcome signals: finished requests by reason, tokens in and out, lengths."""

from __future__ import annotations

from diagnoser.core import families_sglang as SG
from diagnoser.core import promql as q
from diagnoser.core import promql_series as rs
from diagnoser.core import promql_sglang as sg
from diagnoser.core.signals.base import Signal
from diagnoser.core.signals.names import (
    GENERATION,
    GENERATION_TOKENS,
    MAX_TOKENS,
    PROMPT,
    PROMPT_TOKENS,
    SUCCESS,
)

REQUEST_RATE = q.counter_rate(SUCCESS)
_NTH = {50: "median", 95: "95th percentile", 99: "99th percentile"}
SGLANG_REQUEST_RATE = sg.counter_rate(SG.REQUESTS)
NO_FINISH_REASON = "SGLang exports no finished_reason (it counts only aborts apart)"


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "request_rate",
            "req/s",
            "Finished requests per second, every finish reason.",
            REQUEST_RATE,
            ("vllm_request_success", "rate"),
            sglang=SGLANG_REQUEST_RATE,
        ),
        s(
            "finished_rate_by_reason",
            "req/s",
            "Finished requests per second by finished_reason.",
            q.counter_rate_by(SUCCESS, "finished_reason"),
            ("vllm_request_success_by_reason", "rate"),
            sglang_gap=NO_FINISH_REASON,
        ),
        s(
            "finished_share_by_reason",
            "ratio",
            "Share of finished requests by finished_reason.",
            q.share_by(SUCCESS, "finished_reason"),
            ("vllm_request_success_by_reason", "share"),
            sglang_gap=NO_FINISH_REASON,
        ),
        s(
            "finished_length_share",
            "ratio",
            'Share of requests that stopped at max_tokens (finished_reason="length").',
            q.share_of(SUCCESS, ('finished_reason="length"',), zero_if_absent=True),
            ("vllm_request_success_length", "share"),
            sglang_gap=NO_FINISH_REASON + ", so answers cut at max_tokens are not told apart",
        ),
        s(
            "finished_error_share",
            "ratio",
            "Share of requests that finished with an engine error (vLLM >= 0.14; 0 before).",
            q.share_of(SUCCESS, ('finished_reason="error"',), zero_if_absent=True),
            ("vllm_request_success_error", "share"),
            sglang_gap=NO_FINISH_REASON + ", so engine errors show only as HTTP 5xx",
        ),
        s(
            "finished_abort_share",
            "ratio",
            'Share of requests aborted (finished_reason="abort": the engine dropped them, or '
            "the client went away; 0 where vLLM does not count aborts). SGLang: "
            "sglang:num_aborted_requests_total over its finished requests.",
            q.share_of(SUCCESS, ('finished_reason="abort"',), zero_if_absent=True),
            ("vllm_request_success_abort", "share"),
            sglang=q.ratio(sg.or_zero(sg.counter_rate(SG.ABORTED)), SGLANG_REQUEST_RATE),
        ),
        s(
            "prompt_tokens_rate",
            "tokens/s",
            "Prompt tokens per second (cached ones included; SGLang counts them as each "
            "request finishes).",
            q.counter_rate(PROMPT_TOKENS),
            ("vllm_prompt_tokens", "rate"),
            sglang=sg.counter_rate(SG.PROMPT_TOKENS),
        ),
        s(
            "generation_tokens_rate",
            "tokens/s",
            "Generated tokens per second (SGLang counts them as each request finishes).",
            q.counter_rate(GENERATION_TOKENS),
            ("vllm_generation_tokens", "rate"),
            sglang=sg.counter_rate(SG.GENERATION_TOKENS),
        ),
        s(
            "prompt_tokens_per_request",
            "tokens",
            "Prompt tokens per finished request, mean.",
            q.hist_mean(PROMPT),
            ("vllm_request_prompt_tokens", "mean"),
            sglang=sg.hist_mean(SG.PROMPT),
        ),
        s(
            "prompt_tokens_p50",
            "tokens",
            "Prompt tokens per request, median.",
            q.quantile(0.5, PROMPT),
            ("vllm_request_prompt_tokens", "p50"),
            sglang=sg.quantile(0.5, SG.PROMPT),
            ceiling="prompt_tokens_top_bound",
        ),
        s(
            "prompt_tokens_p95",
            "tokens",
            "Prompt tokens per request, 95th percentile.",
            q.quantile(0.95, PROMPT),
            ("vllm_request_prompt_tokens", "p95"),
            sglang=sg.quantile(0.95, SG.PROMPT),
            ceiling="prompt_tokens_top_bound",
        ),
        s(
            "prompt_tokens_p99",
            "tokens",
            "Prompt tokens per request, 99th percentile.",
            q.quantile(0.99, PROMPT),
            ("vllm_request_prompt_tokens", "p99"),
            sglang=sg.quantile(0.99, SG.PROMPT),
            ceiling="prompt_tokens_top_bound",
        ),
        s(
            "generation_tokens_per_request",
            "tokens",
            "Output tokens per finished request, mean.",
            q.hist_mean(GENERATION),
            ("vllm_request_generation_tokens", "mean"),
            sglang=sg.hist_mean(SG.GENERATION),
        ),
        *(
            s(
                f"generation_tokens_p{p}",
                "tokens",
                f"Output tokens per finished request, {_NTH[p]}.",
                q.quantile(p / 100, GENERATION),
                ("vllm_request_generation_tokens", f"p{p}"),
                sglang=sg.quantile(p / 100, SG.GENERATION),
                ceiling="generation_tokens_top_bound",
            )
            for p in (50, 95, 99)
        ),
        s(
            "prompt_tokens_top_bound",
            "tokens",
            "The top finite bound of the server's prompt-token buckets (vLLM's end at its "
            "max_model_len: 1, 2, 5, 10, ... up to it): a quantile at it is a lower bound.",
            rs.top_bound(PROMPT),
            ("vllm_request_prompt_tokens", "top_bound"),
            sglang=sg.top_bound(SG.PROMPT),
        ),
        s(
            "generation_tokens_top_bound",
            "tokens",
            "The top finite bound of the server's output-token buckets: a quantile at it is a "
            "lower bound.",
            rs.top_bound(GENERATION),
            ("vllm_request_generation_tokens", "top_bound"),
            sglang=sg.top_bound(SG.GENERATION),
        ),
        s(
            "max_tokens_per_request",
            "tokens",
            "The max_tokens requests asked for, mean.",
            q.hist_mean(MAX_TOKENS),
            ("vllm_request_params_max_tokens", "mean"),
            sglang_gap="SGLang exports no histogram of the max_tokens requests ask for",
        ),
    ]
