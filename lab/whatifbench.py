"""``make bench``'s what-if figure: one model over a 1-hour window, five levers, timed.

The what-if test scenario's load (a Llama-2-7B on one H100 near what its KV cache carries)
is simulated for 75 minutes into a throwaway Prometheus; ``servediag what-if --since 1h``
with the five levers of kv-cache-pressure's fix then runs as its own process, as an operator
would run it, and its wall time is printed with the time the what-if itself reported
(fit, calibration and the levers' replays, without the process's start), and the CPU time
of the command with its worker processes: on a machine busy with other work the wall time
says little, the CPU time what the what-if costs.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCENARIO = """\
description: The what-if benchmark's load.
duration: 75m
scrape_interval: 15s
seed: 2611
labels: {window: 1h, expect: []}
models:
  - name: llama-2-7b-chat
    preset: llama-2-7b
    gpu: H100-80GB
    instances: 1
    engine:
      max_num_seqs: 256
      max_num_batched_tokens: 2048
      max_model_len: 4096
      gpu_memory_utilization: 0.8
    workload:
      rate: {mean: 4.6, noise: 0.03}
      prompt: {median: 900, sigma: 0.5}
      output: {median: 350, sigma: 0.6}
      max_tokens: 1024
"""
# What the series do not say about the server (the tests' what-if scenarios run the same).
SERVER = (
    "--preset",
    "llama-2-7b",
    "--gpu",
    "H100-80GB",
    "--max-num-seqs",
    "256",
    "--max-num-batched-tokens",
    "2048",
    "--max-model-len",
    "4096",
)
LEVERS = (
    "replicas:+1",
    "max_num_seqs:x0.75",
    "kv_cache_dtype:fp8",
    "gpu_memory_utilization:+0.05",
    "max_num_batched_tokens:x0.5",
)


def command(url: str, end: float) -> list[str]:
    """The what-if command the benchmark times."""
    args = [
        sys.executable,
        "-m",
        "diagnoser",
        "what-if",
        "--prometheus-url",
        url,
        "--since",
        "1h",
        "--until",
        str(int(end)),
        *SERVER,
        "--format",
        "json",
        "--timeout",
        "600",  # the whole what-if is timed, not what a minute allows
    ]
    for lever in LEVERS:
        args += ["--lever", lever]
    return args


def main(argv: list[str] | None = None) -> None:
    from diagnoser.sim.scenario import load_scenario
    from lab.args import refuse

    argv = sys.argv[1:] if argv is None else argv
    if argv:
        refuse("python -m lab.whatifbench", f"takes no arguments (given: {' '.join(argv)})")
    from lab import harness
    from lab.promserver import Prometheus

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "what-if-bench.yaml"
        path.write_text(SCENARIO, encoding="utf-8")
        sc = load_scenario(path)
        prepared = harness.prepare([sc], Path(tmp) / "data")[sc.name]
        with Prometheus(prepared.data_dir) as prom:
            before = _children_cpu()
            t0 = time.perf_counter()
            done = subprocess.run(command(prom.url, prepared.end), capture_output=True, text=True)
            wall = time.perf_counter() - t0
            cpu = _children_cpu() - before
    if done.returncode != 0:
        print(f"what-if: failed (exit {done.returncode}): {done.stderr.strip()}")
        return
    doc = json.loads(done.stdout)
    predicted = sum(1 for lever in doc["levers"] if lever["predicted"])
    print(
        f"what-if (llama-2-7b on H100, 1 h window at {doc['fit']['arrival_rate']['mean']:.1f} "
        f"req/s, {len(LEVERS)} levers, {predicted} predicted, {doc['calibration']['replays']} "
        f"calibration replay(s)): {wall:.1f} s wall, {cpu:.1f} s of CPU over {os.cpu_count()} "
        f"cores ({doc['seconds']:.1f} s calibrating and replaying); target under 10 s wall"
    )


def _children_cpu() -> float:
    """CPU seconds of the finished child processes (the command and its replays' workers)."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


if __name__ == "__main__":
    main()
