"""The metric families each signal reads, by role; renamed families newest name first.

One table: the signals, the dashboards' heatmaps and the diagnoser name families only through
these constants, so a rename in vLLM is one edit here (and one row in ``core.families``).
"""

from __future__ import annotations

TTFT = "vllm:time_to_first_token_seconds"
ITL = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
TPOT = ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds")
E2E = "vllm:e2e_request_latency_seconds"
QUEUE = "vllm:request_queue_time_seconds"
PREFILL = "vllm:request_prefill_time_seconds"
DECODE = "vllm:request_decode_time_seconds"
PROMPT = "vllm:request_prompt_tokens"
GENERATION = "vllm:request_generation_tokens"
MAX_TOKENS = "vllm:request_params_max_tokens"
STEP_TOKENS = "vllm:iteration_tokens_total"
SUCCESS = "vllm:request_success_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PREEMPTIONS = "vllm:num_preemptions_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
HTTP_REQUESTS = "http_requests_total"
PROCESS_CPU = "process_cpu_seconds_total"
PROCESS_START = "process_start_time_seconds"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
GPU_FB_USED = "DCGM_FI_DEV_FB_USED"
GPU_FB_FREE = "DCGM_FI_DEV_FB_FREE"
PROBE_TTFT = "llm_probe_ttft_seconds"
PROBE_ITL = "llm_probe_itl_seconds"
PROBE_E2E = "llm_probe_e2e_seconds"
PROBE_REQUESTS = "llm_probe_requests_total"

UP = "up"

# The handlers that carry inference traffic: OpenAI's completions, chat completions and
# responses APIs, and Anthropic's messages API (vLLM serves all four).
INFERENCE_HANDLERS = 'handler=~"/v1/completions|/v1/chat/completions|/v1/responses|/v1/messages"'
