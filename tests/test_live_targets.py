"""The live simulator as Prometheus scrapes real targets: each on its own path, no target
labels in any exposition, service discovery giving job, instance, namespace and pod."""

from __future__ import annotations

import json
import re
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from live_simulator import live_simulator

from diagnoser.sim.scenario import load_scenario
from lab.promserver import Prometheus

SCENARIO = """\
description: Two replicas of one model, a node exporter each, and a probe, served live.
duration: 10m
scrape_interval: 1s
seed: 3
labels: {window: 5m, expect: [], absent: []}
models:
  - name: twin
    preset: llama-3.1-8b
    gpu: H100-80GB
    instances: 2
    probe: {enabled: true, every: 5s}
    workload:
      rate: {mean: 4}
      prompt: {median: 400, sigma: 0.4}
      output: {median: 60, sigma: 0.4}
"""
TARGET_LABELS = {"job", "instance", "namespace", "pod"}


@pytest.fixture
def live(tmp_path: Path):
    path = tmp_path / "twin.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    with live_simulator(load_scenario(path)) as address:
        time.sleep(1.5)  # the first scrape of the simulation
        yield address


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_every_target_has_its_own_path_and_no_target_labels(live):
    status, body = _get(f"http://{live}/targets")
    assert status == 200
    groups = json.loads(body)
    paths = {g["labels"]["__metrics_path__"]: g["labels"] for g in groups}
    assert set(paths) == {
        "/servers/twin-0/metrics",
        "/servers/twin-1/metrics",
        "/dcgm/gpu-node-twin-0/metrics",
        "/dcgm/gpu-node-twin-1/metrics",
        "/probe/twin/metrics",
    }
    assert all(g["targets"] == [live] for g in groups)
    assert paths["/servers/twin-1/metrics"] == {
        "__metrics_path__": "/servers/twin-1/metrics",
        "job": "vllm",
        "instance": "twin-1:8000",
        "namespace": "llm",
        "pod": "twin-1",
    }
    for path in paths:
        status, text = _get(f"http://{live}{path}")
        assert status == 200, path
        names = set(re.findall(r'[{,](\w+)="', text))
        assert names and not names & {"job", "instance"}, (path, names & TARGET_LABELS)
        if path.startswith("/servers/"):
            assert not names & TARGET_LABELS and "up{" not in text
            assert "vllm:num_requests_running{" in text
    # Two servers: /metrics cannot stand for "the" server.
    status, text = _get(f"http://{live}/metrics")
    assert status == 404 and "/targets" in text


@pytest.mark.prometheus
def test_prometheus_discovers_the_targets_and_keeps_their_labels(tmp_path, live):
    scrape = {
        "job_name": "vllm",
        "scrape_interval": "1s",
        "http_sd_configs": [{"url": f"http://{live}/targets", "refresh_interval": "1s"}],
    }
    with Prometheus(tmp_path / "prom", scrape_configs=[scrape]) as prom:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            running = prom.query("vllm:num_requests_running")
            ups = {(r["metric"]["job"], r["metric"]["instance"]) for r in prom.query("up == 1")}
            if len({r["metric"].get("pod") for r in running}) == 2 and len(ups) == 5:
                break
            time.sleep(0.5)
        assert ups == {
            ("vllm", "twin-0:8000"),
            ("vllm", "twin-1:8000"),
            ("dcgm", "gpu-node-twin-0:9400"),
            ("dcgm", "gpu-node-twin-1:9400"),
            ("llm-probe", "llm-probe:9464"),
        }
        labels = {tuple(sorted(r["metric"].items())) for r in running}
        assert {dict(lb)["instance"] for lb in labels} == {"twin-0:8000", "twin-1:8000"}
        for lb in labels:
            assert not any(k.startswith("exported_") for k, _ in lb), lb
        gpu = prom.query("DCGM_FI_DEV_GPU_UTIL")
        assert {r["metric"]["pod"] for r in gpu} == {"twin-0", "twin-1"}
        assert {r["metric"]["job"] for r in gpu} == {"dcgm"}
