"""The metric families the toolkit reads and the simulator writes: one table.

Names are the exposed names (``_total`` on counters; ``_bucket``/``_sum``/``_count`` are
added to histograms by the query builders). Each vLLM family carries what vLLM's own code
declares (``vllm/v1/metrics/loggers.py``): type, help text, labels, default buckets, the label
values it creates at start-up, and the versions that expose it by default (``since``,
``until``) or only behind ``--show-hidden-metrics-for-version`` (``hidden_until``). The
signals read these names from this table (renamed families under both names: ``*_NAMES``)
and the simulator emits from it, so a rename is one edit here. ``tests/data/vllm-*.json``
(written from the wheels by ``scripts/vllm-metrics-reference``) is what the conformance test
holds it to.

The families of what is scraped beside vLLM (its API server, dcgm-exporter, the probe) are
rows of the same table, declared in :mod:`diagnoser.metrics.exporters` (read from there); the
platform's (kube-state-metrics, cAdvisor, node-exporter) in :mod:`diagnoser.metrics.platform`.
Default histogram buckets are in :mod:`diagnoser.metrics.buckets`.
"""

from __future__ import annotations

from diagnoser.metrics import (
    exporters,  # noqa: F401  (enters the API server's, DCGM's, the probe's)
    platform,  # noqa: F401  (kube-state-metrics', cAdvisor's, node-exporter's)
)
from diagnoser.metrics.buckets import (
    ITERATION_TOKENS_BUCKETS,
    ITL_BUCKETS,
    PARAMS_N_BUCKETS,
    PREEMPTIONS_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    REQUEST_TOKENS,
    TTFT_BUCKETS,
)
from diagnoser.metrics.family import FAMILIES as FAMILIES
from diagnoser.metrics.family import Family as Family
from diagnoser.metrics.family import family as family
from diagnoser.metrics.family import register
from diagnoser.metrics.family import vllm_families as vllm_families

VLLM_BASE = ("model_name", "engine")
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")  # error: vLLM >= 0.14
FINISHED_REASONS_OLD = ("stop", "length", "abort")


def _v(name: str, type_: str, help_: str, **kw: object) -> Family:
    """A vLLM family, labelled ``model_name`` and ``engine`` unless ``base`` says otherwise."""
    kw.setdefault("base", VLLM_BASE)
    return register(Family(name, type_, "vllm", help_, **kw))  # type: ignore[arg-type]


_H, _C, _G = "histogram", "counter", "gauge"

# --- vLLM: scheduler state ------------------------------------------------------------------
RUNNING = _v("vllm:num_requests_running", _G, "Number of requests in model execution batches.")
WAITING = _v("vllm:num_requests_waiting", _G, "Number of requests waiting to be processed.")
WAITING_BY_REASON = _v(
    "vllm:num_requests_waiting_by_reason",
    _G,
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
    "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, "
    "blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
    since="0.20",
    labels=("reason",),
    values=("capacity", "deferred"),
)
KV_USAGE = _v(
    "vllm:kv_cache_usage_perc", _G, "KV-cache usage. 1 means 100 percent usage.", since="0.9"
)
KV_USAGE_OLD = _v(
    "vllm:gpu_cache_usage_perc",
    _G,
    "GPU KV-cache usage. 1 means 100 percent usage.",
    until="0.10",
    hidden_until="0.11",
)
SLEEP_STATE = _v(
    "vllm:engine_sleep_state",
    _G,
    "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
    "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
    since="0.11.1",
    labels=("sleep_state",),
    values=("awake", "weights_offloaded", "discard_all"),
)
CACHE_CONFIG = _v(
    "vllm:cache_config_info",
    _G,
    "Information of the LLMEngine CacheConfig",
    base=(),
    labels=("engine",),  # and every CacheConfig field; no model_name
)

# --- vLLM: caches -----------------------------------------------------------------------------
PREFIX_QUERIES = _v(
    "vllm:prefix_cache_queries_total",
    _C,
    "Prefix cache queries, in terms of number of queried tokens.",
    since="0.9",
)
PREFIX_HITS = _v(
    "vllm:prefix_cache_hits_total",
    _C,
    "Prefix cache hits, in terms of number of cached tokens.",
    since="0.9",
)
PREFIX_QUERIES_OLD = _v(
    "vllm:gpu_prefix_cache_queries_total",
    _C,
    "GPU prefix cache queries, in terms of number of queried tokens.",
    until="0.10",
    hidden_until="0.11",
)
PREFIX_HITS_OLD = _v(
    "vllm:gpu_prefix_cache_hits_total",
    _C,
    "GPU prefix cache hits, in terms of number of cached tokens.",
    until="0.10",
    hidden_until="0.11",
)
EXTERNAL_PREFIX_QUERIES = _v(
    "vllm:external_prefix_cache_queries_total",
    _C,
    "External prefix cache queries from KV connector cross-instance cache sharing, in terms "
    "of number of queried tokens.",
    since="0.11.1",
)
EXTERNAL_PREFIX_HITS = _v(
    "vllm:external_prefix_cache_hits_total",
    _C,
    "External prefix cache hits from KV connector cross-instance cache sharing, in terms of "
    "number of cached tokens.",
    since="0.11.1",
)
MM_CACHE_QUERIES = _v(
    "vllm:mm_cache_queries_total",
    _C,
    "Multi-modal cache queries, in terms of number of queried items.",
    since="0.11.1",
)
MM_CACHE_HITS = _v(
    "vllm:mm_cache_hits_total",
    _C,
    "Multi-modal cache hits, in terms of number of cached items.",
    since="0.11.1",
)

# --- vLLM: counters ---------------------------------------------------------------------------
PREEMPTIONS = _v(
    "vllm:num_preemptions_total", _C, "Cumulative number of preemption from the engine."
)
PROMPT_TOKENS = _v("vllm:prompt_tokens_total", _C, "Number of prefill tokens processed.")
PROMPT_TOKENS_BY_SOURCE = _v(
    "vllm:prompt_tokens_by_source_total",
    _C,
    "Number of prompt tokens by source.",
    since="0.16",
    labels=("source",),
    values=("local_compute", "local_cache_hit", "external_kv_transfer"),
)
PROMPT_TOKENS_CACHED = _v(
    "vllm:prompt_tokens_cached_total",
    _C,
    "Number of cached prompt tokens (local + external).",
    since="0.16",
)
PROMPT_TOKENS_CACHED_BY_SOURCE = _v(
    "vllm:prompt_tokens_cached_by_source_total",
    _C,
    "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host "
    "(offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or "
    "external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + "
    "vllm:external_prefix_cache_hits.",
    since="0.32",
    labels=("source",),
    values=("device", "host", "p2p", "disk", "external_unspecified"),
)
GENERATION_TOKENS = _v("vllm:generation_tokens_total", _C, "Number of generation tokens processed.")
SUCCESS = _v(
    "vllm:request_success_total",
    _C,
    "Count of successfully processed requests.",
    labels=("finished_reason",),
    values=FINISHED_REASONS,
)
ADMISSION_REJECTIONS = _v(
    "vllm:admission_rejections_total",
    _C,
    "Number of admission attempts rejected by a queue limit, by reason.",
    since="0.32",
    base=("model_name",),
    labels=("reason",),
    values=("max_num_queued_reqs", "max_num_queued_tokens"),
)
_PERF = "(for Model Flops Utilization calculations)."
EST_FLOPS = _v(
    "vllm:estimated_flops_per_gpu_total",
    _C,
    f"Estimated number of floating point operations per GPU {_PERF}",
    since="0.17",
)
EST_READ = _v(
    "vllm:estimated_read_bytes_per_gpu_total",
    _C,
    f"Estimated number of bytes read from memory per GPU {_PERF}",
    since="0.17",
)
EST_WRITE = _v(
    "vllm:estimated_write_bytes_per_gpu_total",
    _C,
    f"Estimated number of bytes written to memory per GPU {_PERF}",
    since="0.17",
)

# --- vLLM: histograms of counts ---------------------------------------------------------------
PROMPT = _v(
    "vllm:request_prompt_tokens", _H, "Number of prefill tokens processed.", buckets=REQUEST_TOKENS
)
GENERATION = _v(
    "vllm:request_generation_tokens",
    _H,
    "Number of generation tokens processed.",
    buckets=REQUEST_TOKENS,
)
STEP_TOKENS = _v(
    "vllm:iteration_tokens_total",
    _H,
    "Histogram of number of tokens per engine_step.",
    buckets=ITERATION_TOKENS_BUCKETS,
)
MAX_GENERATION = _v(
    "vllm:request_max_num_generation_tokens",
    _H,
    "Histogram of maximum number of requested generation tokens.",
    buckets=REQUEST_TOKENS,
)
PARAMS_N = _v(
    "vllm:request_params_n", _H, "Histogram of the n request parameter.", buckets=PARAMS_N_BUCKETS
)
MAX_TOKENS = _v(
    "vllm:request_params_max_tokens",
    _H,
    "Histogram of the max_tokens request parameter.",
    buckets=REQUEST_TOKENS,
)
PREEMPTIONS_PER_REQUEST = _v(
    "vllm:request_num_preemptions",
    _H,
    "Histogram of the number of times a request was preempted.",
    since="0.30",
    buckets=PREEMPTIONS_BUCKETS,
)
PREFILL_COMPUTED = _v(
    "vllm:request_prefill_kv_computed_tokens",
    _H,
    "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
    since="0.13",
    buckets=REQUEST_TOKENS,
)

# --- vLLM: histograms of timing intervals -----------------------------------------------------
TTFT = _v(
    "vllm:time_to_first_token_seconds",
    _H,
    "Histogram of time to first token in seconds.",
    buckets=TTFT_BUCKETS,
)
ITL = _v(
    "vllm:inter_token_latency_seconds",
    _H,
    "Histogram of inter-token latency in seconds.",
    since="0.10.2",
    buckets=ITL_BUCKETS,
)
TPOT_OLD = _v(
    "vllm:time_per_output_token_seconds",
    _H,
    "Histogram of time per output token in seconds.",
    until="0.11",
    hidden_until="0.14",
    buckets=ITL_BUCKETS,
)
TPOT = _v(
    "vllm:request_time_per_output_token_seconds",
    _H,
    "Histogram of time_per_output_token_seconds per request.",
    since="0.11",
    buckets=ITL_BUCKETS,
)
E2E = _v(
    "vllm:e2e_request_latency_seconds",
    _H,
    "Histogram of e2e request latency in seconds.",
    buckets=REQUEST_LATENCY_BUCKETS,
)
QUEUE = _v(
    "vllm:request_queue_time_seconds",
    _H,
    "Histogram of time spent in WAITING phase for request.",
    buckets=REQUEST_LATENCY_BUCKETS,
)
INFERENCE = _v(
    "vllm:request_inference_time_seconds",
    _H,
    "Histogram of time spent in RUNNING phase for request.",
    buckets=REQUEST_LATENCY_BUCKETS,
)
PREFILL = _v(
    "vllm:request_prefill_time_seconds",
    _H,
    "Histogram of time spent in PREFILL phase for request.",
    buckets=REQUEST_LATENCY_BUCKETS,
)
DECODE = _v(
    "vllm:request_decode_time_seconds",
    _H,
    "Histogram of time spent in DECODE phase for request.",
    buckets=REQUEST_LATENCY_BUCKETS,
)

# --- vLLM: families that exist only with an option --------------------------------------------
_SPEC = "--speculative-config"
SPEC_DRAFTS = _v(
    "vllm:spec_decode_num_drafts_total", _C, "Number of spec decoding drafts.", requires=_SPEC
)
SPEC_DRAFT_TOKENS = _v(
    "vllm:spec_decode_num_draft_tokens_total", _C, "Number of draft tokens.", requires=_SPEC
)
SPEC_ACCEPTED = _v(
    "vllm:spec_decode_num_accepted_tokens_total", _C, "Number of accepted tokens.", requires=_SPEC
)
SPEC_ACCEPTED_PER_POS = _v(
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    _C,
    "Accepted tokens per draft position.",
    labels=("position",),
    requires=_SPEC,
)
LORA_INFO = _v(
    "vllm:lora_requests_info",
    _G,
    "Running stats on lora requests.",
    base=(),
    labels=("max_lora", "waiting_lora_adapters", "running_lora_adapters"),
    requires="--enable-lora",
)
# KV offloading (a KV connector that offloads to CPU memory or disk) and KV transfer between
# instances (disaggregated prefill): registered by the connector, not the stat logger.
_OFFLOAD = "--kv-transfer-config with OffloadingConnector"
_NIXL = "--kv-transfer-config with NixlConnector"
_KV_CONSUMER = "--kv-transfer-config (a KV consumer)"
KV_OFFLOAD_LOAD_BYTES = _v(
    "vllm:kv_offload_load_bytes_total",
    _C,
    "Total bytes loaded from offload storage to GPU.",
    since="0.25",
    requires=_OFFLOAD,
)
KV_OFFLOAD_STORE_BYTES = _v(
    "vllm:kv_offload_store_bytes_total",
    _C,
    "Total bytes stored from GPU to offload storage.",
    since="0.25",
    requires=_OFFLOAD,
)
KV_OFFLOAD_LOAD_TIME = _v(
    "vllm:kv_offload_load_time_total",
    _C,
    "Total load time from offload storage to GPU, in seconds.",
    since="0.25",
    requires=_OFFLOAD,
)
KV_OFFLOAD_STORE_TIME = _v(
    "vllm:kv_offload_store_time_total",
    _C,
    "Total store time from GPU to offload storage, in seconds.",
    since="0.25",
    requires=_OFFLOAD,
)
KV_OFFLOAD_CPU_USAGE = _v(
    "vllm:kv_offload_cpu_cache_usage_perc",
    _G,
    "Fraction of CPU KV-cache space currently pinned by active transfers (0.0 = idle, 1.0 = "
    "saturated). Sustained high values indicate transfers (stores or promotions) may be "
    "dropped due to insufficient capacity.",
    since="0.25",
    requires=_OFFLOAD,
)
KV_OFFLOAD_ALLOC_FAILURES = _v(
    "vllm:kv_offload_allocation_failure_total",
    _C,
    "Number of KV offload store allocation attempts that failed.",
    since="0.25",
    requires=_OFFLOAD,
)
NIXL_XFER_TIME = _v(
    "vllm:nixl_xfer_time_seconds",
    _H,
    "Histogram of transfer duration for NIXL KV Cache transfers.",
    since="0.12",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0),
    requires=_NIXL,
)
NIXL_FAILED = _v(
    "vllm:nixl_num_failed_transfers_total",
    _C,
    "Number of failed NIXL KV Cache transfers, including handshake and notification failures. "
    "NOTE: KV expiry is tracked separately in vllm:nixl_num_kv_expired_reqs.",
    since="0.12",
    requires=_NIXL,
)
NIXL_POST_TIME = _v(
    "vllm:nixl_post_time_seconds",
    _H,
    "Histogram of transfer post time for NIXL KV Cache transfers.",
    since="0.12",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0),
    requires=_NIXL,
)
NIXL_BYTES = _v(
    "vllm:nixl_bytes_transferred",
    _H,
    "Histogram of bytes transferred per NIXL KV Cache transfers.",
    since="0.12",
    buckets=tuple(float(2 ** (11 + 2 * i)) for i in range(12)),
    requires=_NIXL,
)
NIXL_DESCRIPTORS = _v(
    "vllm:nixl_num_descriptors",
    _H,
    "Histogram of number of descriptors per NIXL  KV Cache transfers.",
    since="0.12",
    buckets=(10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000),
    requires=_NIXL,
)
NIXL_FAILED_NOTIFICATIONS = _v(
    "vllm:nixl_num_failed_notifications_total",
    _C,
    "Number of failed NIXL KV Cache notifications. Retained for compatibility; these failures "
    "are also included in vllm:nixl_num_failed_transfers.",
    since="0.12",
    requires=_NIXL,
)
NIXL_EXPIRED = _v(
    "vllm:nixl_num_kv_expired_reqs_total",
    _C,
    "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
    since="0.12",
    requires=_NIXL,
)
# In 0.32's and 0.33's wheels; earlier releases not read.
NIXL_AFTER_EXPIRY = _v(
    "vllm:nixl_num_notifications_after_expiry_total",
    _C,
    "Number of completion notifications for requests that were no longer tracked, usually "
    "because their KV lease expired. The KV blocks may have been reused before the transfer "
    "finished. Counted per notification (one per remote rank), not per request.",
    since="0.32",
    requires=_NIXL,
)
KV_FETCH_BY_STAGE = _v(
    "vllm:num_requests_kv_fetch_by_stage",
    _G,
    "Number of waiting requests by async KV load stage. Stage labels: 'waiting_to_start' = "
    "needs an async KV load that has not started; 'in_progress' = load started and not yet "
    "reported finished; 'completed_waiting' = load finished, request not running yet.",
    since="0.33",
    labels=("stage",),
    values=("waiting_to_start", "in_progress", "completed_waiting"),
    requires=_KV_CONSUMER,
)
CORRUPTED = _v(
    "vllm:corrupted_requests_total",
    _C,
    "Corrupted requests, in terms of total number of requests with NaNs in logits.",
    since="0.11.1",
    requires="VLLM_COMPUTE_NANS_IN_LOGITS=1",
)

# --- SGLang (its own module: one row per family a default server exports) -------------------
from diagnoser.metrics import families_sglang as sglang  # noqa: E402, F401

# Families vLLM renamed, read under both names, newest first: a rename is one edit here.
ITL_NAMES = (ITL.name, TPOT_OLD.name)
TPOT_NAMES = (TPOT.name, TPOT_OLD.name)
KV_USAGE_NAMES = (KV_USAGE.name, KV_USAGE_OLD.name)
PREFIX_HITS_NAMES = (PREFIX_HITS.name, PREFIX_HITS_OLD.name)
PREFIX_QUERIES_NAMES = (PREFIX_QUERIES.name, PREFIX_QUERIES_OLD.name)
