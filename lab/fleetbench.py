"""``diagnose`` on a fleet at scale, timed in a real Prometheus and in VictoriaMetrics.

Each run is the command on-call types (``servediag diagnose --since 1h``), a process of its
own: its wall time, its peak resident memory and its CPU time come from the kernel
(``wait4``); the store's CPU time over the run from ``/proc``; the number of queries from
the JSON report; the samples read from the store's own statistics (Prometheus's query log,
which carries each query's ``samples.totalQueryableSamples``, the figure ``stats=all``
answers; VictoriaMetrics's ``vm_rows_read_per_query``). The two count differently: Prometheus
counts a sample once for every step whose range covers it, VictoriaMetrics once per query.

``python -m lab.bench fleet`` runs this part of ``make bench`` alone.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from diagnoser.plumbing.durations import parse_seconds
from diagnoser.plumbing.limits import Limit
from lab import fleet
from lab.fleetstore import Run, Store, prometheus

SINCES = ("1h", "24h")


# The site's rules as a Prometheus evaluates them by default (evaluation_interval: 1m).
RULE_INTERVAL = 60.0


def rules_data(f: fleet.Fleet, say: Callable[[str], None] = print) -> tuple[Path, float | None]:
    """Blocks of the default site's recording rules (``servediag generate``'s) evaluated over
    the fleet every minute, beside its TSDB (once): what a site that deploys them holds. The
    directory, and the seconds it took (None: it was there). The evaluation runs in a process
    of its own: what it reads would otherwise stay in this one, and every ``diagnose`` forked
    from it would start that large (its peak RSS with it)."""
    home = f.tsdb.parent
    done, data = home / "rules.json", home / "rules"
    if done.exists():
        return data, None
    shutil.rmtree(data, ignore_errors=True)
    say(f"evaluating the recording rules over the fleet into {data}")
    t0 = time.monotonic()
    start = f.end - parse_seconds(f.shape.duration) + RULE_INTERVAL
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        pool.submit(_evaluate_rules, f.tsdb, start, f.end, data).result()
    took = time.monotonic() - t0
    done.write_text(json.dumps({"seconds": took}))
    return data, took


def _evaluate_rules(tsdb: Path, start: float, end: float, out: Path) -> None:
    from diagnoser.outputs import rules
    from diagnoser.site import Site
    from lab.alerts import backfill_rules

    out.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="servediag-fleet-rules-") as tmp:
        rule_file = Path(tmp) / rules.RECORDING_FILE
        rule_file.write_text(rules.render_files(Site.default())[rules.RECORDING_FILE])
        with prometheus(tsdb) as store:  # a copy: the rules read the levels before theirs
            backfill_rules(store.prom, rule_file, start, end, RULE_INTERVAL, stale=True, keep=out)


def cases() -> list[tuple[str, tuple[str, ...]]]:
    group = fleet.CLUSTERS[0]
    return [
        ("whole fleet", ()),
        ("one model", ("--model", fleet.model_name(0))),
        (f'cluster="{group}"', ("--match", f'cluster="{group}"')),
    ]


def measure(store: Store, f: fleet.Fleet, runs: int = 1) -> list[Run]:
    """Every case at each window (the median of ``runs`` by wall time), after one run that
    reads the data into the page cache."""
    store.measure(f.end, SINCES[-1], (), "warm-up")
    out = []
    for since in SINCES:
        for label, scope in cases():
            tries = sorted(
                (store.measure(f.end, since, scope, label) for _ in range(runs)),
                key=lambda r: r.wall,
            )
            out.append(tries[len(tries) // 2])
    return out


HEAD = (
    f"  {'store':<22}{'scope':<18}{'since':>5}{'wall':>9}{'CPU':>8}{'peak RSS':>10}"
    f"{'queries':>9}{'samples read':>14}{'store CPU':>11}  findings"
)


def row(r: Run) -> str:
    if r.status != 0:
        return f"  {r.store:<22}{r.scope:<18}{r.since:>5}  exit {r.status}: {r.error}"
    return (
        f"  {r.store:<22}{r.scope:<18}{r.since:>5}{r.wall:>7.2f} s{r.cpu:>6.1f} s"
        f"{r.rss_mb:>7.0f} MB{r.queries:>9}{r.samples / 1e6:>12.1f} M{r.store_cpu:>9.1f} s"
        f"  {len(r.findings)}" + (f"  ({r.recorded} signals recorded)" if r.recorded else "")
    )


def heaviest(runs: Sequence[Run], say: Callable[[str], None] = print) -> None:
    """The queries that read the most, by Prometheus's own statistics, for the whole fleet."""
    for r in runs:
        if r.scope != "whole fleet" or not r.heaviest or not r.samples:
            continue
        say(f"  heaviest queries, whole fleet --since {r.since} (Prometheus's query stats):")
        for samples, seconds, query in r.heaviest:
            shown = query if len(query) <= 110 else query[:107] + "..."
            say(
                f"    {samples / 1e6:7.1f} M samples ({samples / r.samples:4.0%}), "
                f"{seconds:5.2f} s: {shown}"
            )


def differences(
    first: Sequence[Run],
    second: Sequence[Run],
    one: str = "Prometheus",
    other: str = "VictoriaMetrics",
) -> list[str]:
    """Where two sets of runs' answers differ: findings, or a scope's health verdict."""
    out = []
    for a, b in zip(first, second, strict=True):
        what = f"{a.scope}, --since {a.since}"
        if a.findings != b.findings:
            out.append(
                f"{what}: findings {a.findings or 'none'} ({one}), {b.findings or 'none'} ({other})"
            )
        changed: dict[str, tuple[str | None, str | None]] = {
            s: (v, b.verdicts.get(s)) for s, v in a.verdicts.items() if b.verdicts.get(s) != v
        }
        changed |= {s: (None, v) for s, v in b.verdicts.items() if s not in a.verdicts}
        for scope, (pv, vv) in sorted(changed.items())[:5]:
            out.append(f"{what}: {scope} {pv} ({one}), {vv} ({other})")
        if len(changed) > 5:
            out.append(f"{what}: and {len(changed) - 5} more scopes' verdicts differ")
    return out


def describe(f: fleet.Fleet, say: Callable[[str], None] = print) -> None:
    built = (
        "cached"
        if f.cached
        else f"built in {f.build_seconds:.0f} s (its models took {f.model_seconds:.0f} s, "
        "two at a time, in this run or an earlier one)"
    )
    say(
        f"fleet: {f.shape.text()}: {f.series / 1e3:.0f} k series, {f.samples / 1e6:.0f} M "
        f"samples; {built}, in {f.tsdb.parent}"
    )


def growth(
    small: Sequence[Run], big: Sequence[Run], ratio: float, say: Callable[[str], None] = print
) -> None:
    """How time, samples and memory grew from a fleet to one ``ratio`` times its data."""
    for a, b in zip(small, big, strict=True):
        if a.scope != "whole fleet" or a.status or b.status:
            continue
        say(
            f"  whole fleet --since {a.since}: {a.wall:.2f} s -> {b.wall:.2f} s "
            f"(x{b.wall / a.wall:.2f}), samples read x{b.samples / max(a.samples, 1):.2f}, "
            f"store CPU x{b.store_cpu / max(a.store_cpu, 1e-3):.2f}, "
            f"peak RSS x{b.rss_mb / a.rss_mb:.2f}, for x{ratio:.2f} the data"
        )


def bench(
    shape: fleet.Shape,
    compare: fleet.Shape | None,
    vm: bool,
    runs: int = 1,
    recorded: bool = True,
) -> None:
    f = fleet.cached(shape)
    describe(f)
    print(HEAD)
    with prometheus(f.tsdb) as prom:
        on_prom = measure(prom, f, runs)
    _show(on_prom)
    heaviest(on_prom)
    rules = None
    if recorded:
        rules, seconds = rules_data(f)
        if seconds is not None:
            print(f"  the recording rules evaluated over the fleet in {seconds:.0f} s ({rules})")
        with prometheus(f.tsdb, rules) as prom:
            on_rules = measure(prom, f, runs)
        _show(on_rules)
        heaviest(on_rules)
        _agree(on_prom, on_rules, "Prometheus without the rules", "with them")
    if vm:
        from lab.fleetvm import victoria, vm_data

        data, seconds = vm_data(f, rules=rules)
        if seconds is not None:
            print(f"  imported into VictoriaMetrics in {seconds:.0f} s ({data})")
        with victoria(data) as store:
            on_vm = measure(store, f, runs)
        _show(on_vm)
        _agree(on_prom, on_vm, "Prometheus", "VictoriaMetrics")
        if rules is not None:
            with victoria(data, recorded_rules=True) as store:
                vm_rules = measure(store, f, runs)
            _show(vm_rules)
            _agree(on_vm, vm_rules, "VictoriaMetrics without the rules", "with them")
    if compare is not None:
        g = fleet.cached(compare)
        describe(g)
        with prometheus(g.tsdb) as prom:
            other = measure(prom, g, runs)
        _show(other)
        small, big = (other, on_prom) if g.samples < f.samples else (on_prom, other)
        print("growth with the data (Prometheus):")
        growth(small, big, max(f.samples, g.samples) / min(f.samples, g.samples))


def _show(runs: Sequence[Run]) -> None:
    for r in runs:
        print(row(r))


def _agree(a: Sequence[Run], b: Sequence[Run], one: str, other: str) -> None:
    """Whether two sets of runs found the same: one line, and the differences under it."""
    found = differences(a, b, one, other)
    same = "the same findings and health verdicts" if not found else "they differ:"
    print(f"  {one} and {other}: {same}")
    for line in found:
        print(f"    {line}")


# The fleet a run may ask for: at least one of each, and no more than a machine can simulate.
MODELS = Limit(1, 10_000, integer=True)
INSTANCES = Limit(1, 1_000, integer=True)
RUNS = Limit(1, 100, integer=True)


def _duration(text: str) -> str:
    """A duration of data to scrape, as written (``24h``), checked as the command line does."""
    from lab.args import seconds

    seconds()(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    from lab.args import Parser, number

    p = Parser(prog="python -m lab.fleetbench")
    p.add_argument("--models", type=number(MODELS), default=fleet.Shape.models)
    p.add_argument("--instances", type=number(INSTANCES), default=fleet.Shape.instances)
    p.add_argument("--duration", type=_duration, default=fleet.Shape.duration)
    p.add_argument(
        "--compare-models",
        type=number(Limit(0, MODELS.high, integer=True)),
        default=None,
        help="also a fleet of this many models (default: half as many), to say "
        "how the time grows with the data; 0: not",
    )
    p.add_argument("--no-victoriametrics", action="store_true")
    p.add_argument(
        "--no-recorded-rules",
        action="store_true",
        help="skip the runs with the site's recording rules evaluated over the fleet",
    )
    p.add_argument(
        "--runs", type=number(RUNS), default=1, help="runs per case (the median is shown)"
    )
    a = p.parse_args(argv)
    shape = fleet.Shape(models=a.models, instances=a.instances, duration=a.duration)
    other = a.models // 2 if a.compare_models is None else a.compare_models
    compare = fleet.Shape(**{**shape.__dict__, "models": other}) if other else None
    bench(shape, compare, not a.no_victoriametrics, a.runs, not a.no_recorded_rules)


if __name__ == "__main__":
    main()
