"""``make real``, ``make bench-real``: vLLM's CPU build through the lab's incidents.

    python -m lab.real                      # one short incident, diagnosed
    python -m lab.real kv-cache-pressure --record   # run and record one
    python -m lab.real --all --record       # every incident (about 2.5 h)
    python -m lab.real bench                # AC@1 over the recordings
    python -m lab.real rerecord             # answers again from raw samples

Exit status: 0 done (for a run: every incident named as expected), 1 a step failed (one line
naming it, with the server's last log lines) or an incident was not named, 2 bad usage.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from diagnoser.plumbing.errors import UserError
from lab.args import ClickNumber
from lab.promserver import PrometheusError
from lab.real import incident as incidents
from lab.real import venv as lab_venv
from lab.real.outcome import Outcome
from lab.real.record import DATA
from lab.real.run import SCALE, interrupted_cleanly, run
from lab.real.venv import LabError

DEFAULT = "prompt-length-shift"


def _say(text: str) -> None:
    click.echo(text)
    sys.stdout.flush()


def _fail(step: str, exc: BaseException) -> None:
    click.echo(f"real: {step} failed: {exc}", err=True)
    click.echo("real: nothing was left running", err=True)
    sys.exit(1)


def verdict(o: Outcome, health: str) -> str:
    ok = o.ok(health)
    found = f"{o.first} ({o.confidence:.0%})" if o.first else "no finding"
    if o.clean_baseline:
        base = f"as built ({o.baseline_expect})" if o.baseline_expect else "clean"
    elif o.baseline_first != o.baseline_expect:
        base = f"FOUND {o.baseline_first}"
    else:
        base = f"{o.baseline_health.upper()}, expected {o.expect_baseline_health}"
    return (
        f"{'ok  ' if ok else 'MISS'} {o.incident:<28} expect {o.expect or 'none':<26} "
        f"first {found:<34} health {o.health:<9} baseline {base}"
    )


@click.command()
@click.argument("names", nargs=-1)
@click.option("--all", "run_all", is_flag=True, help="Every incident in fixtures/real/.")
@click.option("--record", is_flag=True, help="Write the recordings into tests/data/real/.")
@click.option(
    "--scale",
    type=ClickNumber(SCALE),
    default=1.0,
    show_default=True,
    help="Multiply every phase's duration (0.5: a quicker, noisier run).",
)
@click.option(
    "--venv",
    type=click.Path(path_type=Path),
    default=Path(".venv-vllm"),
    show_default=True,
    help="vLLM's CPU build is installed here.",
)
@click.option(
    "--server-core",
    type=click.IntRange(0),
    default=None,
    help="Pin the server to this core (run the rest with taskset on another).",
)
@click.option("--list", "list_", is_flag=True, help="Name the incidents and exit.")
@click.option(
    "--bench",
    "bench_",
    is_flag=True,
    help="AC@1 over the recorded incidents, replayed (no server).",
)
@click.option(
    "--rerecord",
    is_flag=True,
    help="Record the answers of NAMES (default: all) again from their raw samples.",
)
def main(
    names: tuple[str, ...],
    run_all: bool,
    record: bool,
    scale: float,
    venv: Path,
    server_core: int | None,
    list_: bool,
    bench_: bool,
    rerecord: bool,
) -> None:
    """Run incidents on a real vLLM server (CPU build) and diagnose them."""
    from lab.args import one_of

    if run_all and names:
        click.echo("python -m lab.real: error: give incident names or --all, not both", err=True)
        sys.exit(2)
    if list_:
        for name in incidents.names():
            inc = incidents.find(name)
            click.echo(f"{name:<28} {inc.duration / 60:4.1f} min  expect {inc.expect or 'none'}")
        return
    if bench_:
        bench()
        return
    if rerecord:
        from lab.real.replayed import recorded
        from lab.real.replayed import rerecord as again

        one_of("python -m lab.real", "recorded incident", names, [d.name for d in recorded()])
        for name in names or tuple(d.name for d in recorded()):
            click.echo(again(name))
        return
    try:
        chosen = [incidents.find(n) for n in (incidents.names() if run_all else names or [DEFAULT])]
    except UserError as exc:
        click.echo(f"real: {exc}", err=True)
        sys.exit(2)
    step = "checking the CPU"
    outcomes = []
    try:
        lab_venv.check_cpu()
        step = f"installing vLLM's CPU build into {venv}"
        _say(
            f"[install] {lab_venv.VLLM} with {lab_venv.TORCH} into {venv} "
            f"(without {', '.join(lab_venv.LEFT_OUT)})"
        )
        took = lab_venv.install(venv, venv.parent / f"{venv.name}-install.log")
        _say(f"      installed in {took:.0f} s" if took else "      already installed")
        out = DATA if record else None
        with interrupted_cleanly():
            for inc in chosen:
                step = f"incident {inc.name}"
                o = run(inc, venv, out, _say, scale, server_core)
                outcomes.append((o, inc.health))
                _say(verdict(o, inc.health))
                _say(f"      start-up {o.startup_seconds} s; run {o.wall_seconds / 60:.1f} min")
    except (LabError, PrometheusError, OSError) as exc:
        _fail(step, exc)
    named = sum(o.ok(h) for o, h in outcomes)
    _say(f"AC@1 {named}/{len(outcomes)} (named first, baseline clean, health as expected)")
    sys.exit(0 if named == len(outcomes) else 1)


def bench() -> None:
    """AC@1 over the recorded real incidents (replayed, no server)."""
    from lab.real.replayed import replay_all

    t0 = time.monotonic()
    results = replay_all()
    for o, health in results:
        click.echo(verdict(o, health))
    named = sum(o.ok(h) for o, h in results)
    click.echo(
        f"real incidents, replayed: AC@1 {named}/{len(results)} in {time.monotonic() - t0:.1f} s"
    )


if __name__ == "__main__":
    from lab.args import click_main

    click_main(main, "python -m lab.real")
