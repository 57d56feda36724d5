"""``servediag catalog``: list, show and validate playbooks; print the playbook schema."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import click

from diagnoser.cli.options import (
    catalog_option,
    check_alert_rules,
    handles_errors,
    load_catalog,
    playbook,
)

if TYPE_CHECKING:
    from diagnoser.catalog import Playbook


@click.group()
def catalog() -> None:
    """The playbook catalog: symptom patterns with cause, fix and guardrail.

    \b
    Examples:
      servediag catalog list
      servediag catalog show stop-token-mismatch
      servediag catalog validate ./my-playbooks
      servediag catalog schema > playbook.schema.json
    """


@catalog.command("list")
@catalog_option
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@handles_errors
def catalog_list(catalog_dirs: tuple[Path, ...], fmt: str) -> None:
    """List every playbook with its kind, severity and alert.

    Example: servediag catalog list --format json
    """
    cat = load_catalog(catalog_dirs)
    rows = [
        {
            "id": pb.id,
            "kind": pb.kind,
            "severity": pb.severity,
            "chapter": pb.chapter,
            "alert": pb.alert.name if pb.alert else None,
            "title": pb.title,
        }
        for pb in cat
    ]
    if fmt == "json":
        click.echo(json.dumps(rows, indent=2))
        return
    width = max(len(r["id"] or "") for r in rows)
    for r in rows:
        alert = r["alert"] or "-"
        click.echo(
            f"{r['id']:<{width}}  {r['kind']:<10}  {r['severity']:<8}  {alert:<32}  {r['title']}"
        )
    n_det = sum(1 for r in rows if r["kind"] == "detectable")
    click.echo(f"\n{len(rows)} playbooks: {n_det} detectable, {len(rows) - n_det} advisory")


@catalog.command("show")
@click.argument("playbook_id")
@catalog_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "yaml"]),
    default="text",
    show_default=True,
    help="text: a summary; yaml: the playbook file itself.",
)
@handles_errors
def catalog_show(playbook_id: str, catalog_dirs: tuple[Path, ...], fmt: str) -> None:
    """Show one playbook: symptom, signature, cause, fix, guardrail and alert.

    Example: servediag catalog show kv-cache-pressure
    """
    pb = playbook(load_catalog(catalog_dirs), playbook_id)
    if fmt == "yaml":
        from diagnoser.catalog import CatalogError
        from diagnoser.plumbing.errors import MAX_YAML_BYTES, read_text

        click.echo(read_text(pb.path, CatalogError, MAX_YAML_BYTES), nl=False)
        return
    click.echo(summary(pb))


def summary(pb: Playbook) -> str:
    def para(label: str, text: str) -> list[str]:
        return [f"{label}:", *textwrap.wrap(text, 92, initial_indent="  ", subsequent_indent="  ")]

    lines = [
        f"{pb.id}: {pb.title}",
        f"  {pb.kind}, severity {pb.severity}, chapter '{pb.chapter_title}'",
        "",
    ]
    lines += para("Symptom", pb.symptom)
    if pb.signature:
        lines.append("Signature:")
        sig = pb.signature
        lines += [f"  all:  {c.describe()}" for c in sig.all]
        lines += [f"  any:  {c.describe()}" for c in sig.any]
        lines += [f"  none: {c.describe()}  ({c.why})" for c in sig.none]
        lines += [f"  +:    {c.describe()}" for c in sig.supporting]
        if sig.explains:
            lines.append(f"  explains: {', '.join(sig.explains)}")
    lines += para("Cause", pb.cause)
    lines.append("Fix:")
    lines += [f"  {i}. {f}" for i, f in enumerate(pb.fix, 1)]
    lines.append("Guardrail:")
    lines += [f"  - {g}" for g in pb.guardrail]
    if pb.alert:
        lines.append(f"Alert: {pb.alert.name} ({pb.alert.severity}, for {pb.alert.for_})")
    if pb.relates_to:
        lines.append(f"Related: {', '.join(pb.relates_to)}")
    lines.append(f"Evidence: {', '.join(pb.evidence)}")
    return "\n".join(lines)


@catalog.command("validate")
@click.argument("directory", type=click.Path(path_type=Path))
@handles_errors
def catalog_validate(directory: Path) -> None:
    """Check a directory of your own playbooks against the schema and the built-in catalog.

    Each alert is rendered and parsed as Prometheus will load it (promtool, or without it the
    promql-parser library and a template check): an expression that does not parse or a
    description that is not a valid template is an error too. Prints one line when all is
    well; a problem in a file's schema or references is one line naming the file and the
    field, every problem in an alert is a line of its own, and the exit status is 2.

    Example: servediag catalog validate ./my-playbooks
    """
    from diagnoser.catalog import builtin_dir
    from diagnoser.outputs.rules import render_files
    from diagnoser.site import Site, SiteConfig

    builtin = directory.resolve() == builtin_dir().resolve()
    cat = load_catalog(()) if builtin else load_catalog((directory,))
    site = Site.build(SiteConfig(), cat)
    render_files(site)  # alert expressions resolve and render
    mine = [pb for pb in cat if pb.path.parent.resolve() == directory.resolve()]
    parser = check_alert_rules(site, mine)
    how = f"alerts parsed with {parser}" if parser else "alert expressions not parsed: no parser"
    click.echo(f"ok: {len(mine)} playbook(s) in {directory} are valid ({how})")


@catalog.command("schema")
def catalog_schema() -> None:
    """Print the playbook JSON schema (for editors and your own validation).

    Example: servediag catalog schema > playbook.schema.json
    """
    from diagnoser.catalog.schema import render

    click.echo(render(), nl=False)
