"""A fleet fixture for speed benchmarks: many instances of several models over a day.

Simulating every instance of a large fleet would measure the simulator, not ``diagnose``.
Each model is simulated once, as one instance; its OpenMetrics is then replicated to
``instances`` instances by relabelling ``instance`` and ``pod``, which gives Prometheus the
series count and shape of a real fleet. One backfill per model writes into one TSDB.
"""

from __future__ import annotations

import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from diagnoser.core.exposition import write_openmetrics
from diagnoser.lab.harness import default_workers
from diagnoser.lab.promserver import backfill
from diagnoser.sim.run import simulate
from diagnoser.sim.scenario import load_scenario

SCENARIO = """\
description: A steady fleet model for speed benchmarks.
duration: {duration}
scrape_interval: 60s
seed: {seed}
labels: {{window: 1h}}
models:
  - name: {name}
    preset: {preset}
    gpu: H100-80GB
    dcgm: false
    workload:
      rate: {{mean: 2.0, shape: diurnal, amplitude: 0.5, start_hour: 0}}
      prompt: {{median: 700, sigma: 0.6}}
      output: {{median: 200, sigma: 0.7}}
"""
PRESETS = ("llama-3.1-8b", "qwen3-8b", "mistral-7b", "llama-2-7b")


def _replicate(src: Path, dst: Path, name: str, copies: int) -> None:
    """Copy every sample line ``copies`` times, one per instance, keeping families contiguous."""
    slug = re.escape(f"{name}-0")
    pattern = re.compile(slug)
    with src.open(encoding="utf-8") as fin, dst.open("w", encoding="utf-8") as fout:
        block: list[str] = []

        def flush() -> None:
            for k in range(copies):
                if k == 0:
                    fout.writelines(block)
                else:
                    fout.writelines(pattern.sub(f"{name}-{k}", line) for line in block)
            block.clear()

        for line in fin:
            if line.startswith("#"):
                flush()
                if line.startswith("# EOF"):
                    break
                fout.write(line)
            else:
                block.append(line)
        flush()
        fout.write("# EOF\n")


def _model(args: tuple[int, str, str, float, int]) -> tuple[str, int]:
    index, workdir, duration, end, instances = args
    name = f"fleet-{index}"
    yaml_path = Path(workdir) / f"{name}.yaml"
    yaml_path.write_text(
        SCENARIO.format(
            duration=duration, seed=100 + index, name=name, preset=PRESETS[index % len(PRESETS)]
        )
    )
    rec = simulate(load_scenario(yaml_path), end)
    one = Path(workdir) / f"{name}-one.om"
    with one.open("w", encoding="utf-8") as fh:
        write_openmetrics(rec, fh)
    many = Path(workdir) / f"{name}.om"
    _replicate(one, many, name, instances)
    one.unlink()
    return str(many), rec.sample_count() * instances


def build(
    workdir: Path, end: float, models: int = 4, instances_per_model: int = 8, duration: str = "24h"
) -> tuple[Path, int]:
    """Write the fleet into ``workdir/tsdb``; returns it and the number of samples."""
    workdir.mkdir(parents=True, exist_ok=True)
    jobs = [(i, str(workdir), duration, end, instances_per_model) for i in range(models)]
    with ProcessPoolExecutor(max_workers=default_workers(models)) as pool:
        done = list(pool.map(_model, jobs))
    tsdb = workdir / "tsdb"
    for om, _samples in done:  # one backfill at a time into the one TSDB
        backfill(Path(om), tsdb, block_hours=24)
        Path(om).unlink()
    return tsdb, sum(samples for _om, samples in done)
