"""The families of what is scraped beside vLLM: its API server's HTTP and process series,
NVIDIA's dcgm-exporter, the synthetic probe and Prometheus' ``up``. They are rows of the one
table too: :mod:`diagnoser.metrics.families` registers and re-exports them."""

from __future__ import annotations

from diagnoser.metrics.buckets import (
    HTTP_BUCKETS,
    HTTP_HIGHR_BUCKETS,
    ITL_BUCKETS,
    REQUEST_LATENCY_BUCKETS,
    TTFT_BUCKETS,
)
from diagnoser.metrics.family import Family, register

__all__ = [
    "DCGM_LABELS",
    "DCGM_POD_LABELS",
    "GPU_ECC_DBE",
    "GPU_FB_FREE",
    "GPU_FB_USED",
    "GPU_POWER",
    "GPU_REMAPPED_UNCORRECTABLE",
    "GPU_SM_CLOCK",
    "GPU_TEMP",
    "GPU_UTIL",
    "GPU_XID",
    "HTTP_DURATION",
    "HTTP_DURATION_HIGHR",
    "HTTP_REQUESTS",
    "HTTP_REQUEST_SIZE",
    "HTTP_RESPONSE_SIZE",
    "PROBE_E2E",
    "PROBE_ITL",
    "PROBE_REQUESTS",
    "PROBE_TTFT",
    "PROCESS_CPU",
    "PROCESS_START",
    "UP",
]

_H, _C, _G = "histogram", "counter", "gauge"


def _o(name: str, type_: str, provider: str, help_: str = "", **kw: object) -> Family:
    return register(Family(name, type_, provider, help_, **kw))  # type: ignore[arg-type]


# --- the API server (prometheus-fastapi-instrumentator and prometheus_client) -----------------
_API = "vllm-api-server"
HTTP_REQUESTS = _o(
    "http_requests_total",
    _C,
    _API,
    "Total number of requests by method, status and handler.",
    labels=("method", "status", "handler"),
)
HTTP_REQUEST_SIZE = _o(
    "http_request_size_bytes",
    "summary",
    _API,
    "Content length of incoming requests by handler. Only value of header is respected. "
    "Otherwise ignored. No percentile calculated. ",
    labels=("handler",),
)
HTTP_RESPONSE_SIZE = _o(
    "http_response_size_bytes",
    "summary",
    _API,
    "Content length of outgoing responses by handler. Only value of header is respected. "
    "Otherwise ignored. No percentile calculated. ",
    labels=("handler",),
)
HTTP_DURATION_HIGHR = _o(
    "http_request_duration_highr_seconds",
    _H,
    _API,
    "Latency with many buckets but no API specific labels. Made for more accurate percentile "
    "calculations. ",
    buckets=HTTP_HIGHR_BUCKETS,
)
HTTP_DURATION = _o(
    "http_request_duration_seconds",
    _H,
    _API,
    "Latency with only few buckets by handler. Made to be only used if aggregation by handler "
    "is important. ",
    buckets=HTTP_BUCKETS,
    labels=("method", "handler"),
)
PROCESS_CPU = _o(
    "process_cpu_seconds_total", _C, _API, "Total user and system CPU time spent in seconds."
)
PROCESS_START = _o(
    "process_start_time_seconds",
    _G,
    _API,
    "Start time of the process since unix epoch in seconds.",
)

# --- other exporters -------------------------------------------------------------------------
# dcgm-exporter's default counters (etc/default-counters.csv), with its help texts.
_DCGM = "dcgm-exporter"
GPU_UTIL = _o("DCGM_FI_DEV_GPU_UTIL", _G, _DCGM, "GPU utilization (in %).")
GPU_FB_USED = _o("DCGM_FI_DEV_FB_USED", _G, _DCGM, "Framebuffer memory used (in MiB).")
GPU_FB_FREE = _o("DCGM_FI_DEV_FB_FREE", _G, _DCGM, "Framebuffer memory free (in MiB).")
GPU_POWER = _o("DCGM_FI_DEV_POWER_USAGE", _G, _DCGM, "Power draw (in W).")
GPU_TEMP = _o("DCGM_FI_DEV_GPU_TEMP", _G, _DCGM, "GPU temperature (in C).")
GPU_SM_CLOCK = _o("DCGM_FI_DEV_SM_CLOCK", _G, _DCGM, "SM clock frequency (in MHz).")
GPU_XID = _o("DCGM_FI_DEV_XID_ERRORS", _G, _DCGM, "Value of the last XID error encountered.")
# ECC: the volatile double-bit count is commented out of default-counters.csv (a site enables it
# in its counters file); the rows remapped for uncorrectable errors are on by default.
GPU_ECC_DBE = _o(
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", _C, _DCGM, "Total number of double-bit volatile ECC errors."
)
GPU_REMAPPED_UNCORRECTABLE = _o(
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    _C,
    _DCGM,
    "Number of remapped rows for uncorrectable errors",
)
# The labels dcgm-exporter puts on every GPU series; namespace, pod and container only in its
# Kubernetes pod-mapping mode.
DCGM_LABELS = ("gpu", "UUID", "Hostname", "modelName")
DCGM_POD_LABELS = ("namespace", "pod", "container")
_PROBE = ("target", "prompt_bucket")
PROBE_TTFT = _o(
    "llm_probe_ttft_seconds",
    _H,
    "servediag-probe",
    "Client-side time to first token.",
    buckets=TTFT_BUCKETS,
    labels=_PROBE,
)
PROBE_ITL = _o(
    "llm_probe_itl_seconds",
    _H,
    "servediag-probe",
    "Client-side gap between tokens.",
    buckets=ITL_BUCKETS,
    labels=_PROBE,
)
PROBE_E2E = _o(
    "llm_probe_e2e_seconds",
    _H,
    "servediag-probe",
    "Client-side request latency.",
    buckets=REQUEST_LATENCY_BUCKETS,
    labels=_PROBE,
)
PROBE_REQUESTS = _o(
    "llm_probe_requests_total",
    _C,
    "servediag-probe",
    "Probe requests by outcome.",
    labels=(*_PROBE, "outcome"),
)
UP = _o("up", _G, "prometheus", "Scrape health.")

# The handlers that carry inference traffic: OpenAI's completions, chat completions and
# responses APIs, and Anthropic's messages API (vLLM serves all four).
INFERENCE_HANDLERS = 'handler=~"/v1/completions|/v1/chat/completions|/v1/responses|/v1/messages"'
