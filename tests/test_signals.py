"""The signal vocabulary: real metric names, and PromQL that avoids the known dashboard bugs."""

from __future__ import annotations

import re

import pytest
from conftest import data_json

from diagnoser.metrics import buckets
from diagnoser.metrics import families as metrics
from diagnoser.metrics.promql import Scope
from diagnoser.metrics.signals import SIGNALS, Vocabulary
from diagnoser.metrics.signals.base import _family_re

TYPED = ("counter", "gauge", "histogram", "renamed", "untyped")


@pytest.fixture(scope="module")
def reference() -> dict[str, str]:
    """Metric name -> type from the engine reference (tests/data; scripts/extract-reference),
    and every family vLLM 0.33's own code registers, optional features included (read from
    the wheel by scripts/vllm-metrics-reference), and SGLang's from its wheel
    (scripts/sglang-metrics-reference)."""
    types: dict[str, str] = data_json("reference-metric-types.json")
    for name, fam in data_json("vllm-0.33.0.json")["families"].items():
        # The wheel's type where the reference's prose gives none it can parse
        # (vllm:lora_requests_info: "gauge, value = wall-clock timestamp").
        if fam["scope"] != "v0-engine" and fam["type"] in TYPED and types.get(name) not in TYPED:
            types[name] = fam["type"]
    sglang = data_json("sglang-0.5.23.json")["families"]
    types.update({name: fam["type"] for name, fam in sglang.items()})
    for exporter in data_json("platform-metrics.json")["exporters"].values():
        types.update({name: fam["type"] for name, fam in exporter["families"].items()})
    return types


def used_names() -> set[str]:
    names: set[str] = set()
    for sig in SIGNALS:
        for by in (sig.by, (*sig.by, "instance")):
            names |= set(_family_re().findall(sig.render(Scope(by=by))))
    return names


def test_the_reference_parses(reference):
    assert reference["vllm:num_preemptions_total"] == "counter"
    assert reference["vllm:time_to_first_token_seconds"] == "histogram"
    assert reference["vllm:kv_cache_usage_perc"] == "gauge"
    assert reference["DCGM_FI_DEV_FB_FREE"] == "gauge"
    assert "vllm:gpu_cache_usage_perc" in reference


def test_every_metric_name_used_is_a_real_exposed_name(reference):
    for raw in sorted(used_names() - {"up"}):
        fam = raw
        for suffix in ("_bucket", "_sum", "_count"):
            if raw.endswith(suffix) and raw[: -len(suffix)] in reference:
                fam = raw[: -len(suffix)]
                assert reference[fam] in ("histogram", "renamed"), (
                    f"{raw}: {fam} is not a histogram"
                )
        kind = reference.get(fam)
        assert kind in TYPED, (
            f"{raw} is not a metric vLLM, SGLang, DCGM, the probe or the platform exposes"
        )
        if kind != "renamed":
            assert metrics.family(fam).type == kind, f"{fam}: the reference says {kind}"
        if fam == raw:
            assert reference[fam] != "histogram", f"{raw}: a histogram needs _bucket/_sum/_count"


def test_every_counter_is_queried_with_total_and_through_rate():
    for sig in SIGNALS:
        text = sig.render()
        for fam in sig.families:
            f = metrics.family(fam)
            if f.type in ("counter", "untyped"):
                # dcgm-exporter's counters and node-exporter's vmstat fields carry no _total
                if f.provider not in ("dcgm-exporter", "node-exporter"):
                    assert fam.endswith("_total"), fam
                for m in re.finditer(r"(?<![\w:])" + re.escape(fam) + r"\b", text):
                    before = text[: m.start()]
                    assert re.search(r"(rate|resets|increase)\($", before), (sig.name, fam)


def test_quantiles_always_sum_buckets_by_le():
    for sig in SIGNALS:
        text = sig.render(Scope(by=("model_name", "instance")))
        for m in re.finditer(r"histogram_quantile\([0-9.]+, (.*)", text):
            assert m.group(1).startswith("sum by (le, "), sig.name


def _parenthesised(text: str) -> str:
    """The parenthesised group at the start of ``text``, without its closing paren."""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return text[:i]
    raise AssertionError(f"unbalanced: {text[:60]}")


def test_every_division_is_guarded():
    for sig in SIGNALS:
        text = sig.render()
        for m in re.finditer(r" / ", text):
            rest = re.sub(
                r"^(ignoring|on) \([a-z_, ]*\) (group_left \([a-z_, ]*\) )?", "", text[m.end() :]
            )
            if rest.startswith("100"):
                continue  # DCGM's percent to a ratio
            assert rest.startswith("("), (sig.name, rest[:60])
            assert _parenthesised(rest).rstrip().endswith("> 0"), (sig.name, rest[:80])


@pytest.mark.parametrize(
    ("signal", "old", "new"),
    [
        ("kv_cache_usage", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"),
        ("itl_p95", "vllm:time_per_output_token_seconds", "vllm:inter_token_latency_seconds"),
        (
            "prefix_cache_hit_rate",
            "vllm:gpu_prefix_cache_hits_total",
            "vllm:prefix_cache_hits_total",
        ),
    ],
)
def test_renamed_metrics_are_read_under_both_names_newest_first(signal, old, new):
    text = SIGNALS[signal].render()
    assert new in text and old in text
    assert text.index(new) < text.index(old)
    assert " or " in text


def test_signals_aggregate_by_model_and_may_add_instance():
    for sig in SIGNALS:
        if sig.by != ("model_name",):
            continue
        text = sig.render(Scope(by=("model_name", "instance")))
        assert re.search(r"by \(([a-z_]+, )*model_name, instance\)", text), sig.name


def test_api_server_series_are_joined_to_models_not_filtered_by_model():
    scope = Scope(matchers=('model_name="m"', 'job="vllm"'))
    text = SIGNALS["http_5xx_share"].render(scope)
    assert 'http_requests_total{job="vllm", handler=~' in text
    assert "group_left (model_name)" in text
    assert 'vllm:num_requests_running{model_name="m", job="vllm"}' in text


def test_every_signal_has_a_unit_meaning_and_unique_recording_name():
    names = [s.record_name() for s in SIGNALS]
    assert len(names) == len(set(names))
    for sig in SIGNALS:
        assert sig.unit and sig.help.endswith("."), sig.name
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", sig.record_name()), sig.record_name()


def test_slo_thresholds_are_read_at_a_bucket_bound_never_between():
    assert 'le="2.5"' in Vocabulary(ttft_slo=2.5).__getitem__("ttft_slo_attainment").render()
    # Between two bounds: the one below (a stricter threshold), never interpolated.
    off = Vocabulary(ttft_slo=0.3).__getitem__("ttft_slo_attainment").render()
    assert 'le="0.25"' in off and "histogram_quantile" not in off
    assert 'le="0.075"' in Vocabulary(itl_slo=0.09).__getitem__("itl_slo_attainment").render()


@pytest.mark.parametrize(
    ("value", "label"),
    [
        (1.0, "1.0"),
        (0.25, "0.25"),
        (2560, "2560.0"),
        (1_000_000, "1e+06"),
        (float("inf"), "+Inf"),
    ],
)
def test_bucket_bounds_are_formatted_as_prometheus_client_does(value, label):
    assert buckets.le_label(value) == label


def test_token_buckets_follow_vllms_1_2_5_series():
    assert buckets.request_token_buckets(8192)[-3:] == (1000.0, 2000.0, 5000.0)
    assert buckets.request_token_buckets(10000)[-1] == 10000.0


def test_missing_series_can_be_explained():
    assert SIGNALS["gpu_utilization"].provided_by()[0].startswith("NVIDIA dcgm-exporter")
    assert SIGNALS["requests_waiting_by_reason"].provided_by() == ["vLLM >= 0.20"]
    # Renamed families: the new name's first version, the old one's last, hidden or not.
    assert SIGNALS["kv_cache_usage"].provided_by() == [
        "vLLM <= 0.10 (to 0.11 with --show-hidden-metrics-for-version)",
        "vLLM >= 0.9",
    ]
    assert "vLLM <= 0.11 (to 0.14 with --show-hidden-metrics-for-version)" in (
        SIGNALS["itl_p99"].provided_by()
    )


def test_a_subquery_over_a_long_window_runs_at_a_resolution_fitted_to_it():
    """A subquery at the evaluation interval over 47 hours is 11,000 evaluations per step of
    a range query (a year-long diagnose took a minute on one such signal); over an hour or
    less it keeps the server's interval, and over more, a fixed number of points."""
    from diagnoser.metrics import promql as q

    assert q.subquery_range("5m") == "[5m:]"
    assert q.subquery_range("1h") == "[1h:]"
    assert q.subquery_range("$__rate_interval") == "[$__rate_interval:]"
    assert q.subquery_range("2804m") == "[2804m:701s]"
    assert q.subquery_range("3d") == f"[3d:{3 * 86400 // q.SUBQUERY_POINTS}s]"
    subqueries = [s for s in SIGNALS if "[5m:]" in s.render(Scope())]
    assert subqueries, "no signal takes a subquery"
    for sig in subqueries:
        text = sig.render(Scope(window="3d"))
        assert "[3d:]" not in text and text.count("[3d:1080s]") >= 2, sig.name  # vLLM, SGLang


def test_the_platform_families_are_their_exporters_own():
    """Each platform family's type and labels are those its exporter's source declares
    (tests/data/platform-metrics.json names the source and version)."""
    for exporter in data_json("platform-metrics.json")["exporters"].values():
        for name, ref in exporter["families"].items():
            fam = metrics.family(name)
            assert fam.type == ref["type"], name
            assert set(fam.labels) <= set(ref["labels"]), (name, fam.labels)


def test_platform_series_are_joined_to_models_through_their_pod_or_host():
    text = SIGNALS["container_oom_killed"].render(Scope(matchers=('model_name="m"',)))
    assert 'reason="OOMKilled"' in text
    assert "* on (namespace, pod) group_left (model_name)" in text
    # the pod is remembered while its server is down (a crash loop, an eviction)
    assert 'last_over_time(vllm:num_requests_running{model_name="m", pod!=""}[1h])' in text
    hosts = SIGNALS["node_oom_kills"].render()
    assert '"host", "$1", "host_ip"' in hosts and '"host", "$1", "instance"' in hosts
