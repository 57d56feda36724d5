"""Signals of optional engine features: speculative decoding, KV offloading and KV transfer
between instances. Their families exist only with the option that turns the feature on
(``requires`` in the family table); without it these signals are empty, never zero."""

from __future__ import annotations

from dataclasses import replace

from diagnoser.metrics import families as F
from diagnoser.metrics import promql as q
from diagnoser.metrics.engines import Gap
from diagnoser.metrics.signals.base import Signal, on

ACCEPTED = q.counter_rate(F.SPEC_ACCEPTED.name)


def _acceptance_length(scope: q.Scope) -> str:
    """Tokens a decode step yields per draft: the target model's own token plus those of the
    draft it accepted."""
    return f"1 + {q.ratio(ACCEPTED, q.counter_rate(F.SPEC_DRAFTS.name))(scope)}"


def _acceptance_by_position(scope: q.Scope) -> str:
    """The share of drafts whose token at each position was accepted."""
    per_pos = q.counter_rate_by(F.SPEC_ACCEPTED_PER_POS.name, "position")(scope)
    drafts = q.counter_rate(F.SPEC_DRAFTS.name)(scope)
    return f"{per_pos} / ignoring (position) group_left () ({drafts} > 0)"


def _tokens_per_decode_step(scope: q.Scope) -> str:
    """Output tokens per request and decode step: vLLM observes one inter-token latency per
    request and step however many tokens the step gave it, and counts every token; the first
    token of each request (counted, with its TTFT, not as a decode step) is taken off."""
    tokens = q.counter_rate(F.GENERATION_TOKENS.name)(scope)
    first = q.hist_rate(F.TTFT.name)(scope)
    steps = q.either(*(q.hist_rate(name) for name in F.ITL_NAMES))(scope)
    return f"({tokens} - {first}) / (({steps}) > 0)"


def speculative_decoding() -> list[Signal]:
    s = Signal
    return [
        s(
            "tokens_per_decode_step",
            "tokens",
            "Output tokens a decoding request gets per engine step: 1 without speculative "
            "decoding, 1 plus its accepted draft tokens with it (steps with no draft included). "
            "vLLM's ITL is per step, so time per output token is ITL over this.",
            on(vllm=_tokens_per_decode_step),
            ("vllm_decode_tokens_per_step", "ratio"),
        ),
        s(
            "spec_decode_acceptance_rate",
            "ratio",
            "Share of draft tokens the target model accepted (speculative decoding).",
            on(vllm=q.ratio(ACCEPTED, q.counter_rate(F.SPEC_DRAFT_TOKENS.name))),
            ("vllm_spec_decode_acceptance", "ratio"),
        ),
        s(
            "spec_decode_acceptance_length",
            "tokens",
            "Tokens per draft: 1 plus the accepted draft tokens per draft (speculative "
            "decoding); 1 means drafting buys nothing.",
            on(vllm=_acceptance_length),
            ("vllm_spec_decode_acceptance_length", "mean"),
        ),
        s(
            "spec_decode_acceptance_by_position",
            "ratio",
            "Share of drafts whose token at each position was accepted (speculative decoding).",
            on(vllm=_acceptance_by_position),
            ("vllm_spec_decode_acceptance_by_position", "ratio"),
        ),
        s(
            "spec_decode_draft_tokens_rate",
            "tokens/s",
            "Draft tokens proposed per second (speculative decoding).",
            on(vllm=q.counter_rate(F.SPEC_DRAFT_TOKENS.name)),
            ("vllm_spec_decode_num_draft_tokens", "rate"),
        ),
        s(
            "spec_decode_accepted_tokens_rate",
            "tokens/s",
            "Draft tokens accepted per second (speculative decoding).",
            on(vllm=ACCEPTED),
            ("vllm_spec_decode_num_accepted_tokens", "rate"),
        ),
    ]


def kv_offload() -> list[Signal]:
    s = Signal
    return [
        s(
            "kv_offload_load_bytes_rate",
            "B/s",
            "KV-cache bytes loaded back to the GPU from offload storage per second.",
            on(vllm=q.counter_rate(F.KV_OFFLOAD_LOAD_BYTES.name)),
            ("vllm_kv_offload_load_bytes", "rate"),
        ),
        s(
            "kv_offload_store_bytes_rate",
            "B/s",
            "KV-cache bytes stored from the GPU to offload storage per second.",
            on(vllm=q.counter_rate(F.KV_OFFLOAD_STORE_BYTES.name)),
            ("vllm_kv_offload_store_bytes", "rate"),
        ),
        s(
            "kv_offload_load_bandwidth",
            "B/s",
            "Bytes loaded per second spent loading: the offload tier's read bandwidth.",
            on(
                vllm=q.ratio(
                    q.counter_rate(F.KV_OFFLOAD_LOAD_BYTES.name),
                    q.counter_rate(F.KV_OFFLOAD_LOAD_TIME.name),
                )
            ),
            ("vllm_kv_offload_load_bandwidth", "ratio"),
        ),
        s(
            "kv_offload_store_bandwidth",
            "B/s",
            "Bytes stored per second spent storing: the offload tier's write bandwidth.",
            on(
                vllm=q.ratio(
                    q.counter_rate(F.KV_OFFLOAD_STORE_BYTES.name),
                    q.counter_rate(F.KV_OFFLOAD_STORE_TIME.name),
                )
            ),
            ("vllm_kv_offload_store_bandwidth", "ratio"),
        ),
        s(
            "kv_offload_cpu_cache_usage",
            "ratio",
            "CPU KV-cache space pinned by transfers in flight (0-1), the fullest engine; "
            "sustained near 1, stores are dropped.",
            on(vllm=q.gauge("max", F.KV_OFFLOAD_CPU_USAGE.name)),
            ("vllm_kv_offload_cpu_cache_usage", "max"),
        ),
        s(
            "kv_offload_allocation_failures_rate",
            "1/s",
            "KV offload stores per second that found no room in the offload tier.",
            on(vllm=q.counter_rate(F.KV_OFFLOAD_ALLOC_FAILURES.name)),
            ("vllm_kv_offload_allocation_failure", "rate"),
        ),
    ]


def _transfer_failure_share(scope: q.Scope) -> str:
    """Failed KV loads over all that ended (completed: the transfer-time histogram's count)."""
    failed = q.counter_rate(F.NIXL_FAILED.name)(scope)
    done = q.counter_rate(f"{F.NIXL_XFER_TIME.name}_count")(scope)
    return f"({failed}) / ((({failed}) + ({done})) > 0)"


def kv_transfer() -> list[Signal]:
    s = Signal
    return [
        s(
            "kv_transfer_failure_share",
            "ratio",
            "Share of the KV loads from other instances that failed (NixlConnector, vLLM >= "
            "0.12: failed transfers over those completed and failed). Under vLLM's default "
            "kv_load_failure_policy each failure ends its request with an error.",
            on(vllm=_transfer_failure_share),
            ("vllm_nixl_failed_transfers", "share"),
        ),
        s(
            "kv_transfer_tokens_rate",
            "tokens/s",
            "Prompt tokens per second whose KV came from another instance (KV transfer, "
            "vllm:prompt_tokens_by_source_total, vLLM >= 0.16): 0 without a KV connector.",
            on(
                vllm=q.counter_rate(
                    F.PROMPT_TOKENS_BY_SOURCE.name, extra=('source="external_kv_transfer"',)
                )
            ),
            ("vllm_prompt_tokens_kv_transfer", "rate"),
        ),
        s(
            "nixl_transfer_time_p95",
            "s",
            "Duration of a NIXL KV-cache transfer, 95th percentile (disaggregated prefill).",
            on(vllm=q.quantile(0.95, F.NIXL_XFER_TIME.name)),
            ("vllm_nixl_xfer_time_seconds", "p95"),
        ),
        s(
            "nixl_failed_transfers_rate",
            "1/s",
            "Failed NIXL KV-cache transfers per second: each fails a request or makes it "
            "compute its prefill locally.",
            on(vllm=q.counter_rate(F.NIXL_FAILED.name)),
            ("vllm_nixl_num_failed_transfers", "rate"),
        ),
        s(
            "kv_fetch_waiting_by_stage",
            "requests",
            "Waiting requests by stage of their KV load from another instance (a KV consumer).",
            on(vllm=q.gauge_by("sum", F.KV_FETCH_BY_STAGE.name, "stage")),
            ("vllm_num_requests_kv_fetch_by_stage", "sum"),
        ),
    ]


# SGLang reports speculative decoding, hierarchical caching and disaggregation in families of
# its own; these panels read vLLM's.
SGLANG_GAP = "read from vLLM's optional-feature families; SGLang's own are not mapped"


def signals() -> list[Signal]:
    every = [*speculative_decoding(), *kv_offload(), *kv_transfer()]
    return [replace(sig, exprs={**sig.exprs, "sglang": Gap(SGLANG_GAP)}) for sig in every]
