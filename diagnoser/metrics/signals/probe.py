"""Client-side signals from the synthetic probe (``servediag probe``), scoped by model only:
the probe is a target of its own, often outside the cluster."""

from __future__ import annotations

from diagnoser.metrics import exporters
from diagnoser.metrics import families as F
from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_sglang as sg
from diagnoser.metrics.signals.base import Signal, everywhere, on


def _probe_quantile(p: float, family: str, *, by_bucket: bool) -> q.Expr:
    return q.on_probe(q.quantile(p, family, extra_by=("prompt_bucket",) if by_bucket else ()))


def _first_token_share(scope: q.Scope) -> str:
    """Mean TTFT over mean e2e per prompt class, the lowest class per scope: a long prompt's
    first token is most of its request anyway, so only the short classes tell buffering."""
    per_class = scope.with_by(*scope.by, "prompt_bucket")
    share = q.ratio(
        q.on_probe(q.hist_mean(exporters.PROBE_TTFT.name)),
        q.on_probe(q.hist_mean(exporters.PROBE_E2E.name)),
    )
    return q.agg("min", scope, share(per_class))


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "probe_ttft_p50",
            "s",
            "Client-side TTFT (probe), median over prompt buckets.",
            everywhere(_probe_quantile(0.5, exporters.PROBE_TTFT.name, by_bucket=False)),
            ("llm_probe_ttft_seconds", "p50"),
        ),
        s(
            "probe_ttft_p95",
            "s",
            "Client-side TTFT (probe), 95th percentile.",
            everywhere(_probe_quantile(0.95, exporters.PROBE_TTFT.name, by_bucket=False)),
            ("llm_probe_ttft_seconds", "p95"),
        ),
        s(
            "probe_ttft_p50_by_bucket",
            "s",
            "Client-side TTFT median per prompt-length bucket.",
            everywhere(_probe_quantile(0.5, exporters.PROBE_TTFT.name, by_bucket=True)),
            ("llm_probe_ttft_seconds_by_bucket", "p50"),
        ),
        s(
            "probe_ttft_p95_by_bucket",
            "s",
            "Client-side TTFT p95 per prompt-length bucket.",
            everywhere(_probe_quantile(0.95, exporters.PROBE_TTFT.name, by_bucket=True)),
            ("llm_probe_ttft_seconds_by_bucket", "p95"),
        ),
        s(
            "probe_itl_p95_by_bucket",
            "s",
            "Client-side ITL p95 per prompt-length bucket.",
            everywhere(_probe_quantile(0.95, exporters.PROBE_ITL.name, by_bucket=True)),
            ("llm_probe_itl_seconds_by_bucket", "p95"),
        ),
        s(
            "probe_e2e_p50",
            "s",
            "Client-side end-to-end latency (probe), median.",
            everywhere(_probe_quantile(0.5, exporters.PROBE_E2E.name, by_bucket=False)),
            ("llm_probe_e2e_seconds", "p50"),
        ),
        s(
            "probe_error_share",
            "ratio",
            "Share of probe requests that did not end ok.",
            everywhere(
                q.ratio(
                    q.on_probe(
                        q.counter_rate(exporters.PROBE_REQUESTS.name, extra=('outcome!="ok"',))
                    ),
                    q.on_probe(q.counter_rate(exporters.PROBE_REQUESTS.name)),
                )
            ),
            ("llm_probe_requests_failed", "share"),
        ),
        s(
            "ttft_outside_engine",
            "s",
            "Client-side TTFT p95 of the fastest prompt class minus server-side TTFT p95: time "
            "lost outside the engine (the fastest class, so slow prefill of long probe prompts "
            "does not count as lost).",
            on(
                vllm=q.difference(
                    lambda sc: q.agg(
                        "min",
                        sc,
                        _probe_quantile(0.95, exporters.PROBE_TTFT.name, by_bucket=True)(sc),
                    ),
                    q.quantile(0.95, F.TTFT.name),
                ),
                sglang=q.difference(
                    lambda sc: q.agg(
                        "min",
                        sc,
                        _probe_quantile(0.95, exporters.PROBE_TTFT.name, by_bucket=True)(sc),
                    ),
                    sg.quantile(0.95, SG.TTFT),
                ),
            ),
            ("llm_probe_ttft_outside_engine_seconds", "p95"),
        ),
        s(
            "probe_first_token_share_of_e2e",
            "ratio",
            "Client-side TTFT over end-to-end (means per prompt class, the lowest class): near "
            "1 when even short prompts' streams arrive in one burst at the end (a buffering "
            "proxy); long prompts' prefill alone does not raise it.",
            everywhere(_first_token_share),
            ("llm_probe_ttft_over_e2e", "ratio"),
        ),
    ]
