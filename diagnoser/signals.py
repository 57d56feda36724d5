"""The signal vocabulary: every named PromQL signal, defined once.

Recording rules, alert expressions, dashboard panels and the diagnoser all render these
definitions, so a metric rename is handled here and nowhere else. A signal is aggregated per
``model_name`` by default (summing vLLM's data-parallel ``engine`` label); signals where the
worst instance is the point (KV usage, API-server CPU) say so in their aggregation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property

from diagnoser import metrics
from diagnoser import promql as q
from diagnoser.promql import Expr, Scope

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
PREEMPTIONS = "vllm:num_preemptions_total"
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PROBE_TTFT = "llm_probe_ttft_seconds"
PROBE_ITL = "llm_probe_itl_seconds"
PROBE_E2E = "llm_probe_e2e_seconds"
PROBE_REQUESTS = "llm_probe_requests_total"

# The OpenAI-compatible handlers that carry inference traffic.
COMPLETION_HANDLERS = 'handler=~"/v1/completions|/v1/chat/completions"'

# Default SLO thresholds; each must be a bucket boundary of its histogram.
DEFAULT_TTFT_SLO = 1.0
DEFAULT_ITL_SLO = 0.1
ITL_STALL = 0.3  # seconds: a gap a reader notices, many times any healthy decode step

_FAMILY_RE = re.compile(
    r"(?<![\w:])(vllm:[a-z0-9_]+|llm_probe_[a-z0-9_]+|DCGM_FI_[A-Z_]+|"
    r"http_requests_total|process_[a-z_]+|up)(?![\w:])(?!\s*\()"
)


@dataclass(frozen=True)
class Signal:
    """A named PromQL expression with its unit and meaning."""

    name: str
    unit: str
    help: str
    expr: Expr
    record_as: tuple[str, str]  # (metric part, operation) of the recording rule name
    by: tuple[str, ...] = ("model_name",)
    per_instance: bool = False  # also recorded by (model_name, instance)

    def render(self, scope: Scope | None = None) -> str:
        return self.expr(scope or Scope(by=self.by))

    @cached_property
    def families(self) -> tuple[str, ...]:
        """Metric families the signal reads, newest name first, without suffixes."""
        found: list[str] = []
        for raw in _FAMILY_RE.findall(self.render()):
            name = _strip_suffix(raw)
            if name not in found:
                found.append(name)
        return tuple(found)

    @property
    def uses_rate(self) -> bool:
        return "[5m]" in self.render(Scope(by=self.by, window="5m"))

    def record_name(self, by: tuple[str, ...] | None = None, window: str = "5m") -> str:
        """``level:metric:operations``, e.g. ``model_name:vllm_ttft_seconds:p95_rate5m``."""
        level = "_".join(by or self.by)
        metric, op = self.record_as
        if self.uses_rate:
            ops = f"{op}{window}" if op in ("rate", "changes") else f"{op}_rate{window}"
        else:
            ops = op
        return f"{level}:{metric}:{ops}"

    def provided_by(self) -> list[str]:
        return sorted({metrics.family(f).provided_by() for f in self.families})


def _strip_suffix(name: str) -> str:
    if name in metrics.FAMILIES:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in metrics.FAMILIES:
            return name[: -len(suffix)]
    return name


def _lat(prefix: str, family: str | tuple[str, ...], what: str, record: str) -> list[Signal]:
    names = (family,) if isinstance(family, str) else family
    out = [
        Signal(
            f"{prefix}_p{p}",
            "s",
            f"{what}, {p}th percentile.",
            q.quantile(p / 100, *names),
            (record, f"p{p}"),
        )
        for p in (50, 95, 99)
    ]
    out.append(
        Signal(f"{prefix}_mean", "s", f"{what}, mean.", q.hist_mean(*names), (record, "mean"))
    )
    return out


def _api_requests(status: str | None) -> q.Expr:
    def inner(matchers: tuple[str, ...], window: str) -> str:
        extra = (COMPLETION_HANDLERS,) + ((f'status="{status}"',) if status else ())
        sel = q.selector("http_requests_total", matchers, *extra)
        return f"sum by (job, instance) (rate({sel}[{window}]))"

    return q.on_targets(inner)


def _api_cpu(matchers: tuple[str, ...], window: str) -> str:
    return f"rate({q.selector('process_cpu_seconds_total', matchers)}[{window}])"


def _api_restarts(matchers: tuple[str, ...], window: str) -> str:
    return f"changes({q.selector('process_start_time_seconds', matchers)}[{window}])"


def _gpu_util(window: str) -> str:
    return "DCGM_FI_DEV_GPU_UTIL / 100"


def _gpu_fb_used(window: str) -> str:
    return "DCGM_FI_DEV_FB_USED * 1048576"


def _gpu_fb_share(window: str) -> str:
    return "DCGM_FI_DEV_FB_USED / ((DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) > 0)"


def slo_attainment(
    family: str | tuple[str, ...], threshold: float, buckets: tuple[float, ...]
) -> q.Expr:
    """Share of observations at or below ``threshold``, which must be a bucket bound."""
    if threshold not in buckets:
        near = ", ".join(metrics.le_label(b) for b in buckets)
        raise ValueError(f"SLO threshold {threshold:g} s is not a bucket boundary ({near})")
    names = (family,) if isinstance(family, str) else family
    le = metrics.le_label(threshold)
    return q.either(*(q.bucket_share(n, le) for n in names))


def _probe_quantile(p: float, family: str, *, by_bucket: bool) -> q.Expr:
    return q.on_probe(q.quantile(p, family, extra_by=("prompt_bucket",) if by_bucket else ()))


def _first_token_share(scope: q.Scope) -> str:
    """Mean TTFT over mean e2e per prompt class, the lowest class per scope: a long prompt's
    first token is most of its request anyway, so only the short classes tell buffering."""
    per_class = scope.with_by(*scope.by, "prompt_bucket")
    share = q.ratio(q.on_probe(q.hist_mean(PROBE_TTFT)), q.on_probe(q.hist_mean(PROBE_E2E)))
    return q.agg("min", scope, share(per_class))


def _vocabulary(
    ttft_slo: float = DEFAULT_TTFT_SLO, itl_slo: float = DEFAULT_ITL_SLO
) -> list[Signal]:
    s = Signal
    request_rate = q.counter_rate(SUCCESS)
    ttft_slo_expr = slo_attainment(TTFT, ttft_slo, metrics.TTFT_BUCKETS)
    itl_slo_expr = slo_attainment(ITL, itl_slo, metrics.ITL_BUCKETS)
    out: list[Signal] = []
    out += _lat(
        "ttft",
        TTFT,
        "Time to first token (server side, from arrival)",
        "vllm_time_to_first_token_seconds",
    )
    out += _lat(
        "itl",
        ITL,
        "Inter-token latency (gap between output tokens)",
        "vllm_inter_token_latency_seconds",
    )
    out += _lat("e2e", E2E, "End-to-end request latency", "vllm_e2e_request_latency_seconds")
    out += [
        s(
            "tpot_mean",
            "s",
            "Time per output token, mean over finished requests.",
            q.hist_mean(*TPOT),
            ("vllm_request_time_per_output_token_seconds", "mean"),
        ),
        s(
            "queue_time_mean",
            "s",
            "Time a request waits in the engine's queue, mean.",
            q.hist_mean(QUEUE),
            ("vllm_request_queue_time_seconds", "mean"),
        ),
        s(
            "queue_time_p95",
            "s",
            "Time a request waits in the engine's queue, 95th percentile.",
            q.quantile(0.95, QUEUE),
            ("vllm_request_queue_time_seconds", "p95"),
        ),
        s(
            "prefill_time_mean",
            "s",
            "Time from scheduling to the first token (prefill), mean.",
            q.hist_mean(PREFILL),
            ("vllm_request_prefill_time_seconds", "mean"),
        ),
        s(
            "prefill_time_p95",
            "s",
            "Prefill time, 95th percentile.",
            q.quantile(0.95, PREFILL),
            ("vllm_request_prefill_time_seconds", "p95"),
        ),
        s(
            "decode_time_mean",
            "s",
            "Time from the first to the last token (decode), mean.",
            q.hist_mean(DECODE),
            ("vllm_request_decode_time_seconds", "mean"),
        ),
        s(
            "frontend_time_mean",
            "s",
            "TTFT not spent queued or prefilling in the engine: tokenization and API-server "
            "overhead, mean.",
            q.difference(q.hist_mean(TTFT), q.total(q.hist_mean(QUEUE), q.hist_mean(PREFILL))),
            ("vllm_frontend_time_seconds", "mean"),
        ),
        s(
            "prefill_seconds_per_prompt_token",
            "s",
            "Mean prefill time divided by mean prompt length: rises when prefill grows faster "
            "than the prompt (attention at long context).",
            q.ratio(q.hist_mean(PREFILL), q.hist_mean(PROMPT)),
            ("vllm_prefill_seconds_per_prompt_token", "mean"),
        ),
        # traffic and outcome
        s(
            "request_rate",
            "req/s",
            "Finished requests per second, every finish reason.",
            request_rate,
            ("vllm_request_success", "rate"),
        ),
        s(
            "finished_rate_by_reason",
            "req/s",
            "Finished requests per second by finished_reason.",
            q.counter_rate_by(SUCCESS, "finished_reason"),
            ("vllm_request_success_by_reason", "rate"),
        ),
        s(
            "finished_share_by_reason",
            "ratio",
            "Share of finished requests by finished_reason.",
            q.share_by(SUCCESS, "finished_reason"),
            ("vllm_request_success_by_reason", "share"),
        ),
        s(
            "finished_length_share",
            "ratio",
            'Share of requests that stopped at max_tokens (finished_reason="length").',
            q.share_of(SUCCESS, ('finished_reason="length"',)),
            ("vllm_request_success_length", "share"),
        ),
        s(
            "finished_error_share",
            "ratio",
            "Share of requests that finished with an engine error (vLLM >= 0.14; 0 before).",
            q.share_of(SUCCESS, ('finished_reason="error"',), zero_if_absent=True),
            ("vllm_request_success_error", "share"),
        ),
        s(
            "prompt_tokens_rate",
            "tokens/s",
            "Prompt tokens per second (cached ones included).",
            q.counter_rate("vllm:prompt_tokens_total"),
            ("vllm_prompt_tokens", "rate"),
        ),
        s(
            "generation_tokens_rate",
            "tokens/s",
            "Generated tokens per second.",
            q.counter_rate("vllm:generation_tokens_total"),
            ("vllm_generation_tokens", "rate"),
        ),
        s(
            "prompt_tokens_per_request",
            "tokens",
            "Prompt tokens per finished request, mean.",
            q.hist_mean(PROMPT),
            ("vllm_request_prompt_tokens", "mean"),
        ),
        s(
            "prompt_tokens_p50",
            "tokens",
            "Prompt tokens per request, median.",
            q.quantile(0.5, PROMPT),
            ("vllm_request_prompt_tokens", "p50"),
        ),
        s(
            "prompt_tokens_p95",
            "tokens",
            "Prompt tokens per request, 95th percentile.",
            q.quantile(0.95, PROMPT),
            ("vllm_request_prompt_tokens", "p95"),
        ),
        s(
            "prompt_tokens_p99",
            "tokens",
            "Prompt tokens per request, 99th percentile.",
            q.quantile(0.99, PROMPT),
            ("vllm_request_prompt_tokens", "p99"),
        ),
        s(
            "generation_tokens_per_request",
            "tokens",
            "Output tokens per finished request, mean.",
            q.hist_mean(GENERATION),
            ("vllm_request_generation_tokens", "mean"),
        ),
        s(
            "max_tokens_per_request",
            "tokens",
            "The max_tokens requests asked for, mean.",
            q.hist_mean(MAX_TOKENS),
            ("vllm_request_params_max_tokens", "mean"),
        ),
        # scheduler and KV cache
        s(
            "requests_running",
            "requests",
            "Requests in the running batch, summed over engines.",
            q.gauge("sum", "vllm:num_requests_running"),
            ("vllm_num_requests_running", "sum"),
            per_instance=True,
        ),
        s(
            "requests_waiting",
            "requests",
            "Requests waiting to be scheduled.",
            q.gauge("sum", "vllm:num_requests_waiting"),
            ("vllm_num_requests_waiting", "sum"),
            per_instance=True,
        ),
        s(
            "requests_waiting_by_reason",
            "requests",
            "Waiting requests by reason: capacity or deferred (vLLM >= 0.25).",
            q.gauge_by("sum", "vllm:num_requests_waiting_by_reason", "reason"),
            ("vllm_num_requests_waiting_by_reason", "sum"),
        ),
        s(
            "kv_cache_usage",
            "ratio",
            "KV-cache blocks in use (0-1), the fullest engine.",
            q.gauge("max", *KV_USAGE),
            ("vllm_kv_cache_usage", "max"),
            per_instance=True,
        ),
        s(
            "preemptions_rate",
            "1/s",
            "Preemptions per second (preempted requests recompute).",
            q.counter_rate(PREEMPTIONS),
            ("vllm_num_preemptions", "rate"),
        ),
        s(
            "preemptions_per_request",
            "ratio",
            "Preemptions per finished request.",
            q.ratio(q.counter_rate(PREEMPTIONS), request_rate),
            ("vllm_num_preemptions_per_request", "ratio"),
        ),
        s(
            "tokens_per_step_mean",
            "tokens",
            "Tokens computed per engine step (prefill plus decode), mean.",
            q.hist_mean(STEP_TOKENS),
            ("vllm_iteration_tokens", "mean"),
        ),
        s(
            "tokens_per_step_p99",
            "tokens",
            "Tokens per engine step, 99th percentile (16384 means a larger step).",
            q.quantile(0.99, STEP_TOKENS),
            ("vllm_iteration_tokens", "p99"),
        ),
        s(
            "large_steps_rate",
            "1/s",
            "Engine steps per second with more than 4096 tokens: whole long prefills in one "
            "step (possible only when --max-num-batched-tokens is above 4096).",
            q.rate_above(STEP_TOKENS, "4096.0"),
            ("vllm_iteration_tokens_over_4096", "rate"),
        ),
        s(
            "engine_steps_rate",
            "1/s",
            "Engine steps per second.",
            q.hist_rate(STEP_TOKENS),
            ("vllm_iteration_steps", "rate"),
        ),
        s(
            "prefix_cache_hit_rate",
            "ratio",
            "Share of prompt tokens served from the prefix cache.",
            q.ratio(q.counter_rate(*PREFIX_HITS), q.counter_rate(*PREFIX_QUERIES)),
            ("vllm_prefix_cache_hit", "ratio"),
        ),
        s(
            "engine_restarts",
            "restarts",
            "API-server restarts in the window (process start time changed, or counters reset).",
            q.either(q.on_targets(_api_restarts), q.counter_resets(SUCCESS)),
            ("vllm_restarts", "changes"),
            per_instance=True,
        ),
        # API server
        s(
            "http_request_rate",
            "req/s",
            "HTTP requests per second on the completion handlers.",
            _api_requests(None),
            ("vllm_http_requests", "rate"),
        ),
        s(
            "http_4xx_share",
            "ratio",
            "Share of completion requests answered 4xx (e.g. too long).",
            q.ratio(_api_requests("4xx"), _api_requests(None)),
            ("vllm_http_requests_4xx", "share"),
        ),
        s(
            "http_5xx_share",
            "ratio",
            "Share of completion requests answered 5xx.",
            q.ratio(_api_requests("5xx"), _api_requests(None)),
            ("vllm_http_requests_5xx", "share"),
        ),
        s(
            "api_server_cpu",
            "cores",
            "API-server CPU in cores, the busiest server; near 1 a single process is saturated.",
            q.on_targets(_api_cpu, fn="max"),
            ("vllm_api_server_cpu", "max"),
            per_instance=True,
        ),
        # GPU (DCGM)
        s(
            "gpu_utilization",
            "ratio",
            "Share of time any kernel ran on the model's GPUs (DCGM), mean; not compute used.",
            q.on_gpus(_gpu_util),
            ("dcgm_gpu_utilization", "avg"),
        ),
        s(
            "gpu_memory_used_bytes",
            "bytes",
            "GPU framebuffer used (DCGM), the fullest GPU.",
            q.on_gpus(_gpu_fb_used, fn="max"),
            ("dcgm_fb_used_bytes", "max"),
        ),
        s(
            "gpu_memory_used_share",
            "ratio",
            "GPU framebuffer used over total (DCGM), fullest GPU.",
            q.on_gpus(_gpu_fb_share, fn="max"),
            ("dcgm_fb_used", "share"),
        ),
        # SLOs
        s(
            "ttft_slo_attainment",
            "ratio",
            f"Share of requests with TTFT <= {ttft_slo:g} s (a bucket boundary).",
            ttft_slo_expr,
            ("vllm_time_to_first_token_seconds", "slo_attainment"),
        ),
        s(
            "itl_slo_attainment",
            "ratio",
            f"Share of output tokens with ITL <= {itl_slo:g} s (a bucket boundary).",
            itl_slo_expr,
            ("vllm_inter_token_latency_seconds", "slo_attainment"),
        ),
        s(
            "itl_stall_share",
            "ratio",
            f"Share of output tokens that came more than {ITL_STALL:g} s after the previous one: "
            "stalled streams, counted even when too few to move the ITL p99.",
            lambda sc: f"1 - ({slo_attainment(ITL, ITL_STALL, metrics.ITL_BUCKETS)(sc)})",
            ("vllm_inter_token_latency_seconds", "stall_share"),
        ),
        s(
            "goodput_rate",
            "req/s",
            "Requests per second meeting the TTFT SLO, scaled by the ITL SLO attainment "
            "(an estimate: vLLM exposes the two distributions separately).",
            lambda sc: f"({request_rate(sc)}) * ({ttft_slo_expr(sc)}) * ({itl_slo_expr(sc)})",
            ("vllm_goodput", "rate"),
        ),
        # synthetic probe (client side)
        s(
            "probe_ttft_p50",
            "s",
            "Client-side TTFT (probe), median over prompt buckets.",
            _probe_quantile(0.5, PROBE_TTFT, by_bucket=False),
            ("llm_probe_ttft_seconds", "p50"),
        ),
        s(
            "probe_ttft_p95",
            "s",
            "Client-side TTFT (probe), 95th percentile.",
            _probe_quantile(0.95, PROBE_TTFT, by_bucket=False),
            ("llm_probe_ttft_seconds", "p95"),
        ),
        s(
            "probe_ttft_p50_by_bucket",
            "s",
            "Client-side TTFT median per prompt-length bucket.",
            _probe_quantile(0.5, PROBE_TTFT, by_bucket=True),
            ("llm_probe_ttft_seconds_by_bucket", "p50"),
        ),
        s(
            "probe_ttft_p95_by_bucket",
            "s",
            "Client-side TTFT p95 per prompt-length bucket.",
            _probe_quantile(0.95, PROBE_TTFT, by_bucket=True),
            ("llm_probe_ttft_seconds_by_bucket", "p95"),
        ),
        s(
            "probe_itl_p95_by_bucket",
            "s",
            "Client-side ITL p95 per prompt-length bucket.",
            _probe_quantile(0.95, PROBE_ITL, by_bucket=True),
            ("llm_probe_itl_seconds_by_bucket", "p95"),
        ),
        s(
            "probe_e2e_p50",
            "s",
            "Client-side end-to-end latency (probe), median.",
            _probe_quantile(0.5, PROBE_E2E, by_bucket=False),
            ("llm_probe_e2e_seconds", "p50"),
        ),
        s(
            "probe_error_share",
            "ratio",
            "Share of probe requests that did not end ok.",
            q.ratio(
                q.on_probe(q.counter_rate(PROBE_REQUESTS, extra=('outcome!="ok"',))),
                q.on_probe(q.counter_rate(PROBE_REQUESTS)),
            ),
            ("llm_probe_requests_failed", "share"),
        ),
        s(
            "ttft_outside_engine",
            "s",
            "Client-side TTFT p95 of the fastest prompt class minus server-side TTFT p95: time "
            "lost outside the engine (the fastest class, so slow prefill of long probe prompts "
            "does not count as lost).",
            q.difference(
                lambda sc: q.agg("min", sc, _probe_quantile(0.95, PROBE_TTFT, by_bucket=True)(sc)),
                q.quantile(0.95, TTFT),
            ),
            ("llm_probe_ttft_outside_engine_seconds", "p95"),
        ),
        s(
            "probe_first_token_share_of_e2e",
            "ratio",
            "Client-side TTFT over end-to-end (means per prompt class, the lowest class): near "
            "1 when even short prompts' streams arrive in one burst at the end (a buffering "
            "proxy); long prompts' prefill alone does not raise it.",
            _first_token_share,
            ("llm_probe_ttft_over_e2e", "ratio"),
        ),
        # scrape health
        s(
            "target_up",
            "ratio",
            "Scrape health of each target (1 up, 0 down).",
            lambda sc: f"max by (job, instance) ({q.selector('up', sc.target_matchers())})",
            ("up", "max"),
            by=("job", "instance"),
        ),
    ]
    return out


class Vocabulary:
    """The signals by name, rendered with one set of SLO thresholds."""

    def __init__(self, ttft_slo: float = DEFAULT_TTFT_SLO, itl_slo: float = DEFAULT_ITL_SLO):
        signals = _vocabulary(ttft_slo, itl_slo)
        self._signals = {sig.name: sig for sig in signals}
        if len(self._signals) != len(signals):
            raise AssertionError("duplicate signal names")

    def __getitem__(self, name: str) -> Signal:
        try:
            return self._signals[name]
        except KeyError:
            raise KeyError(f"unknown signal {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._signals

    def __iter__(self) -> Iterator[Signal]:
        return iter(self._signals.values())

    def names(self) -> list[str]:
        return list(self._signals)


SIGNALS = Vocabulary()
