"""Histogram bucket bounds as vLLM, its API server and SGLang declare them, and how their
``le`` labels are written.

vLLM's defaults come from ``vllm/v1/metrics/buckets.py``; since 0.33 they can be overridden
with ``--custom-histogram-buckets``, so the live ``le`` values win over these.
"""

from __future__ import annotations

from itertools import pairwise
from math import inf, isclose, isfinite, isnan

TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0),
)
ITL_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0),
    *(2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0),
)
REQUEST_LATENCY_BUCKETS = (
    *(0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0),
    *(120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0),
)
ITERATION_TOKENS_BUCKETS = (
    *(1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0),
    16384.0,
)
PREEMPTIONS_BUCKETS = (1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0)
PARAMS_N_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0)
# prometheus-fastapi-instrumentator's metrics.default(), which vLLM's API server installs.
HTTP_HIGHR_BUCKETS = (
    *(0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0),
    *(4.5, 5.0, 7.5, 10.0, 30.0, 60.0),
)
HTTP_BUCKETS = (0.1, 0.5, 1.0)
# The 1-2-5 token histograms' bounds follow the server's max_model_len.
REQUEST_TOKENS = "1-2-5 up to max_model_len"


# SGLang 0.5's defaults (sglang/srt/observability/metrics_collector.py), overridable with
# --bucket-time-to-first-token, --bucket-inter-token-latency, --bucket-e2e-request-latency and
# --prompt-tokens-buckets. Its ITL buckets have no 0.3 s bound: 0.2, then 0.4.
SGLANG_TTFT_BUCKETS = (
    *(0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0),
    *(200.0, 400.0),
)
SGLANG_ITL_BUCKETS = (
    *(0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08),
    *(0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0),
)
SGLANG_E2E_BUCKETS = (*SGLANG_TTFT_BUCKETS, 600.0, 1200.0, 1800.0, 2400.0)
SGLANG_QUEUE_BUCKETS = (
    *(0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0),
    *(30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0),
    *(700.0, 800.0, 900.0, 1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0),
)
SGLANG_TOKEN_BUCKETS = (
    *(100.0, 300.0, 500.0, 700.0, 1000.0, 1500.0, 2000.0, 3000.0, 4000.0, 5000.0, 6000.0),
    *(7000.0, 8000.0, 9000.0, 10000.0, 12500.0, 15000.0, 17500.0, 20000.0, 22500.0, 25000.0),
    *(27500.0, 30000.0, 35000.0, 40000.0, 60000.0, 80000.0, 100000.0, 200000.0, 300000.0),
    *(400000.0, 600000.0, 800000.0, 1000000.0, 1100000.0),
)
# per_stage_req_latency_seconds: prometheus_client's exponential_buckets(0.001, 1.62, 30).
SGLANG_STAGE_BUCKETS = tuple(0.001 * 1.62**i for i in range(30))


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


def class_size(label: str) -> float | None:
    """A prompt length class's size from its label: ``128`` -> 128, ``4k`` -> 4096, ``1m`` ->
    1048576; None when not a size (``nan``, ``inf`` and ``1e400`` are not: the label may come
    from any exporter)."""
    text = label.strip().lower()
    mult = {"k": 1024, "m": 1024**2}.get(text[-1:], 1)
    digits = text[:-1] if mult > 1 else text
    try:
        size = float(digits) * mult
    except ValueError:
        return None
    return size if isfinite(size) else None


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


def version_key(version: str) -> tuple[int, ...]:
    """``"0.10.2"`` -> ``(0, 10, 2)``; a bound ``"0.10"`` covers every 0.10.x."""
    return tuple(int(p) for p in version.split(".") if p.isdigit())


# vLLM's --custom-histogram-buckets names a whole family of histograms with one key
# (vllm/config/observability.py, 0.33); the site config's ``histogram_buckets`` uses the same
# keys for the families whose bounds a threshold is read at.
CUSTOM_FAMILIES = {
    "time_to_first_token": ("vllm:time_to_first_token_seconds",),
    "inter_token_latency": (
        "vllm:inter_token_latency_seconds",
        "vllm:request_time_per_output_token_seconds",
        "vllm:time_per_output_token_seconds",
    ),
}


class BucketsError(ValueError):
    """Bounds that cannot be a histogram's: ``where`` is the family key, or empty."""

    def __init__(self, where: str, message: str):
        super().__init__(message)
        self.where = where


def parse_custom(value: object) -> dict[str, tuple[float, ...]]:
    """``{time_to_first_token: [0.1, 0.5, ...], ...}``, as vLLM's --custom-histogram-buckets
    sets them, for the families whose bounds a threshold is read at."""
    if not isinstance(value, dict):
        raise BucketsError("", "must be a mapping of family to bounds")
    out = {}
    for family, bounds in value.items():
        if family not in CUSTOM_FAMILIES:
            known = ", ".join(sorted(CUSTOM_FAMILIES))
            raise BucketsError(str(family), f"not a family whose bounds matter here ({known})")
        if (
            not isinstance(bounds, list)
            or not bounds
            or not all(
                isinstance(b, (int, float)) and not isinstance(b, bool) and 0 < b < inf
                for b in bounds
            )
        ):
            raise BucketsError(family, "must be a list of finite numbers above 0")
        if any(b <= a for a, b in pairwise(bounds)):
            raise BucketsError(family, "bounds must be increasing")
        out[family] = tuple(float(b) for b in bounds)
    return out


DEFAULT_BOUNDS = {"time_to_first_token": TTFT_BUCKETS, "inter_token_latency": ITL_BUCKETS}


def read_at(threshold: float, bound_sets: tuple[tuple[float, ...], ...]) -> tuple[float, ...]:
    """The bucket bounds a share "at or below ``threshold``" is read at, one per distinct
    set of bounds: the threshold itself where it is a bound, else the largest bound below it
    (a stricter threshold, so the share read is never better than the truth). A set with no
    bound at or below the threshold cannot give the share and adds nothing."""
    out: set[float] = set()
    for bounds in bound_sets:
        below = [b for b in bounds if b <= threshold * (1 + 1e-9)]
        if below:
            out.add(max(below))
    return tuple(sorted(out))


def is_bound(threshold: float, bounds: tuple[float, ...]) -> bool:
    return any(isclose(threshold, b, rel_tol=1e-9) for b in bounds)
