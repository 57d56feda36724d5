"""Latency signals: time to first token, inter-token latency, end to end, and the parts of a
request's life (queue, prefill, decode, outside the engine)."""

from __future__ import annotations

from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_sglang as sg
from diagnoser.metrics import sides as sd
from diagnoser.metrics.engines import Gap
from diagnoser.metrics.signals import traffic
from diagnoser.metrics.signals.base import SGLANG_ITL_STALL, Signal, latency, on

# SGLang times the prefill from a request's first forward to its last prompt chunk.
PREFILL_STAGE = ('stage="prefill_forward"',)
SGLANG_PREFILL_MEAN = sg.hist_mean(SG.STAGE, PREFILL_STAGE)
# The prompt's compute is the prefill side's where prefill and decode are disaggregated: the
# decode side computes only the tokens the transferred KV did not cover.
PREFILL_SIDE = (
    "Disaggregated (vLLM): over the prefill servers, not the decode ones, which compute "
    "only what the transferred KV did not cover."
)


def signals() -> list[Signal]:
    s = Signal
    out = [
        *latency(
            "ttft",
            F.TTFT.name,
            "Time to first token (server side, from arrival)",
            "vllm_time_to_first_token_seconds",
            SG.TTFT,
        ),
        *latency(
            "itl",
            F.ITL_NAMES,
            "Inter-token latency (gap between output tokens)",
            "vllm_inter_token_latency_seconds",
            SG.ITL,
        ),
        *latency(
            "e2e",
            F.E2E.name,
            "End-to-end request latency",
            "vllm_e2e_request_latency_seconds",
            SG.E2E,
        ),
    ]
    out += [
        s(
            "itl_decode",
            "s",
            "The typical gap between a stream's tokens with no prefill in it: ITL p50 on vLLM, "
            "whose prefill chunks share steps with the decodes. SGLang runs each prefill batch "
            "alone, before the decode step, so every running stream's next token carries the "
            "whole prefill (scheduler.py:3993-4001 of 0.5.23) and the ITL median rises once "
            "prefills fill half the steps: on SGLang ITL p25, free of prefills until they fill "
            "three steps in four.",
            on(vllm=q.quantile(0.5, *F.ITL_NAMES), sglang=sg.quantile(0.25, SG.ITL)),
            ("vllm_inter_token_latency_seconds", "decode"),
            quantile_of=F.ITL_NAMES,
        ),
        s(
            "itl_decode_p95",
            "s",
            "Inter-token latency of the tokens no prefill stalled, 95th percentile: ITL p95 "
            "on vLLM; on SGLang, which runs each prefill alone while every stream waits, the "
            "gaps up to 0.4 s (its stall bound) alone.",
            on(
                vllm=q.quantile(0.95, *F.ITL_NAMES),
                sglang=sg.quantile_up_to(0.95, SG.ITL, SGLANG_ITL_STALL),
            ),
            ("vllm_inter_token_latency_seconds", "decode_p95"),
            quantile_of=F.ITL_NAMES,
        ),
        *(
            s(
                f"tpot_p{p}",
                "s",
                f"Time per output token of finished requests (each request's mean gap), {p}th "
                "percentile.",
                on(vllm=q.quantile(p / 100, *F.TPOT_NAMES), sglang=sg.quantile(p / 100, SG.TPOT)),
                ("vllm_request_time_per_output_token_seconds", f"p{p}"),
                quantile_of=F.TPOT_NAMES,
            )
            for p in (50, 95, 99)
        ),
        s(
            "tpot_mean",
            "s",
            "Time per output token, mean over finished requests.",
            on(vllm=q.hist_mean(*F.TPOT_NAMES), sglang=sg.hist_mean(SG.TPOT)),
            ("vllm_request_time_per_output_token_seconds", "mean"),
        ),
        s(
            "queue_time_mean",
            "s",
            "Time a request waits in the engine's queue, mean.",
            on(vllm=q.hist_mean(F.QUEUE.name), sglang=sg.hist_mean(SG.QUEUE)),
            ("vllm_request_queue_time_seconds", "mean"),
        ),
        *(
            s(
                f"queue_time_p{p}",
                "s",
                f"Time a request waits in the engine's queue, {p}th percentile.",
                on(vllm=q.quantile(p / 100, F.QUEUE.name), sglang=sg.quantile(p / 100, SG.QUEUE)),
                ("vllm_request_queue_time_seconds", f"p{p}"),
            )
            for p in (50, 95, 99)
        ),
        s(
            "prefill_time_mean",
            "s",
            "Time from scheduling to the first token (prefill), mean. " + PREFILL_SIDE,
            on(vllm=sd.on_side("prefill", q.hist_mean(F.PREFILL.name)), sglang=SGLANG_PREFILL_MEAN),
            ("vllm_request_prefill_time_seconds", "mean"),
        ),
        s(
            "prefill_time_p95",
            "s",
            "Prefill time, 95th percentile. " + PREFILL_SIDE,
            on(
                vllm=sd.on_side("prefill", q.quantile(0.95, F.PREFILL.name)),
                sglang=sg.quantile(0.95, SG.STAGE, PREFILL_STAGE),
            ),
            ("vllm_request_prefill_time_seconds", "p95"),
        ),
        s(
            "decode_time_mean",
            "s",
            "Time from the first to the last token (decode), mean. SGLang: mean e2e minus mean "
            "TTFT (it has no decode-time histogram).",
            on(
                vllm=q.hist_mean(F.DECODE.name),
                sglang=q.difference(sg.hist_mean(SG.E2E), sg.hist_mean(SG.TTFT)),
            ),
            ("vllm_request_decode_time_seconds", "mean"),
        ),
        *(
            s(
                f"decode_time_p{p}",
                "s",
                f"Time from the first to the last token (decode), {p}th percentile.",
                on(
                    vllm=q.quantile(p / 100, F.DECODE.name),
                    sglang=Gap("SGLang has no decode-time histogram"),
                ),
                ("vllm_request_decode_time_seconds", f"p{p}"),
            )
            for p in (50, 95, 99)
        ),
        s(
            "frontend_time_mean",
            "s",
            "TTFT not spent queued or prefilling in the engine: tokenization and API-server "
            "overhead, mean. vLLM observes TTFT at the first token and queue and prefill time "
            "at the finish, so during a sharp change the two lag by a request's decode time.",
            on(
                vllm=q.difference(
                    q.hist_mean(F.TTFT.name),
                    q.total(q.hist_mean(F.QUEUE.name), q.hist_mean(F.PREFILL.name)),
                ),
                sglang=q.difference(
                    sg.hist_mean(SG.TTFT), q.total(sg.hist_mean(SG.QUEUE), SGLANG_PREFILL_MEAN)
                ),
            ),
            ("vllm_frontend_time_seconds", "mean"),
        ),
        s(
            "prefill_seconds_per_prompt_token",
            "s",
            "Mean prefill time divided by mean prompt length: rises when prefill grows faster "
            "than the prompt (attention at long context). SGLang: over its prompt histogram's "
            "mean, else over the mean prompt per admitted request.",
            on(
                vllm=q.ratio(q.hist_mean(F.PREFILL.name), q.hist_mean(F.PROMPT.name)),
                sglang=q.ratio(
                    SGLANG_PREFILL_MEAN,
                    q.either(sg.hist_mean(SG.PROMPT), traffic.SGLANG_PROMPT_PER_ADMISSION),
                ),
            ),
            ("vllm_prefill_seconds_per_prompt_token", "mean"),
        ),
        s(
            "prompt_tokens_p50_from_prefill",
            "tokens",
            "The median prompt estimated without a prompt histogram: the mean prompt per "
            "admitted request (prompt_tokens_per_admission) times the median prefill time over "
            "the mean one. Longer prompts throughout raise it as the mean; a few huge prompts "
            "among short ones raise the mean prompt and the mean prefill alike, and leave it.",
            on(
                vllm=Gap("vLLM exports its prompt histogram: prompt_tokens_p50"),
                sglang=q.ratio(
                    traffic.SGLANG_PROMPT_PER_ADMISSION,
                    q.ratio(SGLANG_PREFILL_MEAN, sg.quantile(0.5, SG.STAGE, PREFILL_STAGE)),
                ),
            ),
            ("sglang_prompt_tokens_from_prefill", "p50"),
        ),
    ]
    return out
