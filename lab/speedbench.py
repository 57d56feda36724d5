"""The speed part of ``make bench``: the simulator's step costs against GPU measurements, the
simulator's own speed, and what the command line and the package cost to start."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from diagnoser.catalog import load_catalog
from diagnoser.outputs import rules
from diagnoser.site import Site


def timed(fn: Callable[[], object], runs: int = 5) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


SIM_SCENARIO = """\
description: Benchmark load.
duration: {duration}
scrape_interval: 15s
seed: 1
labels: {{window: 1h}}
models:
  - name: bench
    preset: llama-3.1-8b
    gpu: H100-80GB
    instances: {instances}
    workload:
      rate: {{mean: {rate}}}
      prompt: {{median: 600, sigma: 0.6}}
      output: {{median: 180, sigma: 0.7}}
"""


def bench_step_costs() -> None:
    """Each measured GPU step (tests/data/gpu-step-costs.json) against the engine's price."""
    from lab import calibration

    if not calibration.TABLE.is_file():
        print(f"step costs: no measurements at {calibration.TABLE} (a checkout has them)")
        return
    priced = calibration.price(calibration.load())
    out = sum(not p.within for p in priced)
    print(
        f"step costs, simulated vs measured ({calibration.MODEL} on one {calibration.GPU}, "
        f"{len(priced)} steps, {out} out of bounds):"
    )
    for line in calibration.table(priced):
        print(f"  {line}")
    from lab.real import stepcosts

    if stepcosts.OUT.is_file():
        cpu = stepcosts.price()
        worst = max(max(r.ratio, 1 / r.ratio) for r in cpu)
        print(
            f"step costs on the CPU device, simulated vs measured on vLLM's CPU build "
            f"({len(cpu)} steps of two models, worst {worst:.2f}x off):"
        )
        print("\n".join(stepcosts.table(cpu)))


def bench_simulator() -> None:
    import tempfile
    from pathlib import Path

    from diagnoser.sim.run import simulate
    from diagnoser.sim.scenario import load_scenario

    print("simulator (llama-3.1-8b on H100, 600-token prompts, 180-token answers, 15 s scrapes):")
    with tempfile.TemporaryDirectory() as tmp:
        for instances, rate_per_instance in ((1, 5), (1, 20), (1, 50), (8, 20)):
            path = Path(tmp) / "b.yaml"
            path.write_text(
                SIM_SCENARIO.format(
                    duration="1h", instances=instances, rate=rate_per_instance * instances
                )
            )
            sc = load_scenario(path)
            t0 = time.perf_counter()
            rec = simulate(sc, end=1_800_000_000.0)
            wall = time.perf_counter() - t0
            print(
                f"  {instances} instance(s) x {rate_per_instance:>2} req/s, 1 h: "
                f"{wall:6.2f} s wall, {3600 / wall:6.0f}x real time, "
                f"{3600 * instances / wall:6.0f} instance-seconds/s, "
                f"{rec.sample_count() / 1e6:.2f} M samples"
            )


def bench_startup() -> None:
    """Loading the catalog, rendering the rules, and the command line's start-up times."""
    catalog = load_catalog()
    load_s = timed(load_catalog)
    site = Site.default()
    render_s = timed(lambda: rules.render_files(site))

    def cli(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "diagnoser", *args], check=True, capture_output=True)

    help_s = timed(lambda: cli("--help"))
    diag_help_s = timed(lambda: cli("diagnose", "--help"), runs=3)
    list_s = timed(lambda: cli("catalog", "list"))
    files = rules.render_files(site)
    n_rec = files[rules.RECORDING_FILE].count("- record:")
    n_alert = files[rules.ALERTS_FILE].count("- alert:")
    print(f"catalog load ({len(catalog)} playbooks, schema-validated): {load_s * 1000:.0f} ms")
    print(f"rules render ({n_rec} recording, {n_alert} alerting): {render_s * 1000:.0f} ms")
    print(f"servediag --help (process start to exit): {help_s * 1000:.0f} ms")
    print(f"servediag diagnose --help: {diag_help_s * 1000:.0f} ms")
    print(f"servediag catalog list: {list_s * 1000:.0f} ms")
    bench_imports()


def bench_imports() -> None:
    """What importing the package costs, and what pandas would add if it were imported
    (it is not: only ``Diagnosis.to_frame()`` and ``findings_frame()`` import it)."""

    def python(code: str) -> None:
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)

    bare_s = timed(lambda: python("pass"))
    pkg_s = timed(lambda: python("import diagnoser, diagnoser.api"))
    frames_s = timed(lambda: python("import diagnoser, diagnoser.api, pandas"))
    print(
        f"import diagnoser: {(pkg_s - bare_s) * 1000:.0f} ms over Python's own start "
        f"({bare_s * 1000:.0f} ms); with pandas it would be {(frames_s - bare_s) * 1000:.0f} ms"
    )
