"""``servediag diagnose`` (and the ``diagnose`` command): on-call's command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from diagnoser.cli.options import (
    SourceOptions,
    catalog_option,
    config_option,
    fail,
    handles_errors,
    load_site,
    playbook,
    source_options,
)
from diagnoser.cli.shared import (
    reading_options,
    scope,
    scope_options,
    setup_options,
    since_option,
    until_option,
)
from diagnoser.whatif.setup import SetupOptions


def _writable(output: Path) -> None:
    """Refuse an --output that cannot be written before any query is made: one that is a
    symbolic link (writing would replace the file it points to), a directory or a device."""
    from diagnoser.plumbing.atomic import refusal

    parent = output.parent
    if not parent.is_dir():
        fail(f"--output {output}: {parent} is not a directory")
    why = refusal(output)
    if why is not None:
        fail(f"--output {output}: {why}")
    if not os.access(output if output.exists() else parent, os.W_OK):
        fail(f"--output {output}: permission denied")


def _note_future(until: float, now: float) -> None:
    """A window that ends after now has no data there yet: say so (on stderr)."""
    if until > now + 60:
        from diagnoser.plumbing.durations import format_duration, iso

        click.echo(
            f"servediag: note: --until {iso(until)} is {format_duration(until - now)} in the "
            "future; the window has no data after now",
            err=True,
        )


@click.command("diagnose")
@since_option("Diagnose this much time up to --until (e.g. 30m, 1h, 6h).")
@until_option
@reading_options
@source_options("http://localhost:9090", "Prometheus-compatible API (also PROMETHEUS_URL).")
@scope_options
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "markdown", "html", "csv"]),
    default="text",
    show_default=True,
    help="html: one self-contained page with plots of the evidence (use --output); csv: one "
    "row per finding and condition, with its numbers.",
)
@click.option(
    "--output",
    "output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the report to this file instead of stdout.",
)
@click.option(
    "--explain",
    "explain",
    default=None,
    metavar="ID",
    help="Show one playbook's signature evaluated step by step, with the numbers.",
)
@click.option(
    "--what-if",
    "what_if",
    is_flag=True,
    help="Under each finding whose fix has levers, what each lever would buy: the model's "
    "window fitted, replayed through the calibrated simulator and replayed again with the "
    "lever (as servediag what-if; the model's shape, GPU and scheduler limits from --preset "
    "or --model-config, --gpu, --max-num-seqs, ...). Text, json and markdown.",
)
@setup_options
@catalog_option
@config_option
@handles_errors
def diagnose_cmd(
    since: float,
    until: float | None,
    lookback: float,
    baseline: float | None,
    source: SourceOptions,
    model: str | None,
    instance: str | None,
    job: str | None,
    match: tuple[str, ...],
    fmt: str,
    output: Path | None,
    explain: str | None,
    what_if: bool,
    recorded_rules: bool,
    setup: SetupOptions,
    catalog_dirs: tuple[Path, ...],
    config_path: Path | None,
) -> None:
    """Match live Prometheus series against the playbooks; the likely cause first.

    Each model's state comes first (traffic, errors, SLO attainment, targets down); a model
    that is unhealthy is never reported as healthy: when no change in the window explains it,
    diagnose looks back (--lookback) for when it began, and says plainly when no known pattern
    does. The site config (--config or SERVEDIAG_CONFIG) applies as it does to the rules: its
    selector, its group labels (each group diagnosed apart), its SLOs and its alert
    thresholds. Exit status: 0 the diagnosis ran (with or without findings), 2 bad usage or
    catalog, 3 the metric source cannot be reached or answers garbage (a --what-if that
    cannot be made is said under its finding, and does not change the status).

    \b
    Examples:
      diagnose --since 1h
      diagnose --since 6h --model llama-3.1-8b --format json
      diagnose --since 1h --lookback 3d          # it has been slow since the weekend
      diagnose --since 2h --until 2026-11-29T03:00:00Z --prometheus-url http://thanos:10902
      diagnose --explain kv-cache-pressure --config my-site.yaml
      diagnose --since 1h --what-if --preset llama-3.1-8b --gpu H100-80GB
      diagnose --since 24h --recorded-rules     # a large fleet whose site deploys the rules
    """
    import time

    from diagnoser import report
    from diagnoser.request import Request, run

    if what_if and (explain is not None or fmt not in ("text", "json", "markdown")):
        fail("--what-if: its predictions are shown in the text, json and markdown reports")
    now = time.time()
    end = until if until is not None else now
    within = scope(model, instance, job, match)
    if output is not None:
        _writable(output)
    _note_future(end, now)
    prometheus = source.connect()
    site = load_site(config_path, catalog_dirs)
    if explain is not None:
        playbook(site.catalog, explain)
    request = Request(
        prometheus,
        site,
        since,
        until=end,
        baseline=baseline,
        scope=within,
        lookback=lookback,
        recorded_rules=recorded_rules,
        what_if=setup if what_if else None,
    )
    result = run(request)
    if explain is not None:
        from diagnoser.plumbing.printable import inert
        from diagnoser.report.explain import explain as explain_text

        click.echo(inert(explain_text(result, explain)), nl=False)
        return
    colour = output is None and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
    rendered = report.render(result, fmt, colour=colour)
    if output is None:
        click.echo(rendered, nl=False)
        return
    from diagnoser.plumbing.atomic import write_atomic

    try:  # whole or not at all, and never through a link put there meanwhile
        write_atomic(output, rendered.encode("utf-8"))
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    top = result.findings[0].playbook.id if result.findings else "no finding"
    ended = f", {len(result.resolved)} resolved in the window" if result.resolved else ""
    click.echo(
        f"{len(result.findings)} finding(s){ended}, first: {top}; report written to {output}",
        err=True,
    )


def diagnose_main() -> None:
    """The ``diagnose`` console script: the same as ``servediag diagnose``."""
    from diagnoser.cli.options import main_one_line

    diagnose_cmd.context_settings.setdefault("help_option_names", ["-h", "--help"])
    main_one_line(diagnose_cmd, sys.argv[1:], "diagnose")
