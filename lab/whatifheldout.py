"""``make bench``'s held-out what-if cases: workloads unlike the scenarios what-if was tuned on.

Each case is one model on two vLLM instances, an hour's window at 30-second scrapes, with a
mix of prompt and output lengths (a second, long class) and bursty arrivals, simulated with a
seed no scenario, test or calibration change uses. ``servediag diagnose --what-if --since 1h``
and ``servediag what-if --since 1h`` (every lever of the catalog) run against each as their
own processes, at the default ``--timeout``, as an on-call engineer would run them; each is
timed and its outcome said: predicted (how many levers), refused (the calibration's reason)
or unfinished (the deadline passed). Then the share of findings with a lever that got
predictions (the prediction coverage), and, for the levers the case names, the error of each
prediction against the scenario simulated at the lever's configuration.

Nothing in what-if is tuned on these cases: they are measured, never fitted to.
"""

from __future__ import annotations

import copy
import json
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The cases: (the scenario, what the series do not say about the servers, the levers whose
# prediction is checked against the scenario run at the lever's configuration).
KV_PRESSURE = """\
description: >-
  Held out. A Llama-2-7B chat model on two H100s: chat turns of about 700 prompt tokens with
  one request in six a document of about 3,000, answers of about 300 tokens with a long tail;
  arrivals come in bursts (twice the rate for 90 s every 7 minutes), and the afternoon's
  load rises until the KV cache of both servers fills and they preempt.
duration: 1h40m
scrape_interval: 30s
seed: 90417
labels: {window: 1h, expect: [kv-cache-pressure]}
models:
  - name: llama-2-7b-chat
    preset: llama-2-7b
    gpu: H100-80GB
    instances: 2
    engine: {max_num_seqs: 256, max_num_batched_tokens: 2048, max_model_len: 4096}
    workload:
      rate: {mean: 3.0, noise: 0.05, burst_every: 420, burst_length: 90, burst_factor: 2.0}
      prompt: {median: 700, sigma: 0.6, long_share: 0.17, long_median: 3000, long_sigma: 0.2}
      output: {median: 300, sigma: 0.8}
      max_tokens: 1024
    timeline:
      - at: 55m
        over: 15m
        set: {workload.rate.mean: 9.5}
"""
QUEUE = """\
description: >-
  Held out. A Llama-3.1-8B on two H100s serving retrieval: prompts of about 1,500 tokens
  with one in five a document of about 6,000, answers of about 120 tokens with some of
  about 600; arrivals in bursts (two and a half times the rate for 60 s every 5 minutes),
  and the load climbs until prefill cannot keep up and requests queue.
duration: 1h40m
scrape_interval: 30s
seed: 61483
labels: {window: 1h, expect: [queue-saturation]}
models:
  - name: llama-3.1-8b-instruct
    preset: llama-3.1-8b
    gpu: H100-80GB
    instances: 2
    engine: {max_num_seqs: 256, max_num_batched_tokens: 2048, max_model_len: 16384}
    workload:
      rate: {mean: 6.0, noise: 0.05, burst_every: 300, burst_length: 60, burst_factor: 2.5}
      prompt: {median: 1500, sigma: 0.5, long_share: 0.2, long_median: 6000, long_sigma: 0.3}
      output: {median: 120, sigma: 0.6, long_share: 0.1, long_median: 600, long_sigma: 0.3}
      max_tokens: 1024
    timeline:
      - at: 55m
        over: 20m
        set: {workload.rate.mean: 15.0}
"""


@dataclass(frozen=True)
class Case:
    name: str
    scenario: str
    server: tuple[str, ...]
    # Lever text -> the scenario's settings at that lever (``engine.x`` or ``instances``).
    checked: dict[str, dict[str, Any]]


def _server(preset: str, model_len: int) -> tuple[str, ...]:
    return ("--preset", preset, "--gpu", "H100-80GB", "--max-num-seqs", "256",
            "--max-num-batched-tokens", "2048", "--max-model-len", str(model_len))  # fmt: skip


CASES = (
    Case(
        "kv-pressure-two-bursty",
        KV_PRESSURE,
        _server("llama-2-7b", 4096),
        {"replicas:+1": {"instances": 3}, "kv_cache_dtype:fp8": {"engine.kv_cache_dtype_bytes": 1}},
    ),
    Case(
        "queue-two-bursty-retrieval",
        QUEUE,
        _server("llama-3.1-8b", 16384),
        {
            "replicas:+1": {"instances": 3},
            "max_num_batched_tokens:x2": {"engine.max_num_batched_tokens": 4096},
        },
    ),
)
# Figures whose prediction error is reported, as the real lab's table has them.
FIGURES = ("ttft_p95", "itl_p95", "preemptions_per_second")
SLO = (1.0, 0.1)  # the default site's objectives (TTFT, ITL), for the figures read off truth


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "diagnoser", *args]


def timed(cmd: list[str]) -> tuple[str, subprocess.CompletedProcess[str]]:
    """Run ``cmd``; its wall time and the CPU time of it and its workers, in words (on a
    machine busy with other work, the wall time says little and the CPU time what it costs)."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    return f"{time.perf_counter() - t0:.1f} s ({_children_cpu() - cpu0:.1f} s CPU)", done


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def diagnose_outcome(doc: dict[str, Any]) -> tuple[str, int, int]:
    """What ``diagnose --what-if`` said: its outcome in words, the findings with a lever, and
    how many of those got predictions."""
    with_levers = predicted = 0
    said: list[str] = []
    for f in doc.get("findings", []):
        w = f.get("what_if")
        if not w:
            continue
        with_levers += 1
        got = sum(1 for lever in w["levers"] if lever.get("predicted"))
        predicted += got > 0
        said.append(f"{f['id']}: " + (f"{got}/{len(w['levers'])} predicted"
                                           if got else _why(w.get("error"))))  # fmt: skip
    return "; ".join(said) or "no finding with a lever", with_levers, predicted


def whatif_outcome(doc: dict[str, Any]) -> str:
    cal = doc["calibration"]
    if (cal.get("reason") or "").startswith("the deadline passed"):
        return "unfinished: " + _why(cal.get("reason"))
    if not cal["ok"]:
        return "refused: " + _why(cal.get("reason"))
    got = sum(1 for lever in doc["levers"] if lever["predicted"])
    late = sum(1 for lever in doc["levers"] if lever.get("error") == "the deadline passed")
    return f"{got}/{len(doc['levers'])} predicted" + (f", {late} unfinished" if late else "")


def _why(reason: str | None, width: int = 160) -> str:
    text = " ".join((reason or "no reason given").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _variant(sc: Any, name: str, settings: dict[str, Any]) -> Any:
    out = copy.deepcopy(sc)
    out.name = f"{sc.name}={name}"
    m = out.models[0]
    for key, value in settings.items():
        if key == "instances":
            m.instances = value
        else:
            setattr(m.engine, key.split(".", 1)[1], value)
    return out


def main(argv: list[str] | None = None) -> None:
    from lab.args import refuse

    argv = sys.argv[1:] if argv is None else argv
    if argv:
        given = " ".join(argv)
        refuse("python -m lab.whatifheldout", f"takes no arguments (given: {given})")
    findings = covered = 0
    errors: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            n, got, checked = run_case(case, Path(tmp))
            findings, covered = findings + n, covered + got
            errors += checked
    share = f"{covered}/{findings}" if findings else "no finding with a lever"
    print(f"held-out what-if: prediction coverage {share} findings with a lever")
    print("held-out what-if: measured / predicted at each checked lever")
    print("\n".join(errors))


def run_case(case: Case, tmp: Path) -> tuple[int, int, list[str]]:
    """Time both commands on one case and print what they said; the findings with a lever,
    those predicted, and each checked lever's error in words."""
    from diagnoser.sim.scenario import load_scenario
    from lab import harness
    from lab.promserver import Prometheus

    path = tmp / f"{case.name}.yaml"
    path.write_text(case.scenario, encoding="utf-8")
    sc = load_scenario(path)
    sc.name = case.name
    variants = {lever: _variant(sc, str(i), s) for i, (lever, s) in enumerate(case.checked.items())}
    prepared = harness.prepare([sc, *variants.values()], tmp / "data")
    end = prepared[sc.name].end
    window = ("--since", "1h", "--until", str(int(end)))
    with Prometheus(prepared[sc.name].data_dir) as prom:
        url = ("--prometheus-url", prom.url)
        fmt = ("--format", "json")
        t_d, d = timed(_cli("diagnose", *url, *window, "--what-if", *case.server, *fmt))
        t_w, w = timed(_cli("what-if", *url, *window, *case.server, *fmt))
    n = got = 0
    if d.returncode in (0, 1):
        said, n, got = diagnose_outcome(json.loads(d.stdout))
    else:
        said = f"failed (exit {d.returncode}): {_why(d.stderr)}"
    print(f"{case.name}: diagnose --what-if {t_d}: {said}")
    wdoc = json.loads(w.stdout) if w.stdout.strip().startswith("{") else None
    wsaid = whatif_outcome(wdoc) if wdoc else f"failed (exit {w.returncode}): {_why(w.stderr)}"
    print(f"{case.name}: what-if {t_w}: {wsaid}")
    by = {lever["lever"]: lever for lever in wdoc["levers"]} if wdoc else {}
    checked = []
    for lever, vsc in variants.items():
        predicted = by.get(lever, {}).get("predicted")
        if not predicted:
            checked.append(f"  {case.name} {lever}: not predicted")
            continue
        truth = _truth(prepared[vsc.name].data_dir, sc.models[0].name, wdoc or {})
        shown = ", ".join(_error(name, truth.get(name), predicted.get(name)) for name in FIGURES)
        checked.append(f"  {case.name} {lever}: {shown}")
    return n, got, checked


def _truth(data_dir: Path, model: str, doc: dict[str, Any]) -> dict[str, float | None]:
    """The figures of the scenario run at a lever, over the part of the window what-if
    replayed (its ``span``), read as what-if reads a window."""
    from datetime import datetime

    from diagnoser.plumbing.source import PrometheusSource
    from diagnoser.whatif.fit import measure
    from lab.promserver import Prometheus

    span = doc.get("span") or doc["window"]
    start, end = (datetime.fromisoformat(span[k]).timestamp() for k in ("start", "end"))
    with Prometheus(data_dir) as prom:
        return measure(PrometheusSource(prom.url), (f'model_name="{model}"',), start, end).figures(
            *SLO
        )


def _error(name: str, truth: float | None, got: float | None) -> str:
    if truth is None or got is None:
        return f"{name} {truth} / {got}"
    off = (got - truth) / truth if truth else 0.0
    return f"{name} {truth:.3g} / {got:.3g} ({off:+.0%})"


if __name__ == "__main__":
    main()
