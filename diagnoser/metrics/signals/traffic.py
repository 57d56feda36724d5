"""Traffic and outcome signals: finished requests by reason, tokens in and out, lengths."""

from __future__ import annotations

from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_series as rs
from diagnoser.metrics import promql_sglang as sg
from diagnoser.metrics import sides as sd
from diagnoser.metrics.engines import Gap
from diagnoser.metrics.signals.base import Signal, StandIn, on

REQUEST_RATE = q.counter_rate(F.SUCCESS.name)
_NTH = {50: "median", 95: "95th percentile", 99: "99th percentile"}
SGLANG_REQUEST_RATE = sg.counter_rate(SG.REQUESTS)
NO_FINISH_REASON = "SGLang exports no finished_reason (it counts only aborts apart)"
# Prompt tokens as their requests are admitted. vLLM counts a prompt in
# vllm:prompt_tokens_total as its prefill ends, when it observes the TTFT. SGLang adds each
# prefill batch's (each chunk's) fresh and cached tokens to prefill_effective_tokens_total
# (retraction replays excluded; metrics_reporter.py:826-847 of 0.5.23), else to
# realtime_tokens_total (replays included), and observes the queue time once per request at
# its first forward (req_time_stats.py:802-813): both at admission, while its prompt
# histogram and counters wait for the request to finish.
ADMITTED_TOKENS = q.counter_rate(F.PROMPT_TOKENS.name)
ADMISSIONS = q.hist_rate(F.TTFT.name)
SGLANG_ADMITTED_TOKENS = q.either(
    sg.counter_rate(SG.PREFILL_EFFECTIVE_TOKENS),
    sg.counter_rate(SG.REALTIME_TOKENS, ('mode=~"prefill_compute|prefill_cache"',)),
)
SGLANG_ADMISSIONS = sg.hist_rate(SG.QUEUE)
SGLANG_PROMPT_PER_ADMISSION = q.ratio(SGLANG_ADMITTED_TOKENS, SGLANG_ADMISSIONS)
# Output tokens per finished request: the generation histogram's mean where the server has
# it (--collect-tokens-histogram), else the counters' (the same mean, counted at the finish).
SGLANG_GENERATION_MEAN = q.either(
    sg.hist_mean(SG.GENERATION),
    q.ratio(sg.counter_rate(SG.GENERATION_TOKENS), SGLANG_REQUEST_RATE),
)
# Without its prompt histogram (SGLang at its defaults), the typical prompt is estimated from
# the median prefill (latency.py), and the evidence says so. Not the mean prompt per admitted
# request alone: a few huge documents among short chats move the mean, not the median.
MEDIAN_FROM_PREFILL = StandIn(
    "prompt_tokens_p50_from_prefill",
    "the median prompt estimated from the median prefill time, not counted: the server "
    "exports no prompt histogram (SGLang without --collect-tokens-histogram)",
)
# Finish reasons and answers are the decode side's where prefill and decode are disaggregated:
# the prefill side ends every request with "length" after the one token it is asked for.
# (Errors and aborts are counted on both sides: either fails the user's request.)
DECODE_SIDE = (
    "Disaggregated (vLLM): over the decode servers, not the prefill ones, which end "
    'every request with "length" after one token.'
)


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "request_rate",
            "req/s",
            "Finished requests per second, every finish reason.",
            on(vllm=REQUEST_RATE, sglang=SGLANG_REQUEST_RATE),
            ("vllm_request_success", "rate"),
        ),
        s(
            "finished_rate_by_reason",
            "req/s",
            "Finished requests per second by finished_reason.",
            on(
                vllm=sd.on_side("decode", q.counter_rate_by(F.SUCCESS.name, "finished_reason")),
                sglang=Gap(NO_FINISH_REASON),
            ),
            ("vllm_request_success_by_reason", "rate"),
        ),
        s(
            "finished_share_by_reason",
            "ratio",
            "Share of finished requests by finished_reason.",
            on(
                vllm=sd.on_side("decode", q.share_by(F.SUCCESS.name, "finished_reason")),
                sglang=Gap(NO_FINISH_REASON),
            ),
            ("vllm_request_success_by_reason", "share"),
        ),
        s(
            "finished_length_share",
            "ratio",
            'Share of requests that stopped at max_tokens (finished_reason="length"). '
            + DECODE_SIDE,
            on(
                vllm=sd.on_side(
                    "decode",
                    q.share_of(F.SUCCESS.name, ('finished_reason="length"',), zero_if_absent=True),
                ),
                sglang=Gap(NO_FINISH_REASON + ", so answers cut at max_tokens are not told apart"),
            ),
            ("vllm_request_success_length", "share"),
        ),
        s(
            "finished_error_share",
            "ratio",
            "Share of requests that finished with an engine error (vLLM >= 0.14; 0 before).",
            on(
                vllm=q.share_of(F.SUCCESS.name, ('finished_reason="error"',), zero_if_absent=True),
                sglang=Gap(NO_FINISH_REASON + ", so engine errors show only as HTTP 5xx"),
            ),
            ("vllm_request_success_error", "share"),
        ),
        s(
            "finished_abort_share",
            "ratio",
            'Share of requests aborted (finished_reason="abort": the engine dropped them, or '
            "the client went away; 0 where vLLM does not count aborts). SGLang: "
            "sglang:num_aborted_requests_total over its finished requests.",
            on(
                vllm=q.share_of(F.SUCCESS.name, ('finished_reason="abort"',), zero_if_absent=True),
                sglang=q.ratio(sg.or_zero(sg.counter_rate(SG.ABORTED)), SGLANG_REQUEST_RATE),
            ),
            ("vllm_request_success_abort", "share"),
        ),
        s(
            "prompt_tokens_rate",
            "tokens/s",
            "Prompt tokens per second (cached ones included). SGLang: as each prefill chunk "
            "runs (sglang:prefill_effective_tokens_total), since its prompt-token counter "
            "moves only as each request finishes.",
            on(vllm=q.counter_rate(F.PROMPT_TOKENS.name), sglang=SGLANG_ADMITTED_TOKENS),
            ("vllm_prompt_tokens", "rate"),
        ),
        s(
            "generation_tokens_rate",
            "tokens/s",
            "Generated tokens per second (SGLang counts them as each request finishes). "
            + DECODE_SIDE,
            on(
                vllm=sd.on_side("decode", q.counter_rate(F.GENERATION_TOKENS.name)),
                sglang=sg.counter_rate(SG.GENERATION_TOKENS),
            ),
            ("vllm_generation_tokens", "rate"),
        ),
        s(
            "prompt_tokens_per_request",
            "tokens",
            "Prompt tokens per finished request, mean. SGLang: per request admitted (its "
            "prefill tokens over its queue-time observations), since SGLang writes its prompt "
            "histogram only as each request finishes, after the queue has moved.",
            on(vllm=q.hist_mean(F.PROMPT.name), sglang=SGLANG_PROMPT_PER_ADMISSION),
            ("vllm_request_prompt_tokens", "mean"),
        ),
        s(
            "prompt_tokens_admitted_rate",
            "tokens/s",
            "Prompt tokens per second as their requests are admitted (vLLM: counted as each "
            "prefill ends; SGLang: each prefill chunk's fresh and cached tokens as it runs).",
            on(vllm=ADMITTED_TOKENS, sglang=SGLANG_ADMITTED_TOKENS),
            ("vllm_prompt_tokens_admitted", "rate"),
        ),
        s(
            "prompt_tokens_per_admission",
            "tokens",
            "Prompt tokens per request admitted, mean: the admitted prompt tokens over the "
            "requests admitted (vLLM: TTFT observations; SGLang: queue-time observations), "
            "both counted at admission, not at the finish. More requests leave it flat; "
            "longer prompts raise it before the queue they cause.",
            on(vllm=q.ratio(ADMITTED_TOKENS, ADMISSIONS), sglang=SGLANG_PROMPT_PER_ADMISSION),
            ("vllm_prompt_tokens_per_admission", "mean"),
        ),
        s(
            "prompt_tokens_p50",
            "tokens",
            "Prompt tokens per request, median.",
            on(vllm=q.quantile(0.5, F.PROMPT.name), sglang=sg.quantile(0.5, SG.PROMPT)),
            ("vllm_request_prompt_tokens", "p50"),
            ceiling="prompt_tokens_top_bound",
            stand_in={"sglang": MEDIAN_FROM_PREFILL},
        ),
        s(
            "prompt_tokens_p95",
            "tokens",
            "Prompt tokens per request, 95th percentile.",
            on(vllm=q.quantile(0.95, F.PROMPT.name), sglang=sg.quantile(0.95, SG.PROMPT)),
            ("vllm_request_prompt_tokens", "p95"),
            ceiling="prompt_tokens_top_bound",
        ),
        s(
            "prompt_tokens_p99",
            "tokens",
            "Prompt tokens per request, 99th percentile.",
            on(vllm=q.quantile(0.99, F.PROMPT.name), sglang=sg.quantile(0.99, SG.PROMPT)),
            ("vllm_request_prompt_tokens", "p99"),
            ceiling="prompt_tokens_top_bound",
        ),
        s(
            "generation_tokens_per_request",
            "tokens",
            "Output tokens per finished request, mean (SGLang: its generation histogram's, "
            "else its generation tokens over its requests, both counted at the finish). "
            + DECODE_SIDE,
            on(
                vllm=sd.on_side("decode", q.hist_mean(F.GENERATION.name)),
                sglang=SGLANG_GENERATION_MEAN,
            ),
            ("vllm_request_generation_tokens", "mean"),
        ),
        *(
            s(
                f"generation_tokens_p{p}",
                "tokens",
                f"Output tokens per finished request, {_NTH[p]}.",
                on(
                    vllm=sd.on_side("decode", q.quantile(p / 100, F.GENERATION.name)),
                    sglang=sg.quantile(p / 100, SG.GENERATION),
                ),
                ("vllm_request_generation_tokens", f"p{p}"),
                ceiling="generation_tokens_top_bound",
            )
            for p in (50, 95, 99)
        ),
        s(
            "prompt_tokens_top_bound",
            "tokens",
            "The top finite bound of the server's prompt-token buckets (vLLM's end at its "
            "max_model_len: 1, 2, 5, 10, ... up to it): a quantile at it is a lower bound.",
            on(vllm=rs.top_bound(F.PROMPT.name), sglang=sg.top_bound(SG.PROMPT)),
            ("vllm_request_prompt_tokens", "top_bound"),
        ),
        s(
            "generation_tokens_top_bound",
            "tokens",
            "The top finite bound of the server's output-token buckets: a quantile at it is a "
            "lower bound.",
            on(vllm=rs.top_bound(F.GENERATION.name), sglang=sg.top_bound(SG.GENERATION)),
            ("vllm_request_generation_tokens", "top_bound"),
        ),
        s(
            "max_tokens_per_request",
            "tokens",
            "The max_tokens requests asked for, mean. " + DECODE_SIDE,
            on(
                vllm=sd.on_side("decode", q.hist_mean(F.MAX_TOKENS.name)),
                sglang=Gap("SGLang exports no histogram of the max_tokens requests ask for"),
            ),
            ("vllm_request_params_max_tokens", "mean"),
        ),
    ]
