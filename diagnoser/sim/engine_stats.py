"""What one simulated engine observed since its last drain, as vLLM's (and SGLang's) metric
code observes it: the engine records into it step by step (``engine``, ``speculation``), and
the metric exporters (``vllm_metrics``, ``sglang_metrics``, ``kv_transfer``) absorb it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from diagnoser.sim.batch import Request

Observations = list[tuple[np.ndarray, np.ndarray]]  # (values, how many times each)


@dataclass
class EngineStats:
    """Observations since the last drain, as numpy-friendly lists.

    One engine step that produces output is one ``EngineCoreOutputs`` message, which the API
    server turns into one ``IterationStats`` (``AsyncLLM.output_handler``); a step that only
    ran prompt chunks short of a prompt's end produces no output and no observation.
    """

    finished: list[Request] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)  # IterationStats.update_from_output
    itl: list[tuple[float, int]] = field(default_factory=list)  # (seconds, tokens)
    # vllm:iteration_tokens_total, one value per output message: the tokens generated in it
    # plus, for the requests whose first token it carries, the prompt tokens computed (vLLM >=
    # 0.23: prompt_token_stats.computed, cached tokens excluded) or the whole prompt (before).
    batches: Observations = field(default_factory=list)
    batches_full_prompt: Observations = field(default_factory=list)
    preemptions: int = 0  # reported with the preempted request's next output
    usage_at_preemption: list[float] = field(default_factory=list)  # KV in use, 0-1
    prefix_queries: int = 0  # prompt tokens looked up at first admission (scheduler stats)
    prefix_hits: int = 0
    prompt_tokens: int = 0  # prompt tokens of requests whose first token was output
    cached_tokens: int = 0  # of those, found in the prefix cache or brought by KV transfer
    external_tokens: int = 0  # of those, brought by KV transfer
    # A KV consumer's transfers: (seconds, bytes) of each that completed, and the requests a
    # failed transfer ended (finished_reason "error").
    transfers: list[tuple[float, float]] = field(default_factory=list)
    errors: list[Request] = field(default_factory=list)
    generation_tokens: int = 0
    busy_seconds: float = 0.0
    # Speculative decoding (SpecDecodingStats.observe_draft, once per request and step with
    # a draft): drafts, draft tokens, accepted tokens, and accepted tokens by position.
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: np.ndarray = field(default_factory=lambda: np.zeros(0))
    # What SGLang observes apart (sglang_metrics): each request's wait before its first
    # forward, its prefill (seconds from that forward to its last prompt chunk, and the steps
    # it spanned) as its first token comes, and each retraction (prompt, generated tokens).
    queue_times: list[float] = field(default_factory=list)
    prefills: list[tuple[float, int]] = field(default_factory=list)
    retractions: list[tuple[int, int]] = field(default_factory=list)
