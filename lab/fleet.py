"""A fleet for speed benchmarks: many instances of many models over a day, in a Prometheus TSDB.

Simulating every instance of a large fleet would measure the simulator, not ``diagnose``.
Each model is simulated once, as one instance (with dcgm-exporter's GPU series); its
OpenMetrics is then replicated to ``instances`` instances by relabelling ``instance``,
``pod``, the node and the GPU's UUID, and every series gets a ``cluster`` label (the
instances split evenly between the clusters), which gives Prometheus the series count and
shape of a real fleet. The replication streams family by family, and each model is
backfilled on its own and its text deleted, so disk and memory stay bounded by one model.

``cached`` keeps what it builds under ``~/.cache/servediag`` (``SERVEDIAG_CACHE`` elsewhere):
each model's blocks, keyed by the fleet's shape and the simulator's code, and each fleet
assembled from its models' blocks and compacted by Prometheus into one TSDB.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import itertools
import json
import os
import re
import shutil
import textwrap
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from diagnoser.metrics.exposition import write_openmetrics
from diagnoser.sim.run import simulate
from diagnoser.sim.scenario import load_scenario
from lab.harness import default_workers, simulation_digest
from lab.promserver import Prometheus, PrometheusError, backfill

SCENARIO = """\
description: A steady fleet model for speed benchmarks.
duration: {duration}
scrape_interval: {scrape}
seed: {seed}
labels: {{window: 1h}}
models:
  - name: {name}
    preset: {preset}
    gpu: H100-80GB
    dcgm: {dcgm}
    workload:
      rate: {{mean: 2.0, shape: diurnal, amplitude: 0.5, start_hour: 0}}
      prompt: {{median: 700, sigma: 0.6}}
      output: {{median: 200, sigma: 0.7}}
"""
PRESETS = ("llama-3.1-8b", "qwen3-8b", "mistral-7b", "llama-2-7b")
CLUSTERS = ("east", "west", "north", "south")
DAY = 86400
# A sample line's metric name and the brace that opens its labels.
_NAME = re.compile(r"^([^{\s]+)\{", re.MULTILINE)
_BARE = re.compile(r"^([^{\s#]+) ", re.MULTILINE)


@dataclass(frozen=True)
class Shape:
    """What a fleet is: ``models`` models of ``instances`` instances each, split between
    ``clusters`` clusters, ``duration`` of data scraped every ``scrape``."""

    models: int = 16
    instances: int = 32
    clusters: int = 2
    duration: str = "24h"
    scrape: str = "30s"
    dcgm: bool = True

    @property
    def targets(self) -> int:
        return self.models * self.instances

    def text(self) -> str:
        gpu = ", DCGM" if self.dcgm else ""
        return (
            f"{self.models} models x {self.instances} instances = {self.targets} targets in "
            f"{self.clusters} clusters, {self.duration} at {self.scrape} scrapes{gpu}"
        )

    def model_key(self) -> str:
        """The key of one model's blocks: everything but the number of models."""
        parts = {k: v for k, v in asdict(self).items() if k != "models"}
        text = json.dumps(parts, sort_keys=True) + simulation_digest() + _data_code()
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def cluster(self, instance: int) -> str:
        return CLUSTERS[instance * self.clusters // self.instances]


def _data_code() -> str:
    """The code here that decides what the series are (not how they are cached or timed)."""
    code = [
        ast.dump(ast.parse(textwrap.dedent(inspect.getsource(fn))))  # not its layout
        for fn in (replicate, _build_model, model_name, Shape.cluster)
    ]
    return "".join([SCENARIO, *PRESETS, *CLUSTERS, _NAME.pattern, _BARE.pattern, *code])


def model_name(index: int) -> str:
    return f"fleet-{index}"


def replicate(src: Path, dst: Path, name: str, shape: Shape) -> int:
    """Copy every sample line once per instance, families kept contiguous; each copy of the
    instance ``NAME-0`` is renamed ``NAME-k`` wherever it occurs (instance, pod, node, GPU
    UUID) and labelled with its cluster. Returns the number of sample lines written."""
    old = f"{name}-0"
    pattern = re.compile(re.escape(old) + r"(?![0-9])")
    longer = re.compile(re.escape(old) + r"[0-9]")

    def pattern_in_longer(text: str) -> bool:
        return longer.search(text) is not None

    lines = 0
    with src.open(encoding="utf-8") as fin, dst.open("w", encoding="utf-8") as fout:
        block: list[str] = []

        def flush() -> None:
            nonlocal lines
            text = "".join(block)
            block.clear()
            if not text:
                return
            # Plain replacement where every line opens its labels once and the instance's
            # name is nowhere a prefix of another (ten times faster than the patterns).
            plain = text.count("{") == text.count("\n") and not pattern_in_longer(text)
            for k in range(shape.instances):
                cluster = shape.cluster(k)
                if plain:
                    copy = text.replace(old, f"{name}-{k}") if k else text
                    fout.write(copy.replace("{", f'{{cluster="{cluster}",'))
                    continue
                copy = pattern.sub(f"{name}-{k}", text) if k else text
                copy = _NAME.sub(rf'\1{{cluster="{cluster}",', copy)
                fout.write(_BARE.sub(rf'\1{{cluster="{cluster}"}} ', copy))
            lines += text.count("\n") * shape.instances

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
    return lines


def _build_model(
    args: tuple[int, str, float, Shape], keep_text: bool = False
) -> tuple[int, dict[str, float]]:
    """One model simulated, replicated and backfilled into ``workdir/model-I``; its samples
    and the seconds each stage took. The text is deleted as soon as it is backfilled
    (``keep_text``: kept, for a test to read)."""
    index, workdir, end, shape = args
    t0 = time.monotonic()
    name = model_name(index)
    work = Path(workdir)
    yaml_path = work / f"{name}.yaml"
    yaml_path.write_text(
        SCENARIO.format(
            duration=shape.duration,
            scrape=shape.scrape,
            seed=100 + index,
            name=name,
            preset=PRESETS[index % len(PRESETS)],
            dcgm=str(shape.dcgm).lower(),
        )
    )
    rec = simulate(load_scenario(yaml_path), end)
    one = work / f"{name}-one.om"
    with one.open("w", encoding="utf-8") as fh:
        write_openmetrics(rec, fh)
    t1 = time.monotonic()
    many = work / f"{name}.om"
    try:
        samples = replicate(one, many, name, shape)
        t2 = time.monotonic()
        text_bytes = many.stat().st_size
        backfill(many, work / f"model-{index}", block_hours=24)
    finally:
        for path in () if keep_text else (one, many, yaml_path):
            path.unlink(missing_ok=True)
    t3 = time.monotonic()
    return index, {
        "samples": samples,
        "text_bytes": text_bytes,
        "simulate_seconds": t1 - t0,
        "replicate_seconds": t2 - t1,
        "backfill_seconds": t3 - t2,
    }


def cache_root() -> Path:
    return Path(os.environ.get("SERVEDIAG_CACHE") or Path.home() / ".cache" / "servediag")


def fleet_end() -> float:
    """The fleet's end: midnight UTC before now (its models, built on different days, keep
    the end of the first)."""
    return float(int(time.time()) // DAY * DAY)


def build_models(
    shape: Shape, root: Path, end: float, say: Callable[[str], None] = print
) -> dict[int, dict[str, float]]:
    """Every model of ``shape`` not yet in ``root`` built (two at a time on two cores), each
    recorded in ``root/model-I.json``; all models' records."""
    root.mkdir(parents=True, exist_ok=True)
    missing = [i for i in range(shape.models) if not (root / f"model-{i}.json").exists()]
    if missing:
        work = root / "building"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        jobs = [(i, str(work), end, shape) for i in missing]
        with ProcessPoolExecutor(max_workers=default_workers(len(jobs))) as pool:
            for index, record in pool.map(_build_model, jobs):
                final = root / f"model-{index}"
                shutil.rmtree(final, ignore_errors=True)
                (work / f"model-{index}").rename(final)
                (root / f"model-{index}.json").write_text(json.dumps(record))
                say(
                    f"  {model_name(index)}: {record['samples'] / 1e6:.0f} M samples "
                    f"({record['text_bytes'] / 1e9:.1f} GB of text): simulated in "
                    f"{record['simulate_seconds']:.0f} s, replicated in "
                    f"{record['replicate_seconds']:.0f} s, backfilled in "
                    f"{record['backfill_seconds']:.0f} s"
                )
        shutil.rmtree(work, ignore_errors=True)
    return {i: json.loads((root / f"model-{i}.json").read_text()) for i in range(shape.models)}


def _blocks(tsdb: Path) -> list[tuple[int, int]]:
    out = []
    for meta in tsdb.glob("*/meta.json"):
        if "." in meta.parent.name:  # being written, or being deleted
            continue
        doc = json.loads(meta.read_text())
        out.append((int(doc["minTime"]), int(doc["maxTime"])))
    return out


def _overlaps(ranges: list[tuple[int, int]]) -> bool:
    ordered = sorted(ranges)
    return any(b[0] < a[1] for a, b in itertools.pairwise(ordered))


def compact(tsdb: Path, timeout: float = 3600.0) -> None:
    """Let Prometheus merge the overlapping blocks (one per model) into one, as a server that
    had scraped the fleet would hold it; it starts compacting a minute after it starts."""
    with Prometheus(tsdb, startup_timeout=300) as prom:
        deadline = time.monotonic() + timeout
        while _overlaps(_blocks(tsdb)):
            if time.monotonic() > deadline:
                raise PrometheusError(f"{tsdb}: blocks still overlap after {timeout:.0f} s")
            time.sleep(5)
        # The compacted block is in place and the old ones are gone once it reloads.
        url = f"{prom.url}/api/v1/status/tsdb"
        urllib.request.urlopen(url, timeout=60).read()


def count_series(tsdb: Path) -> int:
    """The fleet's series: those of its largest block (every series spans the whole time, and
    the compacted blocks split it)."""
    counts = [
        int(json.loads(m.read_text())["stats"]["numSeries"])
        for m in tsdb.glob("*/meta.json")
        if "." not in m.parent.name
    ]
    return max(counts, default=0)


@dataclass(frozen=True)
class Fleet:
    shape: Shape
    tsdb: Path
    end: float
    samples: int
    series: int
    build_seconds: float  # this call's: the models it built, the assembly, the compaction
    model_seconds: float  # every model's simulation, replication and backfill, summed
    cached: bool


def cached(shape: Shape, say: Callable[[str], None] = print) -> Fleet:
    """The fleet of ``shape``, built (and its models) if the cache does not hold it yet."""
    models = cache_root() / f"fleet-models-{shape.model_key()}"
    key = f"fleet-{shape.model_key()}-{shape.models}"
    home = cache_root() / key
    record = home / "fleet.json"
    if record.exists():
        doc = json.loads(record.read_text())
        return Fleet(
            shape,
            home / "tsdb",
            doc["end"],
            doc["samples"],
            count_series(home / "tsdb"),
            doc["build_seconds"],
            doc.get("model_seconds", 0.0),
            True,
        )
    t0 = time.monotonic()
    models.mkdir(parents=True, exist_ok=True)
    stamp = models / "end"
    if not stamp.exists():
        stamp.write_text(f"{fleet_end():.0f}\n")
    end = float(stamp.read_text())
    say(f"building the fleet ({shape.text()}) into {home}")
    built = build_models(shape, models, end, say)
    tsdb = home / "tsdb"
    shutil.rmtree(home, ignore_errors=True)
    tsdb.mkdir(parents=True)
    for i in range(shape.models):  # the models' blocks, linked (compaction replaces them)
        for block in (models / f"model-{i}").iterdir():
            if (block / "meta.json").exists():
                shutil.copytree(block, tsdb / block.name, copy_function=os.link)
    compact(tsdb)
    series = count_series(tsdb)
    samples = sum(int(r["samples"]) for r in built.values())
    seconds = time.monotonic() - t0
    stages = ("simulate_seconds", "replicate_seconds", "backfill_seconds")
    model_seconds = sum(float(r.get(k, 0.0)) for r in built.values() for k in stages)
    doc = {
        "end": end,
        "samples": samples,
        "series": series,
        "build_seconds": seconds,
        "model_seconds": model_seconds,
    }
    record.write_text(json.dumps(doc))
    return Fleet(shape, tsdb, end, samples, series, seconds, model_seconds, False)
