"""``make bench``: the simulator's step costs against GPU measurements, its speed, what-if's
time on a 1-hour window with five levers (``python -m lab.bench what-if`` alone),
diagnose's accuracy on the scenario library and its variants, diagnose on a fleet of 512
targets (in Prometheus and VictoriaMetrics; ``python -m lab.bench fleet`` alone),
servediag watch's cycles (``python -m lab.bench watch`` alone), and start-up times."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from diagnoser.catalog import load_catalog
from diagnoser.outputs import rules
from diagnoser.site import Site

if TYPE_CHECKING:
    from diagnoser.sim.scenario import Scenario


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


def bench_what_if() -> None:
    """servediag what-if on one model's 1-hour window with five levers, timed."""
    from lab import whatifbench

    whatifbench.main()
    bench_what_if_real()


def bench_what_if_real() -> None:
    """What-if's predictions against what a real vLLM then did at each lever (recorded
    experiments, replayed from their answers: no server)."""
    from lab.real import whatif

    runs = whatif.recorded()
    if not runs:
        print("what-if against a real vLLM: no recorded experiment (a checkout has them)")
        return
    t0 = time.perf_counter()
    results = [whatif.replayed(d)[0] for d in runs]
    print(
        f"what-if against a real vLLM (CPU build; {len(results)} recorded experiment(s), "
        f"replayed in {time.perf_counter() - t0:.1f} s; aim: TTFT and ITL p95 within 25%, "
        "preemptions within 2x):"
    )
    print("\n".join(whatif.table(results)))


def bench_library() -> None:
    import tempfile
    from pathlib import Path

    from diagnoser.sim import library
    from lab import harness

    names = library.names()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        prepared = harness.prepare(names, Path(tmp))
        wall = time.perf_counter() - t0
    sim = sum(p.simulate_seconds for p in prepared.values())
    fill = sum(p.backfill_seconds for p in prepared.values())
    samples = sum(p.samples for p in prepared.values())
    print(
        f"scenario library ({len(names)} scenarios, {samples / 1e6:.1f} M samples): "
        f"{wall:.1f} s wall on {harness.default_workers(len(names))} worker(s) "
        f"(simulate {sim:.1f} s + backfill {fill:.1f} s of CPU)"
    )


def runs_sglang(sc: Scenario) -> bool:
    return any(m.runtime == "sglang" for m in sc.models)


def vllm_library() -> list[Scenario]:
    """The library's vLLM-only scenarios (what the vLLM figures have always been over)."""
    from diagnoser.sim import library

    return [sc for sc in map(library.find, library.names()) if not runs_sglang(sc)]


def sglang_library() -> list[Scenario]:
    """The library's scenarios with an SGLang server: SGLang alone, or a mixed fleet."""
    from diagnoser.sim import library

    return [sc for sc in map(library.find, library.names()) if runs_sglang(sc)]


Score = tuple[int, int, int]  # incidents right at 1, incidents, findings on healthy runs


def bench_accuracy(variants: Sequence[int] = (), scenarios: Sequence[Scenario] = ()) -> Score:
    """AC@1 and AC@3 over the labelled vLLM library (or variants ``k`` of it, or of the
    scenarios given); findings on healthy scenarios; and where the misses are, per playbook."""
    import tempfile
    from pathlib import Path

    import pandas as pd

    from diagnoser.diagnosis import Window, diagnose
    from diagnoser.plumbing.source import PrometheusSource
    from lab import harness
    from lab.promserver import Prometheus

    site = Site.default()
    chosen = list(scenarios) or vllm_library()
    if variants:
        from diagnoser.sim.variants import variant

        chosen = [variant(sc, k) for sc in chosen for k in variants]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        prepared = harness.prepare(chosen, Path(tmp))
        for sc in chosen:
            with Prometheus(prepared[sc.name].data_dir) as prom:
                window = Window.plan(sc.labels.window, prepared[sc.name].end)
                t0 = time.perf_counter()
                result = diagnose(PrometheusSource(prom.url), site, window)
                took = time.perf_counter() - t0
            ids = [m.playbook.id for m in result.findings]
            gone = [m.playbook.id for m in result.resolved]
            want = sc.labels.expect[0] if sc.labels.expect else ""
            rows.append(
                {
                    "scenario": sc.name,
                    "expected": want or f"({sc.labels.kind})",
                    "kind": sc.labels.kind,
                    "findings": len(ids),
                    "at1": bool(ids) and ids[0] == want,
                    "at3": want in ids[:3],
                    "misses": sc.labels.misses(ids, gone),
                    "labelled_resolved": len(sc.labels.resolved),
                    "resolved_ok": sum(p in gone and p not in ids for p in sc.labels.resolved),
                    "top3": ", ".join(ids[:3]) or "-",
                    "gone": ", ".join(gone),
                    "seconds": took,
                }
            )
    df = pd.DataFrame(rows)
    for r in df.itertuples():
        verdict = _verdict(r.kind, r.at1, r.at3, r.findings, r.misses)
        ended = f"  resolved: {r.gone}" if r.gone else ""
        print(f"  {r.scenario:<32} {verdict:<14} {r.seconds:5.2f} s  {r.top3}{ended}")
    incidents = df[df.kind == "incident"]
    at1, at3, n = int(incidents.at1.sum()), int(incidents.at3.sum()), len(incidents)
    misses = incidents[~incidents.at1].groupby("expected").size()
    if len(misses):
        per = incidents.groupby("expected").agg(runs=("at1", "size"), at1=("at1", "sum"))
        per = per[per.index.isin(misses.index)]
        text = ", ".join(f"{pid} {int(r.at1)}/{int(r.runs)}" for pid, r in per.iterrows())
        print(f"  playbooks with a miss (AC@1 per playbook): {text}")
    label = (
        f"{len(chosen)} variants (k = {', '.join(map(str, variants))})"
        if variants
        else f"{len(chosen)}"
    )
    healthy = int(df[df.kind == "healthy"].findings.sum())
    print(
        f"accuracy over {label} scenarios: AC@1 {at1}/{n} = {at1 / max(1, n):.2f}, "
        f"AC@3 {at3}/{n} = {at3 / max(1, n):.2f}, "
        f"findings on healthy scenarios: {healthy}"
    )
    recoveries = df[df.kind == "recovery"]
    if df.labelled_resolved.sum() or len(recoveries):
        right = int((recoveries.misses.map(len) == 0).sum())
        print(
            f"  incidents that ended: {right}/{len(recoveries)} recovery windows right "
            f"(nothing current, each ended incident reported resolved), "
            f"current findings on them: {int(recoveries.findings.sum())}, "
            f"labelled ends reported resolved: {int(df.resolved_ok.sum())}/"
            f"{int(df.labelled_resolved.sum())}"
        )
    return at1, n, healthy


def _verdict(kind: str, at1: bool, at3: bool, findings: int, misses: list[str]) -> str:
    """A run's verdict in the bench's table: an incident by where its cause ranks (and its
    ended incidents, if it has some), a healthy run by its findings, a recovery by what it
    got wrong."""
    if kind == "healthy":
        return "ok" if not findings else "FALSE POSITIVE"
    if kind == "recovery":
        return "ok" if not misses else ("STILL CURRENT" if findings else "NOT RESOLVED")
    verdict = "ok" if at1 else ("top-3" if at3 else "MISSED")
    return verdict if verdict != "ok" or not misses else "NOT RESOLVED"


def serving_stack() -> list[Scenario]:
    """The library's incidents of the serving-stack playbooks (engine hangs, prefix caches,
    ...), reported apart: they came after the seed's patterns."""

    stack = {pb.id for pb in load_catalog() if pb.chapter == "serving-stack"}
    return [sc for sc in vllm_library() if set(sc.labels.expect) & stack]


def recoveries() -> list[Scenario]:
    """The library's scenarios with an incident that ends (``labels.resolved`` or
    ``labels.ended``): recoveries, short windows after one, incidents back to back."""
    return [sc for sc in vllm_library() if sc.labels.resolved or sc.labels.ended]


def aged_set(ks: Sequence[int]) -> list[Scenario]:
    """Every library scenario whose story survives aging, aged by ``AGES[k-1]`` hours."""
    from diagnoser.sim import library
    from diagnoser.sim.variants import aged, can_age

    names = [sc.name for sc in vllm_library() if can_age(sc)]
    return [aged(library.find(n), k) for n in names for k in ks]


def loops(ks: Sequence[int]) -> list[Scenario]:
    from diagnoser.sim import library
    from diagnoser.sim.variants import restart_loop

    return [restart_loop(library.find("gpu-memory-contention"), k) for k in ks]


def bench_watch() -> None:
    """servediag watch stepped through incidents and a healthy fleet, a cycle a minute
    (``python -m lab.bench watch`` alone)."""
    from lab import watchbench

    watchbench.main([])


def bench_fleet() -> None:
    """diagnose on a fleet of 512 targets (16 models x 32 instances, 24 h at 30 s scrapes,
    DCGM), built once and cached, in Prometheus and VictoriaMetrics, and on half of it."""
    from lab import fleetbench

    fleetbench.main([])


def bench_written(ks: Sequence[int]) -> Score:
    """AC@1 and AC@3 over the SGLang cases written from SGLang's code, without the
    simulator's engine (``lab.sglang_written``), case ``k`` 0 being the case as written."""
    import tempfile
    from pathlib import Path

    from lab import sglang_written as W

    end = float(int(time.time()) // 60 * 60 - 120)
    at1 = at3 = n = healthy = 0
    for base in W.cases():
        for k in ks:
            case = W.variant(base, k) if k else base
            with tempfile.TemporaryDirectory() as tmp:
                ids = [f["id"] for f in W.diagnose(case, Path(tmp), end)["findings"]]
            if case.expect is None:
                healthy += len(ids)
                verdict = "ok" if not ids else "FALSE POSITIVE"
            else:
                n += 1
                at1 += ids[:1] == [case.expect]
                at3 += case.expect in ids[:3]
                verdict = "ok" if ids[:1] == [case.expect] else "MISSED"
                verdict = "top-3" if verdict == "MISSED" and case.expect in ids[:3] else verdict
            print(f"  {case.name:<32} {verdict:<14} {', '.join(ids[:3]) or '-'}")
    print(
        f"accuracy over {n} written incidents (k = {', '.join(map(str, ks))}): "
        f"AC@1 {at1}/{n} = {at1 / max(1, n):.2f}, AC@3 {at3}/{n} = {at3 / max(1, n):.2f}, "
        f"findings on healthy cases: {healthy}"
    )
    return at1, n, healthy


def bench_sglang() -> None:
    """Accuracy on the SGLang scenarios (SGLang servers alone and mixed with vLLM), and on the
    SGLang cases written from SGLang's code without the simulator's engine; variants 9 and 10
    of both are kept out of tuning."""
    scenarios = sglang_library()
    print("accuracy on the SGLang scenarios (SGLang alone, and mixed vLLM + SGLang fleets):")
    tuned = [bench_accuracy(scenarios=scenarios)]
    print("accuracy on SGLang variants 1-8 (other seeds, onsets, magnitudes):")
    tuned.append(bench_accuracy(variants=(1, 2, 3, 4, 5, 6, 7, 8), scenarios=scenarios))
    print("accuracy on the SGLang cases written from SGLang's code, and their variants 1-8:")
    tuned.append(bench_written((0, 1, 2, 3, 4, 5, 6, 7, 8)))
    print("accuracy on SGLang variants 9-10 (kept out of tuning):")
    held = [bench_accuracy(variants=(9, 10), scenarios=scenarios)]
    print("accuracy on the written SGLang cases' variants 9-10 (kept out of tuning):")
    held.append(bench_written((9, 10)))
    for name, scores in (("kept out of tuning", held), ("all runs", tuned + held)):
        at1, n, healthy = (sum(x) for x in zip(*scores, strict=True))
        print(
            f"SGLang, {name} (simulated and written): AC@1 {at1}/{n} = "
            f"{at1 / max(1, n):.2f}, findings on healthy runs: {healthy}"
        )


def bench_alerts() -> None:
    """Alerts on healthy services and incidents (``lab.alertbench``)."""
    from lab import alertbench

    alertbench.main()


def bench_real() -> None:
    """AC@1 over the incidents recorded on a real vLLM server (``tests/data/real``), replayed;
    ``make bench-real`` runs them live."""
    from lab.real.__main__ import bench

    print("accuracy on incidents recorded on a real vLLM server (CPU build), replayed:")
    bench()


# Each benchmark ``python -m lab.bench NAME`` runs alone (none: every one, for hours).
PARTS = ("alerts", "sglang", "fleet", "watch", "serving-stack", "recoveries", "what-if",
         "what-if-real")  # fmt: skip


def main() -> None:
    from lab.args import one_of, refuse

    prog = "python -m lab.bench"
    one_of(prog, "benchmark", sys.argv[1:2], PARTS)
    if len(sys.argv) > 2 and sys.argv[1] not in ("fleet", "watch"):
        refuse(prog, f"{sys.argv[1]} takes no arguments (given: {' '.join(sys.argv[2:])})")
    if sys.argv[1:] == ["alerts"]:  # the alerts' precision and recall only
        bench_alerts()
        return
    if sys.argv[1:] == ["sglang"]:  # python -m lab.bench sglang: that part only
        bench_sglang()
        return
    if sys.argv[1:2] == ["fleet"]:  # the fleet benchmark only (its options: --help)
        from lab import fleetbench

        fleetbench.main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["watch"]:  # servediag watch's cycles only (its options: --help)
        from lab import watchbench

        watchbench.main(sys.argv[2:])
        return
    if sys.argv[1:] == ["serving-stack"]:  # the serving-stack playbooks' variants only
        bench_accuracy(variants=tuple(range(1, 11)), scenarios=serving_stack())
        return
    if sys.argv[1:] == ["recoveries"]:  # incidents that end, and their variants 1-10
        bench_accuracy(scenarios=recoveries())
        bench_accuracy(variants=tuple(range(1, 11)), scenarios=recoveries())
        return
    if sys.argv[1:] == ["what-if"]:  # the what-if figures only
        bench_what_if()
        return
    if sys.argv[1:] == ["what-if-real"]:  # what-if against the real runs only
        bench_what_if_real()
        return
    bench_step_costs()
    bench_simulator()
    bench_what_if()
    bench_library()
    print("accuracy on the scenario library (what the signatures were tuned on):")
    bench_accuracy()
    print("accuracy on variants 1-8 (other seeds, onsets, magnitudes, pre-0.11 names):")
    bench_accuracy(variants=(1, 2, 3, 4, 5, 6, 7, 8))
    print("accuracy on variants 9-10 (kept out of tuning):")
    bench_accuracy(variants=(9, 10))
    print(
        "accuracy on the serving-stack playbooks' variants 1-10 "
        "(hangs, caches, drafts, replicas, adapters, KV transfer):"
    )
    bench_accuracy(variants=tuple(range(1, 11)), scenarios=serving_stack())
    print("accuracy on incidents begun 1 h and 3 h before the window (tuned on):")
    bench_accuracy(scenarios=aged_set((1, 2)))
    print("accuracy on incidents begun 2 h and 4 h before the window (kept out of tuning):")
    bench_accuracy(scenarios=aged_set((3, 4)))
    print("accuracy on restart loops 1-4 (tuned on):")
    bench_accuracy(scenarios=loops((1, 2, 3, 4)))
    print("accuracy on restart loops 5-6 (kept out of tuning):")
    bench_accuracy(scenarios=loops((5, 6)))
    bench_sglang()
    bench_real()
    bench_alerts()
    bench_fleet()
    bench_watch()
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


if __name__ == "__main__":
    main()
