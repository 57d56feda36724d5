"""The benchmark's fleet has the shape asked for: its targets, models, clusters and GPUs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lab import fleet

LABELS = re.compile(r'(\w+)="([^"]*)"')
END = 1_800_000_000.0


def _series(path: Path) -> list[tuple[str, dict[str, str]]]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        out.append((name, dict(LABELS.findall(rest.rsplit("}", 1)[0]))))
    return out


@pytest.mark.prometheus
def test_replicated_instances_keep_their_gpus_and_split_between_clusters(tmp_path):
    shape = fleet.Shape(models=1, instances=4, clusters=2, duration="10m")
    _, record = fleet._build_model((0, str(tmp_path), END, shape), keep_text=True)
    one, many = tmp_path / "fleet-0-one.om", tmp_path / "fleet-0.om"
    source, copies = _series(one), _series(many)
    assert len(copies) == record["samples"] == 4 * len(source)
    assert all(labels.get("cluster") for _, labels in copies)
    vllm = {
        (labels["instance"], labels["pod"], labels["cluster"])
        for name, labels in copies
        if name == "up" and labels.get("job") == "vllm"
    }
    assert vllm == {
        ("fleet-0-0:8000", "fleet-0-0", "east"),
        ("fleet-0-1:8000", "fleet-0-1", "east"),
        ("fleet-0-2:8000", "fleet-0-2", "west"),
        ("fleet-0-3:8000", "fleet-0-3", "west"),
    }
    assert {labels["model_name"] for _, labels in copies if "model_name" in labels} == {"fleet-0"}
    # dcgm-exporter's GPU series: one GPU per instance, mapped to its pod, in its cluster.
    gpus = {
        (labels["pod"], labels["UUID"], labels["Hostname"], labels["cluster"])
        for name, labels in copies
        if name == "DCGM_FI_DEV_GPU_UTIL"
    }
    assert gpus == {
        (f"fleet-0-{k}", f"GPU-fleet-0-{k}-0", f"gpu-node-fleet-0-{k}", shape.cluster(k))
        for k in range(4)
    }


@pytest.mark.prometheus
def test_each_model_is_backfilled_into_its_own_blocks(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDIAG_CACHE", str(tmp_path))
    shape = fleet.Shape(models=2, instances=2, duration="10m")
    assert shape.targets == 4
    root = tmp_path / "models"
    built = fleet.build_models(shape, root, END, say=lambda _line: None)
    assert sorted(built) == [0, 1]
    assert not (root / "building").exists()  # no text left behind
    for i in (0, 1):
        metas = list((root / f"model-{i}").glob("*/meta.json"))
        assert len(metas) == 1  # ten minutes: one block per model
        series = json.loads(metas[0].read_text())["stats"]["numSeries"]
        assert series > 2 * 100  # each instance's vLLM and GPU series
    # A fleet's key follows its shape but not its number of models (they share blocks).
    assert fleet.Shape(models=8).model_key() == fleet.Shape(models=16).model_key()
    assert fleet.Shape(instances=8).model_key() != fleet.Shape().model_key()


@pytest.mark.promtool
def test_the_fleet_bench_reads_the_recording_rules_evaluated_over_the_fleet(tmp_path, monkeypatch):
    """The rules' blocks are made once beside the fleet; a Prometheus on both, and a
    VictoriaMetrics that imported both, run diagnose with --recorded-rules, which reads the
    records and says what the raw series say."""
    from lab import fleetbench, fleetstore, fleetvm

    def quiet(_line: str) -> None:
        pass

    monkeypatch.setenv("SERVEDIAG_CACHE", str(tmp_path))
    f = fleet.cached(fleet.Shape(models=1, instances=2, duration="2h"), say=quiet)
    data, seconds = fleetbench.rules_data(f, say=quiet)
    assert seconds is not None and list(data.glob("*/meta.json"))
    assert fleetbench.rules_data(f, say=quiet) == (data, None)  # kept
    with fleetstore.prometheus(f.tsdb) as raw:
        plain = raw.measure(f.end, "30m", (), "whole fleet")
    with fleetstore.prometheus(f.tsdb, data) as store:
        assert store.name == "prometheus+rules" and store.flags == ("--recorded-rules",)
        ruled = store.measure(f.end, "30m", (), "whole fleet")
    assert plain.status == ruled.status == 0, (plain.error, ruled.error)
    assert plain.recorded == 0 and ruled.recorded >= 40
    assert ruled.samples < plain.samples
    assert not fleetbench.differences([plain], [ruled])
    assert "signals recorded" in fleetbench.row(ruled)
    vm, took = fleetvm.vm_data(f, say=quiet, rules=data)
    assert took is not None and fleetvm.vm_data(f, say=quiet, rules=data) == (vm, None)
    with fleetvm.victoria(vm, recorded_rules=True) as store:
        assert store.name == "victoriametrics+rules"
        on_vm = store.measure(f.end, "30m", (), "whole fleet")
    assert on_vm.status == 0 and on_vm.recorded == ruled.recorded, on_vm.error
    assert not fleetbench.differences([plain], [on_vm])
