"""``make demo``: what on-call would see for a simulated incident, end to end.

The incident simulator and ``diagnose`` are not in this build yet, so the demo runs the parts
that exist (catalog, rules checked by promtool, the runbook on-call would open) and says which
steps are still to come.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

import click

from diagnoser import rules
from diagnoser.catalog import Catalog, CatalogError, load_catalog
from diagnoser.config import RulesConfig


def scenario_slug(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
    return re.sub(r"^the-", "", slug)


def scenarios(catalog: Catalog) -> dict[str, str]:
    """Seed scenario slug -> the playbook that explains it."""
    return {scenario_slug(pb.seed_scenario): pb.id for pb in catalog if pb.seed_scenario}


def step(n: int, total: int, text: str) -> None:
    click.echo(f"[{n}/{total}] {text}")


@click.command()
@click.option(
    "--scenario", default="retrieval-launch", show_default=True, help="Which seed incident to show."
)
def main(scenario: str) -> None:
    """Walk through a seed incident with what this build can do."""
    total = 5
    start = time.monotonic()
    step(1, total, "loading the playbook catalog")
    try:
        catalog = load_catalog()
    except CatalogError as exc:
        click.echo(f"demo: error: {exc}", err=True)
        sys.exit(2)
    known = scenarios(catalog)
    if scenario not in known:
        click.echo(
            f"demo: error: unknown scenario {scenario!r} (known: {', '.join(sorted(known))})",
            err=True,
        )
        sys.exit(2)
    click.echo(f"      {len(catalog)} playbooks, {len(catalog.detectable())} with alerts")

    step(2, total, "generating Prometheus rules and checking them with promtool")
    with tempfile.TemporaryDirectory(prefix="servediag-demo-") as tmp:
        files = rules.render_files(catalog, RulesConfig())
        paths = []
        for name in (rules.RECORDING_FILE, rules.ALERTS_FILE):
            path = Path(tmp) / name
            path.write_text(files[name], encoding="utf-8")
            paths.append(path)
        try:
            rules.check_rules(paths)
        except rules.PromtoolError as exc:
            click.echo(f"demo: error: {exc}", err=True)
            sys.exit(1)
    click.echo("      promtool check rules: SUCCESS")

    step(
        3,
        total,
        f"simulating '{scenario}' with vLLM's metric names: "
        "not in this build yet (the incident simulator)",
    )
    step(4, total, "backfilling it into a throwaway Prometheus: not in this build yet")
    pb = catalog[known[scenario]]
    step(
        5,
        total,
        f"diagnose --since 1h: not in this build yet; for this incident it should "
        f"name '{pb.id}' first:",
    )
    click.echo()
    click.echo(f"  {pb.title}")
    click.echo(f"  cause:     {pb.cause.split('. ')[0]}.")
    click.echo(f"  fix:       {pb.fix[0]}")
    click.echo(f"  guardrail: {pb.guardrail[0]}")
    click.echo(f"  runbook:   servediag runbook {pb.id}")
    click.echo(f"\ndone in {time.monotonic() - start:.1f} s; nothing left running")


if __name__ == "__main__":
    main()
