"""``servediag signals``, ``generate`` and ``runbook``: the site's outputs from the catalog."""

from __future__ import annotations

from pathlib import Path

import click

from diagnoser.cli.options import (
    EXIT_FOUND,
    catalog_option,
    check_alert_rules,
    config_option,
    fail,
    handles_errors,
    load_site,
    playbook,
)
from diagnoser.metrics import engines


@click.command("signals")
@click.argument("name", required=False)
@click.option("--instance", is_flag=True, help="Aggregate per (model_name, instance).")
@config_option
@handles_errors
def signals_cmd(name: str | None, instance: bool, config_path: Path | None) -> None:
    """List the signal vocabulary, or print one signal's PromQL for the site.

    \b
    Examples:
      servediag signals
      servediag signals ttft_p95 --instance
      servediag signals ttft_slo_attainment --config my-site.yaml
    """
    site = load_site(config_path)
    vocab = site.vocabulary
    if name is None:
        for sig in vocab:
            click.echo(f"{sig.name:<34} {sig.unit:<9} {sig.help}")
        return
    if name not in vocab:
        fail(f"unknown signal {name!r}; see 'servediag signals'")
    sig = vocab[name]
    scope = site.scope(sig, instance=instance and not sig.target_level)
    click.echo(f"# {sig.name} ({sig.unit}): {sig.help}")
    click.echo(f"# recorded as {sig.record_name(scope.by)}; needs {'; '.join(sig.provided_by())}")
    for engine in engines.others():
        if sig.on(engine.name):
            on = "; ".join(sig.provided_by_on(engine.name)) or "its targets"
            click.echo(f"# on {engine.title}: {on}")
        else:
            click.echo(f"# not on {engine.title}: {sig.gap(engine.name)}")
    click.echo(sig.render(scope))


@click.command("generate")
@click.option(
    "--out",
    "out_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Root directory; writes rules/, runbooks/ and dashboards/ under it.",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if any generated file is missing or stale."
)
@click.option(
    "--configmaps",
    is_flag=True,
    help="Also write dashboards/configmaps.yaml: every dashboard as a ConfigMap for "
    "kube-prometheus-stack's Grafana sidecar.",
)
@catalog_option
@config_option
@handles_errors
def generate_cmd(
    out_root: Path,
    check: bool,
    configmaps: bool,
    catalog_dirs: tuple[Path, ...],
    config_path: Path | None,
) -> None:
    """Generate Prometheus rules (plain and PrometheusRule), runbook pages and Grafana
    dashboards for the site.

    \b
    Examples:
      servediag generate
      servediag generate --config my-site.yaml --catalog ./my-playbooks --out deploy/
      servediag generate --check
      servediag generate --configmaps --out deploy/     # for the Grafana sidecar
    """
    from diagnoser.outputs import generate
    from diagnoser.outputs.promcheck import config_matchers_problem, rule_files_problem
    from diagnoser.outputs.rules import ALERTS_FILE, RECORDING_FILE

    site = load_site(config_path, catalog_dirs)
    if config_path is not None:
        wrong = config_matchers_problem(site)
        if wrong is not None:
            fail(f"{config_path}: {wrong}")
    for line in site.config.off_bound():
        click.echo(f"note: {line}", err=True)
    files = generate.render(site, configmaps=configmaps)
    check_alert_rules(site, site.catalog.detectable())
    # The whole rule files, as Prometheus will load them, before anything is written: what
    # the site config alone shapes (the SLO and symptom rules) is checked nowhere else.
    rule_files = {name: files[Path("rules") / name] for name in (RECORDING_FILE, ALERTS_FILE)}
    problem = rule_files_problem(rule_files)
    if problem is not None:
        where = f" from {config_path}" if config_path else ""
        fail(
            f"the rules generated{where} would not load in Prometheus, so nothing was "
            f"written: {problem}",
            EXIT_FOUND,
        )
    if check:
        outdated = generate.stale(files, out_root)
        for rel in outdated:
            click.echo(f"stale: {rel}", err=True)
        if outdated:
            fail(f"{len(outdated)} generated file(s) are stale; run 'make generate'", EXIT_FOUND)
        click.echo(f"ok: {len(files)} generated files are up to date")
        return
    try:
        changed = generate.write(files, out_root)
    except OSError as exc:
        where = f": {exc.filename}" if exc.filename else ""
        fail(f"cannot write under --out {out_root}: {exc.strerror or exc}{where}")
    for rel in changed:
        click.echo(f"wrote {rel}")
    click.echo(f"{len(files)} files generated, {len(changed)} changed")


@click.command("runbook")
@click.argument("playbook_id")
@catalog_option
@config_option
@handles_errors
def runbook_cmd(playbook_id: str, catalog_dirs: tuple[Path, ...], config_path: Path | None) -> None:
    """Print one playbook's runbook (Meaning, Impact, Diagnosis, Mitigation, Guardrail).

    Example: servediag runbook queue-saturation
    """
    from diagnoser.outputs.runbooks import render_runbook

    site = load_site(config_path, catalog_dirs)
    text = render_runbook(playbook(site.catalog, playbook_id), site)
    click.echo(text.split("\n", 1)[1], nl=False)
