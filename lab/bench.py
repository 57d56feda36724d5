"""``make bench``: the simulator's step costs against GPU measurements, its speed, what-if's
time on a 1-hour window with five levers and on held-out workloads (``python -m lab.bench
what-if`` alone, ``what-if-held-out`` the held-out cases only),
diagnose's accuracy on the scenario library and its variants, diagnose on a fleet of 512
targets (in Prometheus and VictoriaMetrics; ``python -m lab.bench fleet`` alone),
servediag watch's cycles (``python -m lab.bench watch`` alone), and start-up times."""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from diagnoser.catalog import load_catalog
from diagnoser.site import Site
from lab import speedbench
from lab.sglangbench import Score

if TYPE_CHECKING:
    from diagnoser.sim.scenario import Scenario


def bench_what_if() -> None:
    """servediag what-if on one model's 1-hour window with five levers, timed."""
    from lab import whatifbench

    whatifbench.main([])
    bench_what_if_held_out()
    bench_what_if_real()


def bench_what_if_held_out() -> None:
    """diagnose --what-if and what-if on held-out workloads (``lab.whatifheldout``)."""
    from lab import whatifheldout

    whatifheldout.main([])


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


# Disaggregated deployments with the other playbooks that apply to them, benched beside the
# library's (which the test suite checks on every run) but kept out of it: the suite's time.
DISAGGREGATED_WORLD = Path(__file__).resolve().parent.parent / "fixtures" / "disaggregated"


def bench_disaggregated() -> None:
    """The disaggregated deployments (a prefill server beside the decode ones): the library's
    and those of ``fixtures/disaggregated``."""
    from diagnoser.sim.scenario import load_scenario

    chosen = [sc for sc in vllm_library() if any(m.engine.kv_producer for m in sc.models)]
    chosen += [load_scenario(p) for p in sorted(DISAGGREGATED_WORLD.glob("*.yaml"))]
    print("accuracy on the disaggregated deployments, variants 1-8 (tuned on), 9-10 (held out):")
    bench_accuracy(scenarios=chosen)
    bench_accuracy(variants=tuple(range(1, 9)), scenarios=chosen)
    bench_accuracy(variants=(9, 10), scenarios=chosen)


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


# SGLang's two settings of its token-length histograms, as bench_sglang reports them.
SGLANG_SETTINGS = (("defaults", False), ("--collect-tokens-histogram", True))


def bench_sglang() -> None:
    """Accuracy on the SGLang scenarios (SGLang servers alone and mixed with vLLM), and on the
    SGLang cases written from SGLang's code without the simulator's engine, at SGLang's
    defaults (no token-length histograms) and with ``--collect-tokens-histogram``, then both
    side by side; variants 9 and 10 of both are kept out of tuning."""
    from lab.sglangbench import bench_written, with_token_histograms

    rows: list[tuple[str, str, Score]] = []
    for setting, on in SGLANG_SETTINGS:
        scenarios = sglang_library()
        if on:
            scenarios = [with_token_histograms(sc) for sc in scenarios]
        print(f"== SGLang at {setting}")
        print("accuracy on the SGLang scenarios (SGLang alone, and mixed vLLM + SGLang fleets):")
        rows.append((setting, "scenarios", bench_accuracy(scenarios=scenarios)))
        print("accuracy on SGLang variants 1-8 (other seeds, onsets, magnitudes):")
        tuned = bench_accuracy(variants=(1, 2, 3, 4, 5, 6, 7, 8), scenarios=scenarios)
        rows.append((setting, "variants 1-8", tuned))
        print("accuracy on the SGLang cases written from SGLang's code, and their variants 1-8:")
        rows.append((setting, "written, 0-8", bench_written((0, 1, 2, 3, 4, 5, 6, 7, 8), on)))
        print("accuracy on SGLang variants 9-10 (kept out of tuning):")
        held = bench_accuracy(variants=(9, 10), scenarios=scenarios)
        rows.append((setting, "variants 9-10 *", held))
        print("accuracy on the written SGLang cases' variants 9-10 (kept out of tuning):")
        rows.append((setting, "written 9-10 *", bench_written((9, 10), on)))
    print("SGLang at its defaults and with --collect-tokens-histogram (* kept out of tuning):")
    print(f"  {'':<16} {'defaults':>24} {'--collect-tokens-histogram':>28}")
    parts = list(dict.fromkeys(part for _, part, _ in rows))
    for part in (*parts, "kept out of tuning", "all runs"):
        cells = []
        for setting, _ in SGLANG_SETTINGS:
            mine = [x for s, p, x in rows if s == setting and _in(p, part)]
            at1, n, healthy = (sum(x) for x in zip(*mine, strict=True))
            cells.append(f"AC@1 {at1}/{n} = {at1 / max(1, n):.2f}, healthy {healthy}")
        print(f"  {part:<18} {cells[0]:>30} {cells[1]:>30}")


def _in(part: str, group: str) -> bool:
    """Whether a bench part counts in a row of the summary (itself, or a total)."""
    held = group == "kept out of tuning" and part.endswith("*")
    return group == "all runs" or part == group or held


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


def _alone(run: Callable[[], object]) -> Callable[[list[str]], None]:
    def part(_: list[str]) -> None:
        run()

    return part


def _with_options(module: str) -> Callable[[list[str]], None]:
    return lambda argv: importlib.import_module(f"lab.{module}").main(argv)


# What ``python -m lab.bench NAME`` runs (fleet and watch take options: --help).
ALONE: dict[str, Callable[[list[str]], None]] = {
    "alerts": _alone(bench_alerts),  # the alerts' precision and recall
    "sglang": _alone(bench_sglang),
    "fleet": _with_options("fleetbench"),
    "watch": _with_options("watchbench"),  # servediag watch's cycles
    "serving-stack": _alone(  # the serving-stack playbooks' variants
        lambda: bench_accuracy(variants=tuple(range(1, 11)), scenarios=serving_stack())
    ),
    "recoveries": _alone(  # incidents that end, and their variants 1-10
        lambda: (
            bench_accuracy(scenarios=recoveries()),
            bench_accuracy(variants=tuple(range(1, 11)), scenarios=recoveries()),
        )
    ),
    "disaggregated": _alone(bench_disaggregated),  # prefill and decode apart, and variants
    "what-if": _alone(bench_what_if),
    "what-if-held-out": _alone(bench_what_if_held_out),
    "what-if-real": _alone(bench_what_if_real),  # what-if against the real runs
}
PARTS = tuple(ALONE)


def main() -> None:
    from lab.args import one_of, refuse

    prog = "python -m lab.bench"
    one_of(prog, "benchmark", sys.argv[1:2], PARTS)
    if len(sys.argv) > 2 and sys.argv[1] not in ("fleet", "watch"):
        refuse(prog, f"{sys.argv[1]} takes no arguments (given: {' '.join(sys.argv[2:])})")
    if len(sys.argv) > 1:  # one part alone
        ALONE[sys.argv[1]](sys.argv[2:])
        return
    speedbench.bench_step_costs()
    speedbench.bench_simulator()
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
    bench_disaggregated()
    bench_sglang()
    bench_real()
    bench_alerts()
    bench_fleet()
    bench_watch()
    speedbench.bench_startup()


if __name__ == "__main__":
    main()
