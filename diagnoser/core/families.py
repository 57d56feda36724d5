"""The metric families the toolkit reads, as engines and exporters expose them.

Names are the exposed names (``_total`` on counters; ``_bucket``/``_sum``/``_count`` are
added to histograms by the query builders). ``since`` is the first vLLM version that
exposes the family and ``until`` the last one; ``provider`` names what must be scraped for
the family to exist, so a missing series can be explained instead of read as health.
Default histogram buckets are vLLM's (``vllm/v1/metrics/buckets.py``); since 0.33 they can be
overridden with ``--custom-histogram-buckets``, so the live ``le`` values win over these.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import inf, isnan

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKENS_BUCKETS = (
    1.0,
    8.0,
    16.0,
    32.0,
    64.0,
    128.0,
    256.0,
    512.0,
    1024.0,
    2048.0,
    4096.0,
    8192.0,
    16384.0,
)
PREEMPTIONS_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)


def request_token_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series of token buckets, up to and including ``max_model_len``."""
    out: list[float] = []
    exp = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exp
            if v > max_model_len:
                return tuple(out)
            out.append(float(v))
        exp += 1


def prompt_bucket_label(tokens: int) -> str:
    """The ``prompt_bucket`` label of a prompt length class: 128 -> ``128``, 4096 -> ``4k``."""
    return f"{tokens // 1024}k" if tokens >= 1024 and tokens % 1024 == 0 else str(tokens)


def le_label(value: float) -> str:
    """Format a bucket bound as ``prometheus_client`` does (``1.0``, ``2560.0``, ``1e+06``)."""
    if value == inf:
        return "+Inf"
    if isnan(value):
        return "NaN"
    s = repr(float(value))
    dot = s.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # counter | gauge | histogram
    provider: str  # vllm | vllm-api-server | dcgm-exporter | servediag-probe | prometheus
    since: str = ""
    until: str = ""
    buckets: tuple[float, ...] = ()
    labels: tuple[str, ...] = ()

    def provided_by(self) -> str:
        if self.provider == "vllm":
            span = f">= {self.since}" if self.since else "(all V1 versions)"
            if self.until:
                span = f"<= {self.until}"
            return f"vLLM {span}"
        return {
            "vllm-api-server": "the vLLM API server's HTTP/process metrics "
            "(process_* only with --api-server-count 1)",
            "dcgm-exporter": "NVIDIA dcgm-exporter with pod mapping (namespace, pod labels)",
            "servediag-probe": "the synthetic probe (servediag probe)",
            "prometheus": "Prometheus itself (scrape health)",
        }[self.provider]


def _f(name: str, type_: str, provider: str = "vllm", **kw: object) -> Family:
    return Family(name, type_, provider, **kw)  # type: ignore[arg-type]


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        _f("vllm:time_to_first_token_seconds", "histogram", buckets=TTFT_BUCKETS),
        _f("vllm:inter_token_latency_seconds", "histogram", since="0.10.2", buckets=ITL_BUCKETS),
        _f("vllm:time_per_output_token_seconds", "histogram", until="0.14", buckets=ITL_BUCKETS),
        _f(
            "vllm:request_time_per_output_token_seconds",
            "histogram",
            since="0.11.0",
            buckets=ITL_BUCKETS,
        ),
        _f("vllm:e2e_request_latency_seconds", "histogram", buckets=REQUEST_LATENCY_BUCKETS),
        _f("vllm:request_queue_time_seconds", "histogram", buckets=REQUEST_LATENCY_BUCKETS),
        _f("vllm:request_prefill_time_seconds", "histogram", buckets=REQUEST_LATENCY_BUCKETS),
        _f("vllm:request_decode_time_seconds", "histogram", buckets=REQUEST_LATENCY_BUCKETS),
        _f("vllm:request_inference_time_seconds", "histogram", buckets=REQUEST_LATENCY_BUCKETS),
        _f("vllm:request_prompt_tokens", "histogram"),
        _f("vllm:request_generation_tokens", "histogram"),
        _f("vllm:request_params_max_tokens", "histogram", since="0.8"),
        _f("vllm:iteration_tokens_total", "histogram", buckets=ITERATION_TOKENS_BUCKETS),
        _f(
            "vllm:request_num_preemptions", "histogram", since="0.30.0", buckets=PREEMPTIONS_BUCKETS
        ),
        _f("vllm:request_success_total", "counter", labels=("finished_reason",)),
        _f("vllm:prompt_tokens_total", "counter"),
        _f("vllm:generation_tokens_total", "counter"),
        _f("vllm:num_preemptions_total", "counter"),
        _f("vllm:prefix_cache_queries_total", "counter", since="0.9"),
        _f("vllm:prefix_cache_hits_total", "counter", since="0.9"),
        _f("vllm:gpu_prefix_cache_queries_total", "counter", until="0.11"),
        _f("vllm:gpu_prefix_cache_hits_total", "counter", until="0.11"),
        _f("vllm:admission_rejections_total", "counter", since="0.33.0", labels=("reason",)),
        _f("vllm:num_requests_running", "gauge"),
        _f("vllm:num_requests_waiting", "gauge"),
        _f("vllm:num_requests_waiting_by_reason", "gauge", since="0.25.0", labels=("reason",)),
        _f("vllm:kv_cache_usage_perc", "gauge", since="0.9"),
        _f("vllm:gpu_cache_usage_perc", "gauge", until="0.11"),
        _f("vllm:cache_config_info", "gauge", since="0.8"),
        _f(
            "http_requests_total",
            "counter",
            "vllm-api-server",
            labels=("handler", "method", "status"),
        ),
        _f("process_cpu_seconds_total", "counter", "vllm-api-server"),
        _f("process_start_time_seconds", "gauge", "vllm-api-server"),
        _f("DCGM_FI_DEV_GPU_UTIL", "gauge", "dcgm-exporter"),
        _f("DCGM_FI_DEV_FB_USED", "gauge", "dcgm-exporter"),
        _f("DCGM_FI_DEV_FB_FREE", "gauge", "dcgm-exporter"),
        _f(
            "llm_probe_ttft_seconds",
            "histogram",
            "servediag-probe",
            buckets=TTFT_BUCKETS,
            labels=("target", "prompt_bucket"),
        ),
        _f(
            "llm_probe_itl_seconds",
            "histogram",
            "servediag-probe",
            buckets=ITL_BUCKETS,
            labels=("target", "prompt_bucket"),
        ),
        _f(
            "llm_probe_e2e_seconds",
            "histogram",
            "servediag-probe",
            buckets=REQUEST_LATENCY_BUCKETS,
            labels=("target", "prompt_bucket"),
        ),
        _f(
            "llm_probe_requests_total",
            "counter",
            "servediag-probe",
            labels=("target", "prompt_bucket", "outcome"),
        ),
        _f("up", "gauge", "prometheus"),
    )
}


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(
            f"unknown metric family {name!r}; add it to diagnoser.core.families"
        ) from None
