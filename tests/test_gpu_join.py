"""GPU series meet the models that use them in Kubernetes (through the pod, dcgm-exporter's
pod mapping) and on bare metal (through the host), each GPU counted once, in a real
Prometheus: the signals diagnose reads and the GPU panels of the dashboards."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import grafana_substitute

from diagnoser.metrics.signals import SIGNALS
from diagnoser.sim.scenario import load_scenario
from lab import harness
from lab.promserver import Prometheus, backfill

HERE = Path(__file__).resolve().parent
BARE_METAL = load_scenario(HERE / "scenarios" / "bare-metal.yaml")


@pytest.fixture(scope="module")
def bare_metal(tmp_path_factory):
    prepared = harness.prepare([BARE_METAL], tmp_path_factory.mktemp("bare-metal"))
    done = prepared[BARE_METAL.name]
    prom = Prometheus(done.data_dir).start()
    yield prom, done.end
    prom.close()


@pytest.mark.prometheus
def test_the_bare_metal_scenario_has_no_pod_labels(bare_metal):
    prom, end = bare_metal
    for family in ("vllm:num_requests_running", "DCGM_FI_DEV_GPU_UTIL"):
        series = prom.query(family, at=end)
        assert series and all("pod" not in s["metric"] for s in series), family
        assert all("namespace" not in s["metric"] for s in series), family


@pytest.mark.prometheus
def test_the_gpu_panels_show_data_on_bare_metal(bare_metal):
    prom, end = bare_metal
    board = json.loads((HERE.parent / "dashboards" / "gpu-frontend.json").read_text())
    gpu = [
        (p["title"], t["expr"])
        for p in board["panels"]
        if p["type"] != "row"
        for t in p["targets"]
        if "DCGM_" in t["expr"]
        # The faults panel reads counters DCGM exports only where enabled, and faults: none here.
        and p["title"] != "Node and GPU faults"
    ]
    assert len(gpu) == 6
    empty = [title for title, expr in gpu if not prom.query(grafana_substitute(expr), at=end)]
    assert not empty, f"GPU panels with no data on bare metal: {empty}"


@pytest.mark.prometheus
@pytest.mark.parametrize("where", ["bare-metal", "kubernetes"])
def test_each_gpu_is_counted_once(where, bare_metal, scenario_library, prometheus_for):
    if where == "bare-metal":
        prom, end = bare_metal
    else:
        prom, end = prometheus_for("healthy-steady"), scenario_library["healthy-steady"].end
    (watts,) = prom.query(SIGNALS["gpu_power_watts"].render(), at=end)
    (total,) = prom.query("sum(DCGM_FI_DEV_POWER_USAGE)", at=end)
    assert float(watts["value"][1]) == pytest.approx(float(total["value"][1]))
    assert float(total["value"][1]) > 2 * 50  # two GPUs, each drawing more than idle


MIXED = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{job="vllm",instance="node-a:8000",model_name="m1",engine="0"}} 1 {t}
vllm:num_requests_running{{job="vllm",instance="node-a:8001",model_name="m2",engine="0"}} 1 {t}
vllm:num_requests_running{{job="vllm",instance="node-b:8000",model_name="m1",engine="0"}} 1 {t}
vllm:num_requests_running{{job="vllm",instance="10.1.2.3:8000",namespace="llm",pod="m3-0",\
model_name="m3",engine="0"}} 1 {t}
# TYPE DCGM_FI_DEV_POWER_USAGE gauge
DCGM_FI_DEV_POWER_USAGE{{job="dcgm",instance="node-a:9400",gpu="0",Hostname="node-a"}} 300 {t}
DCGM_FI_DEV_POWER_USAGE{{job="dcgm",instance="node-b:9400",gpu="0",Hostname="node-b"}} 200 {t}
DCGM_FI_DEV_POWER_USAGE{{job="dcgm",instance="node-b:9400",gpu="1",Hostname="node-b"}} 250 {t}
DCGM_FI_DEV_POWER_USAGE{{job="dcgm",instance="gpu-7:9400",gpu="0",Hostname="gpu-7",\
namespace="llm",pod="m3-0",container="vllm"}} 100 {t}
# EOF
"""


@pytest.mark.prometheus
def test_pods_and_hosts_in_one_fleet_and_a_host_shared_by_two_models(tmp_path):
    """m3 runs in Kubernetes (its GPU maps to its pod), m1 on bare metal on node-a and node-b;
    node-a also runs m2, so which of its GPUs serves which model cannot be told: node-a is
    left out (and the query does not fail), node-b's two GPUs are m1's."""
    t = float(int(time.time()) // 60 * 60 - 600)
    om = tmp_path / "mixed.om"
    om.write_text(MIXED.format(t=f"{t:.3f}"))
    backfill(om, tmp_path / "tsdb")
    prom = Prometheus(tmp_path / "tsdb").start()
    try:
        result = prom.query(SIGNALS["gpu_power_watts"].render(), at=t)
    finally:
        prom.close()
    watts = {r["metric"]["model_name"]: float(r["value"][1]) for r in result}
    assert watts == {"m1": 450.0, "m3": 100.0}


def _documented_bare_metal_scrape() -> list[dict]:
    """The commented-out bare-metal example next to the scrape config in deploy/prometheus.yml."""
    import yaml

    blocks, block = [], []
    text = (HERE.parent / "deploy" / "prometheus.yml").read_text()
    for line in [*text.splitlines(), ""]:
        if line.startswith("  # "):
            block.append(line[4:])
        elif block:
            blocks.append("\n".join(block))
            block = []
    (example,) = [b for b in blocks if b.startswith("- job_name:") and "relabel_configs" in b]
    return list(yaml.safe_load(example))


@pytest.mark.prometheus
def test_the_documented_relabelling_gives_vllm_and_dcgm_one_host(tmp_path):
    """Prometheus itself applies the example's relabelling: each vLLM server, scraped by IP,
    gets the instance HOST:PORT of the machine whose dcgm-exporter it shares a host with."""
    import urllib.request

    configs = _documented_bare_metal_scrape()
    with Prometheus(tmp_path / "tsdb", scrape_configs=configs) as prom:
        for _ in range(50):  # the targets appear once discovery has synced
            with urllib.request.urlopen(f"{prom.url}/api/v1/targets", timeout=10) as resp:
                active = json.loads(resp.read())["data"]["activeTargets"]
            if len(active) == 4:
                break
            time.sleep(0.2)
    hosts: dict[str, set[str]] = {}
    for target in active:
        labels = target["labels"]
        hosts.setdefault(labels["job"], set()).add(labels["instance"].rsplit(":", 1)[0])
        assert not any(k.startswith("__") for k in labels), labels
    (dcgm,) = [job for job in hosts if "dcgm" in job]
    (vllm,) = [job for job in hosts if "vllm" in job]
    assert hosts[vllm] == hosts[dcgm] and len(hosts[vllm]) == 2
    assert not any(h[0].isdigit() for h in hosts[vllm])  # names, not the IPs scraped
