"""SGLang 0.5's metric families, as ``sglang/srt/observability/metrics_collector.py`` declares
them: the families a unified server started with ``--enable-metrics`` exports by default.

SGLang runs prometheus_client in multiprocess mode, so a family is exported once a process
has written a value to it: the scheduler's gauges from its first stats log (every batch, and
every 30 s when idle), its constants at start-up, counters and histograms from their first
observation. Families behind an option (hierarchical cache, speculative decoding, grammars,
disaggregation, DP attention, MFU and device-timer metrics) are not in the table, except
LoRA's adapter slots (``requires="--enable-lora"``), which a signal reads, and the token-length
histograms (``requires=TOKENS_HISTOGRAM``): SGLang up to 0.5.10.post1 observes them only with
``--collect-tokens-histogram``, off by default; later releases always do. The signals read at
SGLang's defaults do without them (counters and the queue-time count instead).
Scheduler series carry ``model_name, engine_type, tp_rank, pp_rank, moe_ep_rank`` (``dp_rank``
with data parallelism, ``priority`` with priority scheduling); tokenizer series ``model_name,
engine_type``. A gauge without a ``multiprocess_mode`` keeps each process's value apart,
under a ``pid`` label. ``tests/data/sglang-0.5.23.json`` (``scripts/sglang-metrics-reference``)
is what the conformance test holds this table to.
"""

from __future__ import annotations

from diagnoser.metrics import buckets as B
from diagnoser.metrics.family import Family, register

PROVIDED_BY = "SGLang 0.5 (--enable-metrics)"
# The server flag behind the token-length histograms (a default of SGLang <= 0.5.10.post1).
TOKENS_HISTOGRAM = "--collect-tokens-histogram"
SCHEDULER = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER = ("model_name", "engine_type")
_SCHED, _TOK = SCHEDULER, TOKENIZER
_H, _C, _G = "histogram", "counter", "gauge"


def _s(name: str, type_: str, help_: str, **kw: object) -> Family:
    """An SGLang family, labelled as the scheduler's unless ``base`` says otherwise."""
    kw.setdefault("base", SCHEDULER)
    return register(Family(name, type_, "sglang", help_, **kw))  # type: ignore[arg-type]


RUNNING = _s("sglang:num_running_reqs", _G, "The number of running requests.")
WAITING = _s("sglang:num_queue_reqs", _G, "The number of requests in the waiting queue.")
NUM_GRAMMAR_QUEUE_REQS = _s(
    "sglang:num_grammar_queue_reqs", _G, "The number of requests in the grammar waiting queue."
)
GEN_THROUGHPUT = _s("sglang:gen_throughput", _G, "The generation throughput (token/s).")
CACHE_HIT_RATE = _s("sglang:cache_hit_rate", _G, "The prefix cache hit rate.")
DECODE_SUM_SEQ_LENS = _s(
    "sglang:decode_sum_seq_lens", _G, "The sum of all sequence lengths in decode."
)
TOKEN_USAGE = _s("sglang:token_usage", _G, "The token usage.")
FULL_TOKEN_USAGE = _s("sglang:full_token_usage", _G, "The token usage for full attention layers.")
SWA_TOKEN_USAGE = _s("sglang:swa_token_usage", _G, "The token usage for SWA layers.")
MAMBA_USAGE = _s("sglang:mamba_usage", _G, "The token usage for Mamba layers.")
NUM_USED_TOKENS = _s("sglang:num_used_tokens", _G, "The number of used tokens.")
KV_AVAILABLE_TOKENS = _s(
    "sglang:kv_available_tokens", _G, "Number of free token slots in the KV cache pool."
)
KV_EVICTABLE_TOKENS = _s(
    "sglang:kv_evictable_tokens",
    _G,
    "Number of evictable (radix-cached) token slots in the KV cache pool.",
)
KV_USED_TOKENS = _s(
    "sglang:kv_used_tokens", _G, "Number of actively used token slots in the KV cache pool."
)
SWA_AVAILABLE_TOKENS = _s(
    "sglang:swa_available_tokens",
    _G,
    "Number of free token slots in the SWA pool (hybrid-SWA only).",
)
SWA_EVICTABLE_TOKENS = _s(
    "sglang:swa_evictable_tokens",
    _G,
    "Number of evictable (radix-cached) token slots in the SWA pool.",
)
SWA_USED_TOKENS = _s(
    "sglang:swa_used_tokens", _G, "Number of actively used token slots in the SWA pool."
)
MAMBA_AVAILABLE_TOKENS = _s(
    "sglang:mamba_available_tokens",
    _G,
    "Number of free state slots in the mamba SSM pool (hybrid-SSM only).",
)
MAMBA_EVICTABLE_TOKENS = _s(
    "sglang:mamba_evictable_tokens",
    _G,
    "Number of evictable (radix-cached) state slots in the mamba SSM pool.",
)
MAMBA_USED_TOKENS = _s(
    "sglang:mamba_used_tokens", _G, "Number of actively used state slots in the mamba SSM pool."
)
SPEC_ACCEPT_LENGTH = _s(
    "sglang:spec_accept_length",
    _G,
    "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
)
SPEC_ACCEPT_RATE = _s(
    "sglang:spec_accept_rate",
    _G,
    "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
)
SPEC_CAP_LENGTH = _s(
    "sglang:spec_cap_length",
    _G,
    "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot (0 when "
    "no cap is scheduled).",
)
SPEC_BLOCK_ACCEPT_LENGTH = _s(
    "sglang:spec_block_accept_length",
    _G,
    "Mean uncapped full-block accept length per verify step (accept + cap-trimmed drafts; exact "
    "only in DSpark cap-accept mode).",
)
SPEC_NUM_STEPS = _s("sglang:spec_num_steps", _G, "Currently active speculative_num_steps.")
SPEC_NUM_DRAFT_TOKENS = _s(
    "sglang:spec_num_draft_tokens",
    _G,
    "Currently active speculative_num_draft_tokens (decouples from steps under topk>1).",
)
# With --enable-lora: the adapter slots of a batch (--max-loras-per-batch) and how many hold
# an adapter of a running request (SchedulerMetricsReporter: the distinct lora_ids of the
# running batch), set at each stats log.
LORA_SLOTS_TOTAL = _s(
    "sglang:lora_pool_slots_total",
    _G,
    "Total number of LoRA adapter slots available (max_loras_per_batch).",
    requires="--enable-lora",
)
LORA_SLOTS_USED = _s(
    "sglang:lora_pool_slots_used",
    _G,
    "Number of LoRA adapter slots currently occupied in GPU memory.",
    requires="--enable-lora",
)
LORA_UTILIZATION = _s(
    "sglang:lora_pool_utilization",
    _G,
    "LoRA pool utilization ratio (used/total). 1.0 means pool is full.",
    requires="--enable-lora",
)
NUM_RETRACTED_REQS = _s(
    "sglang:num_retracted_reqs", _G, "The number of retracted requests.", labels=("pid",)
)
NUM_PAUSED_REQS = _s(
    "sglang:num_paused_reqs",
    _G,
    "The number of paused requests by async weight sync.",
    labels=("pid",),
)
NUM_PREFILL_BOOTSTRAP_QUEUE_REQS = _s(
    "sglang:num_prefill_bootstrap_queue_reqs",
    _G,
    "The number of requests in the prefill bootstrap queue.",
)
NUM_PREFILL_INFLIGHT_QUEUE_REQS = _s(
    "sglang:num_prefill_inflight_queue_reqs",
    _G,
    "The number of requests in the prefill inflight queue.",
)
NUM_DECODE_PREALLOC_QUEUE_REQS = _s(
    "sglang:num_decode_prealloc_queue_reqs",
    _G,
    "The number of requests in the decode prealloc queue.",
)
NUM_DECODE_TRANSFER_QUEUE_REQS = _s(
    "sglang:num_decode_transfer_queue_reqs",
    _G,
    "The number of requests in the decode transfer queue.",
)
NUM_DECODE_HOST_RECEIVE_QUEUE_REQS = _s(
    "sglang:num_decode_host_receive_queue_reqs",
    _G,
    "Requests in the decode transfer queue receiving into host memory or waiting for device "
    "admission.",
)
NUM_DECODE_DEFERRED_KV_RELEASE_REQS = _s(
    "sglang:num_decode_deferred_kv_release_reqs",
    _G,
    "The number of failed decode requests whose KV allocations are held pending transfer drain "
    "acknowledgement or timeout.",
)
PENDING_PREALLOC_TOKEN_USAGE = _s(
    "sglang:pending_prealloc_token_usage",
    _G,
    "The token usage for pending preallocated tokens (not preallocated yet).",
)
PREALLOC_FULL_TOKEN_USAGE = _s(
    "sglang:prealloc_full_token_usage",
    _G,
    "Share of the full-attention KV pool held by decode requests whose KV transfer is pending "
    "(preallocated, not yet running); same capacity basis as sglang:full_token_usage.",
)
PREALLOC_SWA_TOKEN_USAGE = _s(
    "sglang:prealloc_swa_token_usage",
    _G,
    "Share of the SWA KV pool held by decode requests whose KV transfer is pending; same capacity "
    "basis as sglang:swa_token_usage.",
)
UTILIZATION = _s("sglang:utilization", _G, "The utilization.")
FWD_OCCUPANCY = _s("sglang:fwd_occupancy", _G, "Forward pass GPU occupancy percentage.")
NEW_TOKEN_RATIO = _s("sglang:new_token_ratio", _G, "The new token ratio.")
IS_CUDA_GRAPH = _s("sglang:is_cuda_graph", _G, "Whether the batch is using CUDA graph.")
NUM_UNIQUE_RUNNING_ROUTING_KEYS = _s(
    "sglang:num_unique_running_routing_keys", _G, "Number of unique routing keys in running batch."
)
ROUTING_KEY_RUNNING_REQ_COUNT = _s(
    "sglang:routing_key_running_req_count",
    _G,
    "Distribution of routing keys by running request count (gt < count <= le).",
    labels=("gt", "le"),
)
ROUTING_KEY_ALL_REQ_COUNT = _s(
    "sglang:routing_key_all_req_count",
    _G,
    "Distribution of routing keys by running+waiting request count (gt < count <= le).",
    labels=("gt", "le"),
)
MAX_NUM_TOKENS = _s(
    "sglang:max_total_num_tokens", _G, "Maximum total number of tokens in the KV cache pool."
)
WEIGHT_MEMORY_USAGE_GB = _s(
    "sglang:weight_memory_usage_gb", _G, "Memory used by model weights in GB."
)
KV_CACHE_MEMORY_USAGE_GB = _s(
    "sglang:kv_cache_memory_usage_gb", _G, "Memory used by the KV cache pools in GB."
)
GRAPH_MEMORY_USAGE_GB = _s(
    "sglang:graph_memory_usage_gb",
    _G,
    "Memory used by captured device graphs in GB.",
    labels=("phase",),
)
PAGE_SIZE = _s("sglang:page_size", _G, "KV cache page size in tokens.")
NUM_PAGES = _s("sglang:num_pages", _G, "Number of KV cache pages.")
CONTEXT_LEN = _s("sglang:context_len", _G, "Maximum context length.")
STARTUP_AVAILABLE_GPU_MEMORY_GB = _s(
    "sglang:startup_available_gpu_memory_gb", _G, "Available GPU memory in GB at startup."
)
CUDA_GRAPH_PASSES = _s(
    "sglang:cuda_graph_passes_total",
    _C,
    "Total number of forward passes categorized by CUDA graph.",
    labels=("mode",),
)
REALTIME_TOKENS = _s(
    "sglang:realtime_tokens_total",
    _C,
    "Total number of tokens processed (updated on each log interval). mode: prefill_compute, "
    "prefill_cache, decode.",
    labels=("mode",),
)
PREFILL_EFFECTIVE_TOKENS = _s(
    "sglang:prefill_effective_tokens_total",
    _C,
    "Effective prefill tokens with retracted-request re-counts excluded, updated on each log "
    "interval. mode: device_hit, host_hit, storage_hit, input. Windowed prefix cache hit rate = "
    "rate(sum of *_hit) / rate(sum of all modes); per-tier rate uses a single *_hit mode in the "
    "numerator.",
    labels=("mode",),
)
SCHEDULER_IDLE = _s(
    "sglang:scheduler_idle_seconds_total",
    _C,
    "Total wall time while the scheduler has no runnable or queued work.",
)
SCHEDULER_PROCESS_CPU = _s(
    "sglang:scheduler_process_cpu_seconds_total",
    _C,
    "Total CPU time consumed by the scheduler process across all threads.",
)
SCHEDULER_STAGE = _s(
    "sglang:scheduler_stage_seconds_total",
    _C,
    "Total scheduler-loop wall time exclusively attributed to each stage. forward_overlap (full, "
    "partial, none): full=both endpoints active, partial=one, none=no observed overlap (including "
    "unavailable timing). Not exact overlapped/exposed seconds.",
    labels=("category", "forward_overlap"),
)
RETRACTIONS = _s("sglang:num_retracted_requests_total", _C, "Total number of retracted requests.")
NUM_RETRACTED_INPUT_TOKENS = _s(
    "sglang:num_retracted_input_tokens_total", _C, "Total number of retracted input tokens."
)
NUM_RETRACTED_OUTPUT_TOKENS = _s(
    "sglang:num_retracted_output_tokens_total", _C, "Total number of retracted output tokens."
)
QUEUE = _s(
    "sglang:queue_time_seconds",
    _H,
    "Histogram of queueing time in seconds.",
    buckets=B.SGLANG_QUEUE_BUCKETS,
)
STAGE = _s(
    "sglang:per_stage_req_latency_seconds",
    _H,
    "The latency of each stage of requests.",
    labels=("stage",),
    buckets=B.SGLANG_STAGE_BUCKETS,
)
STARTUP_TIME = _s(
    "sglang:startup_time_seconds",
    _G,
    "Engine startup duration by phase in seconds.",
    base=_TOK,
    labels=("phase",),
)
STARTUP_CUDA_GRAPH_TIME = _s(
    "sglang:startup_cuda_graph_time_seconds",
    _G,
    "CUDA graph capture duration by phase in seconds.",
    base=_TOK,
    labels=("phase",),
)
PROMPT_TOKENS = _s(
    "sglang:prompt_tokens_total",
    _C,
    "Number of prefill tokens processed.",
    base=_TOK,
    labels=("is_streaming",),
)
GENERATION_TOKENS = _s(
    "sglang:generation_tokens_total",
    _C,
    "Number of generation tokens processed.",
    base=_TOK,
    labels=("is_streaming",),
)
PROMPT = _s(
    "sglang:prompt_tokens_histogram",
    _H,
    "Histogram of prompt token length.",
    base=_TOK,
    buckets=B.SGLANG_TOKEN_BUCKETS,
    requires=TOKENS_HISTOGRAM,
)
PROMPT_UNCACHED = _s(
    "sglang:uncached_prompt_tokens_histogram",
    _H,
    "Histogram of uncached (compute) prompt token length.",
    base=_TOK,
    buckets=B.SGLANG_TOKEN_BUCKETS,
    requires=TOKENS_HISTOGRAM,
)
GENERATION = _s(
    "sglang:generation_tokens_histogram",
    _H,
    "Histogram of generation token length.",
    base=_TOK,
    buckets=B.SGLANG_TOKEN_BUCKETS,
    requires=TOKENS_HISTOGRAM,
)
# Observed as each request finishes, with --collect-tokens-histogram alone.
TOKEN_HISTOGRAMS = (PROMPT, PROMPT_UNCACHED, GENERATION)
CACHED_TOKENS = _s(
    "sglang:cached_tokens_total",
    _C,
    "Number of cached prompt tokens by source (device/host/storage).",
    base=_TOK,
    labels=("cache_source",),
)
REQUESTS = _s(
    "sglang:num_requests_total",
    _C,
    "Number of requests processed.",
    base=_TOK,
    labels=("is_streaming",),
)
ABORTED = _s("sglang:num_aborted_requests_total", _C, "Number of requests aborted.", base=_TOK)
TTFT = _s(
    "sglang:time_to_first_token_seconds",
    _H,
    "Histogram of time to first token in seconds.",
    base=_TOK,
    labels=("is_streaming",),
    buckets=B.SGLANG_TTFT_BUCKETS,
)
ITL = _s(
    "sglang:inter_token_latency_seconds",
    _H,
    "Histogram of inter-token latency in seconds.",
    base=_TOK,
    buckets=B.SGLANG_ITL_BUCKETS,
)
TPOT = _s(
    "sglang:request_time_per_output_token_seconds",
    _H,
    "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).",
    base=_TOK,
    labels=("is_streaming",),
    buckets=B.SGLANG_ITL_BUCKETS,
)
E2E = _s(
    "sglang:e2e_request_latency_seconds",
    _H,
    "Histogram of End-to-end request latency in seconds",
    base=_TOK,
    labels=("is_streaming",),
    buckets=B.SGLANG_E2E_BUCKETS,
)
PROCESS_CPU = _s(
    "sglang:process_cpu_seconds_total",
    _C,
    "Total CPU time consumed by this process (user + system)",
    base=(),
    labels=("component",),
)
HTTP_REQUESTS = _s(
    "sglang:http_requests_total",
    _C,
    "Total number of HTTP requests by endpoint and method",
    base=(),
    labels=("endpoint", "method"),
)
HTTP_RESPONSES = _s(
    "sglang:http_responses_total",
    _C,
    "Total number of HTTP responses by endpoint and status code",
    base=(),
    labels=("endpoint", "status_code", "method"),
)
HTTP_REQUESTS_ACTIVE = _s(
    "sglang:http_requests_active",
    _G,
    "Number of currently active HTTP requests",
    base=(),
    labels=("endpoint", "method"),
)
ROUTING_KEYS_ACTIVE = _s(
    "sglang:routing_keys_active", _G, "Number of unique routing keys with active requests", base=()
)
