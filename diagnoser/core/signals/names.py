"""The metric families each signal reads, by role; renamed families newest name first.

Every name comes from the family table (:mod:`diagnoser.core.families`), which the simulator
emits from too, so a rename in vLLM is one edit there.
"""

from __future__ import annotations

from diagnoser.core import families as F

TTFT = F.TTFT.name
ITL = (F.ITL.name, F.TPOT_OLD.name)
TPOT = (F.TPOT.name, F.TPOT_OLD.name)
E2E = F.E2E.name
QUEUE = F.QUEUE.name
PREFILL = F.PREFILL.name
DECODE = F.DECODE.name
PROMPT = F.PROMPT.name
PREFILL_COMPUTED = F.PREFILL_COMPUTED.name
GENERATION = F.GENERATION.name
MAX_TOKENS = F.MAX_TOKENS.name
STEP_TOKENS = F.STEP_TOKENS.name
SUCCESS = F.SUCCESS.name
PROMPT_TOKENS = F.PROMPT_TOKENS.name
PROMPT_TOKENS_BY_SOURCE = F.PROMPT_TOKENS_BY_SOURCE.name
GENERATION_TOKENS = F.GENERATION_TOKENS.name
PREEMPTIONS = F.PREEMPTIONS.name
RUNNING = F.RUNNING.name
WAITING = F.WAITING.name
WAITING_BY_REASON = F.WAITING_BY_REASON.name
KV_USAGE = (F.KV_USAGE.name, F.KV_USAGE_OLD.name)
PREFIX_HITS = (F.PREFIX_HITS.name, F.PREFIX_HITS_OLD.name)
PREFIX_QUERIES = (F.PREFIX_QUERIES.name, F.PREFIX_QUERIES_OLD.name)
CACHE_CONFIG = F.CACHE_CONFIG.name
HTTP_REQUESTS = F.HTTP_REQUESTS.name
PROCESS_CPU = F.PROCESS_CPU.name
PROCESS_START = F.PROCESS_START.name
GPU_UTIL = F.GPU_UTIL.name
GPU_FB_USED = F.GPU_FB_USED.name
GPU_FB_FREE = F.GPU_FB_FREE.name
PROBE_TTFT = F.PROBE_TTFT.name
PROBE_ITL = F.PROBE_ITL.name
PROBE_E2E = F.PROBE_E2E.name
PROBE_REQUESTS = F.PROBE_REQUESTS.name

UP = F.UP.name

# The handlers that carry inference traffic: OpenAI's completions, chat completions and
# responses APIs, and Anthropic's messages API (vLLM serves all four).
INFERENCE_HANDLERS = 'handler=~"/v1/completions|/v1/chat/completions|/v1/responses|/v1/messages"'
