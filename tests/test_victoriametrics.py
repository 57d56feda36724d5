"""diagnose against VictoriaMetrics, a second Prometheus-compatible backend: same answer."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.metrics.exposition import iter_openmetrics
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.sim import library
from diagnoser.sim.run import simulate
from lab.promserver import free_port

pytestmark = pytest.mark.prometheus

SCENARIO = "retrieval-launch"


def _prometheus_text_with_ms(rec) -> bytes:
    """VictoriaMetrics imports the Prometheus text format, timestamps in milliseconds."""
    out = []
    for line in iter_openmetrics(rec):
        if line.startswith("#"):
            continue
        body, ts = line.rsplit(" ", 1)
        out.append(f"{body} {int(float(ts) * 1000)}\n")
    return "".join(out).encode()


@pytest.fixture(scope="module")
def victoria(tmp_path_factory):
    exe = shutil.which("victoria-metrics")
    if exe is None:
        pytest.fail("victoria-metrics not found: run scripts/install-deps (Debian package)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            exe,
            f"-storageDataPath={tmp_path_factory.mktemp('vm')}",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y",
            "-search.disableCache",
            "-search.latencyOffset=0s",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).read()
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("victoria-metrics did not start")
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_same_top_finding_from_victoriametrics(victoria, site):
    sc = library.find(SCENARIO)
    end = float(int(time.time()) // 60 * 60)
    body = _prometheus_text_with_ms(simulate(sc, end))
    req = urllib.request.Request(f"{victoria}/api/v1/import/prometheus", data=body, method="POST")
    assert urllib.request.urlopen(req, timeout=60).status == 204
    urllib.request.urlopen(f"{victoria}/internal/force_flush", timeout=30).read()
    probe = f"{victoria}/api/v1/query?query=count(vllm:num_requests_running)&time={end}"
    deadline = time.monotonic() + 30
    while not json.loads(urllib.request.urlopen(probe).read())["data"]["result"]:
        assert time.monotonic() < deadline, "imported series never became queryable"
        time.sleep(0.5)
    doc = to_json(diagnose(PrometheusSource(victoria), site, Window.plan(sc.labels.window, end)))
    assert doc["findings"], doc["undecided"]
    assert doc["findings"][0]["id"] == sc.labels.expect[0]
