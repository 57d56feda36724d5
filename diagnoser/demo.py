"""``make demo``: a simulated incident in a throwaway local Prometheus, examined end to end.

Steps: load the catalog; check the generated rules with promtool; simulate the scenario with
vLLM's metric names; backfill it into a Prometheus on a free loopback port; show the evidence
the expected playbook names (baseline against now); stop Prometheus and remove its data.
``diagnose`` itself is not in this build yet; the last step says so.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import click

from diagnoser import rules
from diagnoser.catalog import load_catalog
from diagnoser.config import RulesConfig
from diagnoser.errors import UserError
from diagnoser.promserver import Prometheus, PrometheusError
from diagnoser.signals import SIGNALS

STEPS = 6


def step(n: int, text: str) -> None:
    click.echo(f"[{n}/{STEPS}] {text}")


def _value(prom: Prometheus, name: str, t: float) -> float | None:
    result = prom.query(SIGNALS[name].render(), at=t)
    return max(float(r["value"][1]) for r in result) if result else None


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "no data"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "ratio":
        return f"{value:.1%}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


@click.command()
@click.option(
    "--scenario",
    default="retrieval-launch",
    show_default=True,
    help="A scenario from the library (servediag simulate --list).",
)
def main(scenario: str) -> None:
    """Walk through a simulated incident with what this build can do."""
    try:
        run(scenario)
    except (UserError, PrometheusError, rules.PromtoolError) as exc:
        click.echo(f"demo: error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, UserError) else 1)


def run(scenario: str) -> None:
    from diagnoser.sim import harness, library

    start = time.monotonic()
    step(1, "loading the playbook catalog")
    catalog = load_catalog()
    sc = library.find(scenario)
    click.echo(f"      {len(catalog)} playbooks, {len(catalog.detectable())} with alerts")

    with tempfile.TemporaryDirectory(prefix="servediag-demo-") as tmp:
        step(2, "generating Prometheus rules and checking them with promtool")
        files = rules.render_files(catalog, RulesConfig())
        paths = []
        for name in (rules.RECORDING_FILE, rules.ALERTS_FILE):
            path = Path(tmp) / name
            path.write_text(files[name], encoding="utf-8")
            paths.append(path)
        rules.check_rules(paths)
        click.echo("      promtool check rules: SUCCESS")

        step(
            3,
            f"simulating '{sc.name}' ({sc.duration / 3600:g} h) with vLLM's metric names, "
            "and backfilling it with promtool",
        )
        prepared = harness.prepare([sc.name], Path(tmp) / "tsdb")[sc.name]
        click.echo(
            f"      {prepared.samples:,} samples; simulated in "
            f"{prepared.simulate_seconds:.1f} s, backfilled in "
            f"{prepared.backfill_seconds:.1f} s"
        )
        click.echo(f"      {sc.description}")

        step(4, "starting a throwaway Prometheus on a free loopback port (with our rules)")
        with Prometheus(prepared.data_dir, rule_files=paths) as prom:
            click.echo(f"      {prom.url}")
            end = prepared.end
            before = end - sc.labels.window - 600
            expected = [catalog[i] for i in sc.labels.expect]
            step(5, "the evidence, an hour before the window against now:")
            shown = (
                expected[0].evidence
                if expected
                else ("request_rate", "ttft_p95", "itl_p95", "kv_cache_usage", "requests_waiting")
            )
            for name in shown:
                sig = SIGNALS[name]
                then, now = _value(prom, name, before), _value(prom, name, end)
                click.echo(
                    f"      {name:<28} {_fmt(then, sig.unit):>12} -> {_fmt(now, sig.unit):>12}"
                )
        step(6, "diagnose --since 1h: not in this build yet; for this incident it must name:")
        click.echo()
        if not expected:
            click.echo("  nothing: this is a healthy scenario")
        for pb in expected:
            click.echo(f"  {pb.title}  ({pb.id})")
            click.echo(f"  fix:       {pb.fix[0]}")
            click.echo(f"  guardrail: {pb.guardrail[0]}")
            click.echo(f"  runbook:   servediag runbook {pb.id}")
    click.echo(
        f"\ndone in {time.monotonic() - start:.1f} s; Prometheus stopped, its data "
        "removed, nothing left running"
    )


if __name__ == "__main__":
    main()
