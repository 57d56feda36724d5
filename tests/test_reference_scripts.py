"""scripts/vllm-metrics-reference and scripts/sglang-metrics-reference on small wheels built
here: the families a wheel declares, and one line with exit status 2 for a wheel that is not
one, lacks the metrics module, or has a source file that does not parse."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VLLM = ROOT / "scripts" / "vllm-metrics-reference"
SGLANG = ROOT / "scripts" / "sglang-metrics-reference"

LOGGERS = """\
from prometheus_client import Counter, Gauge, Histogram


class PrometheusStatLogger:
    _gauge_cls = Gauge
    _counter_cls = Counter
    _histogram_cls = Histogram

    def __init__(self, vllm_config, engine_indexes=None):
        labelnames = ["model_name", "engine"]
        self.show_hidden_metrics = vllm_config.observability_config.show_hidden_metrics
        self.gauge_running = self._gauge_cls(
            name="vllm:num_requests_running",
            documentation="Number of requests in model execution batches.",
            multiprocess_mode="mostrecent",
            labelnames=labelnames,
        )
        self.counter_success = self._counter_cls(
            name="vllm:request_success",
            documentation="Count of successfully processed requests.",
            labelnames=labelnames + ["finished_reason"],
        )
        self.histogram_ttft = self._histogram_cls(
            name="vllm:time_to_first_token_seconds",
            documentation="Histogram of time to first token in seconds.",
            buckets=[0.001, 0.005, 0.01],
            labelnames=labelnames,
        )
        if self.show_hidden_metrics:
            self.gauge_old = self._gauge_cls(
                name="vllm:gpu_cache_usage_perc",
                documentation="GPU KV-cache usage.",
                labelnames=labelnames,
            )
"""


def wheel(tmp_path: Path, files: dict[str, str], name: str = "vllm-9.9.0-py3-none-any.whl") -> Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as z:
        for member, text in files.items():
            z.writestr(member, text)
    return path


def run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60
    )


def test_reads_the_families_a_wheel_declares(tmp_path):
    whl = wheel(tmp_path, {"vllm/v1/metrics/loggers.py": LOGGERS})
    res = run(VLLM, "9.9.0", "--wheel", str(whl), "--stdout")
    assert res.returncode == 0, res.stderr
    families = json.loads(res.stdout)["families"]
    assert families["vllm:request_success_total"]["type"] == "counter"
    assert families["vllm:request_success_total"]["labels"] == [
        "model_name",
        "engine",
        "finished_reason",
    ]
    assert families["vllm:time_to_first_token_seconds"]["buckets"] == [0.001, 0.005, 0.01]
    assert families["vllm:gpu_cache_usage_perc"]["hidden"]
    assert not families["vllm:num_requests_running"]["hidden"]


def test_writes_tests_data_only_where_told(tmp_path):
    whl = wheel(tmp_path, {"vllm/v1/metrics/loggers.py": LOGGERS})
    out = tmp_path / "ref.json"
    res = run(VLLM, "9.9.0", "--wheel", str(whl), "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text())["version"] == "9.9.0"
    assert not (ROOT / "tests" / "data" / "vllm-9.9.0.json").exists()


@pytest.mark.parametrize(
    ("script", "files", "says"),
    [
        (VLLM, None, "not a readable wheel"),
        (VLLM, {"vllm/__init__.py": ""}, "no vllm/v1/metrics/loggers.py in the wheel"),
        (VLLM, {"vllm/v1/metrics/loggers.py": "def broken(:\n"}, "does not parse"),
        (SGLANG, {"sglang/__init__.py": ""}, "in the wheel"),
    ],
)
def test_bad_wheels_get_one_line_and_exit_2(tmp_path, script, files, says):
    if files is None:
        whl = tmp_path / "vllm-9.9.0-py3-none-any.whl"
        whl.write_text("not a zip")
    else:
        whl = wheel(tmp_path, files)
    res = run(script, "9.9.0", "--wheel", str(whl), "--stdout")
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.count("\n") == 1 and says in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_a_missing_wheel_file_is_one_line(tmp_path):
    res = run(VLLM, "9.9.0", "--wheel", str(tmp_path / "nope.whl"), "--stdout")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "nope.whl" in res.stderr


COLLECTOR = """\
from prometheus_client import Counter, Gauge

from sglang.srt.utils.gauge_histogram import GaugeHistogram


class SchedulerMetricsCollector:
    def __init__(self, labels):
        self.num_running_reqs = Gauge(
            name="sglang:num_running_reqs",
            documentation="The number of running requests.",
            labelnames=labels.keys(),
            multiprocess_mode="mostrecent",
        )
        self.routing_key_running_req_count = GaugeHistogram(
            name="sglang:routing_key_running_req_count",
            documentation="Distribution of routing keys by running request count.",
            labelnames=list(labels.keys()),
            bucket_bounds=[1, 2, 5],
        )



def scheduler_collector(served_model_name):
    return SchedulerMetricsCollector(labels={"model_name": served_model_name, "tp_rank": 0})
"""


def test_reads_sglangs_gauge_histograms_as_gauges_with_gt_and_le(tmp_path):
    whl = wheel(
        tmp_path,
        {"sglang/srt/observability/metrics_collector.py": COLLECTOR},
        name="sglang-9.9.0-py3-none-any.whl",
    )
    res = run(SGLANG, "9.9.0", "--wheel", str(whl), "--stdout")
    assert res.returncode == 0, res.stderr
    families = json.loads(res.stdout)["families"]
    assert families["sglang:num_running_reqs"]["labels"] == ["model_name", "tp_rank"]
    hist = families["sglang:routing_key_running_req_count"]
    assert hist["type"] == "gauge"
    assert hist["labels"] == ["model_name", "tp_rank", "gt", "le"]
    assert hist["multiprocess_mode"] == "mostrecent"
