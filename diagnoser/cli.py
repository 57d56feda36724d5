"""servediag: the command line. A thin layer: parse options, call the library, render.

Exit status: 0 success; 1 a check found something (stale generated files); 2 bad usage,
a bad playbook or config; 3 the metric source cannot be reached or answers garbage.
Heavy modules are imported inside commands so ``--help`` stays fast.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

if TYPE_CHECKING:
    from diagnoser.catalog import Catalog, Playbook
    from diagnoser.source import PrometheusSource

EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_SOURCE = 3

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    click.echo(f"servediag: error: {message}", err=True)
    sys.exit(code)


def handles_errors(fn: F) -> F:
    """Turn the library's expected errors into one line on stderr and an exit status."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from diagnoser.errors import UserError
        from diagnoser.rules import PromtoolError

        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            fail(str(exc))
        except PromtoolError as exc:
            fail(f"promtool: {exc}", EXIT_FOUND)

    return wrapper  # type: ignore[return-value]


catalog_option = click.option(
    "--catalog",
    "catalog_dirs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="A directory of your own playbooks, added to the built-in catalog (repeatable).",
)
config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Rules config (selectors, runbook URL, thresholds); see README.",
)


def _catalog(dirs: tuple[Path, ...]) -> Catalog:
    from diagnoser.catalog import load_catalog

    return load_catalog(*dirs)


def _playbook(catalog: Catalog, pid: str) -> Playbook:
    if pid not in catalog:
        import difflib

        near = difflib.get_close_matches(pid, catalog.ids(), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else "; see 'servediag catalog list'"
        fail(f"no playbook {pid!r}{hint}")
    return catalog[pid]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="servediag")
def main() -> None:
    """Diagnose LLM inference servers (vLLM) from Prometheus.

    \b
    Examples:
      servediag catalog list
      servediag runbook kv-cache-pressure
      servediag generate --check
    """


# --- catalog --------------------------------------------------------------------------------


@main.group()
def catalog() -> None:
    """The playbook catalog: symptom patterns with cause, fix and guardrail.

    \b
    Examples:
      servediag catalog list
      servediag catalog show stop-token-mismatch
      servediag catalog validate ./my-playbooks
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
    cat = _catalog(catalog_dirs)
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
    pb = _playbook(_catalog(catalog_dirs), playbook_id)
    if fmt == "yaml":
        click.echo(pb.path.read_text(encoding="utf-8"), nl=False)
        return
    click.echo(_summary(pb))


def _summary(pb: Playbook) -> str:
    import textwrap

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

    Prints one line per problem-free run; the first problem is reported with the file and
    the field, and the exit status is 2.

    Example: servediag catalog validate ./my-playbooks
    """
    from diagnoser.catalog import builtin_dir, load_catalog
    from diagnoser.config import RulesConfig
    from diagnoser.rules import render_files

    builtin = directory.resolve() == builtin_dir().resolve()
    cat = load_catalog() if builtin else load_catalog(directory)
    render_files(cat, RulesConfig())  # alert expressions resolve and render
    mine = [pb for pb in cat if pb.path.parent.resolve() == directory.resolve()]
    click.echo(f"ok: {len(mine)} playbook(s) in {directory} are valid")


# --- signals, rules, runbooks ---------------------------------------------------------------


@main.command("signals")
@click.argument("name", required=False)
@click.option("--instance", is_flag=True, help="Aggregate per (model_name, instance).")
def signals_cmd(name: str | None, instance: bool) -> None:
    """List the signal vocabulary, or print one signal's PromQL.

    \b
    Examples:
      servediag signals
      servediag signals ttft_p95 --instance
    """
    from diagnoser.promql import Scope
    from diagnoser.signals import SIGNALS

    if name is None:
        for sig in SIGNALS:
            click.echo(f"{sig.name:<34} {sig.unit:<9} {sig.help}")
        return
    if name not in SIGNALS:
        fail(f"unknown signal {name!r}; see 'servediag signals'")
    sig = SIGNALS[name]
    by = (*sig.by, "instance") if instance and "instance" not in sig.by else sig.by
    click.echo(f"# {sig.name} ({sig.unit}): {sig.help}")
    click.echo(f"# recorded as {sig.record_name(by)}; needs {'; '.join(sig.provided_by())}")
    click.echo(sig.render(Scope(by=by)))


@main.command("generate")
@click.option(
    "--out",
    "out_root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Root directory; writes rules/ and runbooks/ under it.",
)
@click.option(
    "--check", is_flag=True, help="Write nothing; exit 1 if any generated file is missing or stale."
)
@catalog_option
@config_option
@handles_errors
def generate_cmd(
    out_root: Path, check: bool, catalog_dirs: tuple[Path, ...], config_path: Path | None
) -> None:
    """Generate Prometheus rules (plain and PrometheusRule) and runbook pages.

    \b
    Examples:
      servediag generate
      servediag generate --config my-site.yaml --catalog ./my-playbooks --out deploy/
      servediag generate --check
    """
    from diagnoser import generate
    from diagnoser.config import load_config

    files = generate.render(_catalog(catalog_dirs), load_config(config_path))
    if check:
        outdated = generate.stale(files, out_root)
        for rel in outdated:
            click.echo(f"stale: {rel}", err=True)
        if outdated:
            fail(f"{len(outdated)} generated file(s) are stale; run 'make generate'", EXIT_FOUND)
        click.echo(f"ok: {len(files)} generated files are up to date")
        return
    changed = generate.write(files, out_root)
    for rel in changed:
        click.echo(f"wrote {rel}")
    click.echo(f"{len(files)} files generated, {len(changed)} changed")


@main.command("runbook")
@click.argument("playbook_id")
@catalog_option
@config_option
@handles_errors
def runbook_cmd(playbook_id: str, catalog_dirs: tuple[Path, ...], config_path: Path | None) -> None:
    """Print one playbook's runbook (Meaning, Impact, Diagnosis, Mitigation, Guardrail).

    Example: servediag runbook queue-saturation
    """
    from diagnoser.config import load_config
    from diagnoser.runbooks import render_runbook

    cat = _catalog(catalog_dirs)
    text = render_runbook(_playbook(cat, playbook_id), cat, load_config(config_path))
    click.echo(text.split("\n", 1)[1], nl=False)


# --- simulate -------------------------------------------------------------------------------


def parse_time(value: str) -> float:
    """RFC 3339 (``2026-11-29T02:00:00Z``) or a Unix timestamp."""
    from datetime import datetime

    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither RFC 3339 nor a Unix timestamp") from None


def parse_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise click.BadParameter(f"{value!r} is not HOST:PORT")
    return host, int(port)


@main.command("simulate")
@click.argument("scenario", required=False)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write timestamped OpenMetrics here (for promtool tsdb create-blocks-from).",
)
@click.option(
    "--end",
    "end",
    default=None,
    metavar="TIME",
    help="Time of the last sample: RFC 3339 or Unix seconds (default: now).",
)
@click.option(
    "--serve",
    "listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve /metrics live, in real time, instead of writing a file.",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0.01, max=1000),
    default=1.0,
    show_default=True,
    help="With --serve: simulated seconds per wall second.",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--list", "list_", is_flag=True, help="List the library's scenarios and exit.")
@handles_errors
def simulate_cmd(
    scenario: str | None,
    out: Path | None,
    end: str | None,
    listen: str | None,
    speed: float,
    force: bool,
    list_: bool,
) -> None:
    """Simulate a scenario with vLLM's real metric names.

    SCENARIO is a name from the library (fixtures/scenarios) or a path to a YAML file.

    \b
    Examples:
      servediag simulate retrieval-launch --out incident.om
      promtool tsdb create-blocks-from openmetrics incident.om ./data
      servediag simulate healthy-diurnal --serve 127.0.0.1:8000
    """
    import time

    from diagnoser.sim import library

    if list_:
        for name in library.names():
            click.echo(name)
        return
    if scenario is None:
        fail("name a scenario (servediag simulate --list shows the library)")
    if (out is None) == (listen is None):
        fail("give exactly one of --out FILE or --serve HOST:PORT")
    sc = library.find(scenario)
    if listen is not None:
        from diagnoser.sim.live import serve

        host, port = parse_listen(listen)
        click.echo(f"serving {sc.name} on http://{host}:{port}/metrics (Ctrl-C to stop)", err=True)
        try:
            serve(sc, host, port, speed=speed)
        except OSError as exc:
            fail(f"cannot listen on {listen}: {exc.strerror or exc}")
        except KeyboardInterrupt:
            pass
        return
    assert out is not None
    if out.exists() and not force:
        fail(f"{out} exists; pass --force to overwrite it")
    end_ts = parse_time(end) if end else time.time()
    from diagnoser.sim.exposition import write_openmetrics
    from diagnoser.sim.run import simulate

    t0 = time.monotonic()
    rec = simulate(sc, end_ts)
    tmp = out.with_name(out.name + ".partial")
    try:
        with tmp.open("w", encoding="utf-8") as fh:
            write_openmetrics(rec, fh)
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(
        f"{sc.name}: {sc.duration / 3600:g} h simulated in {time.monotonic() - t0:.1f} s,"
        f" {rec.sample_count()} samples -> {out}",
        err=True,
    )


# --- the metric source, shared by diagnose and webhook ---------------------------------------

SOURCE_OPTIONS = (
    click.option(
        "--prometheus-url",
        envvar="PROMETHEUS_URL",
        default="http://localhost:9090",
        show_default=True,
        help="Prometheus-compatible API (also PROMETHEUS_URL).",
    ),
    click.option(
        "--bearer-token-file",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Read a bearer token from this file (or set PROMETHEUS_BEARER_TOKEN).",
    ),
    click.option(
        "--basic-auth",
        envvar="PROMETHEUS_BASIC_AUTH",
        default=None,
        metavar="USER:PASS",
        help="Basic auth (also PROMETHEUS_BASIC_AUTH).",
    ),
    click.option(
        "--header",
        "headers",
        multiple=True,
        metavar="NAME=VALUE",
        help="Extra request header, e.g. X-Scope-OrgID=tenant (repeatable).",
    ),
    click.option(
        "--ca-file",
        type=click.Path(dir_okay=False, exists=True),
        default=None,
        help="CA bundle to verify the server's certificate.",
    ),
    click.option("--insecure", is_flag=True, help="Do not verify TLS certificates."),
    click.option(
        "--timeout",
        type=click.FloatRange(min=1, max=600),
        default=30.0,
        show_default=True,
        help="Seconds to wait for each query.",
    ),
)


def source_options(fn: F) -> F:
    """The Prometheus URL, authentication and timeout options, passed on as keywords."""
    for option in reversed(SOURCE_OPTIONS):
        fn = option(fn)
    return fn


def _source(
    prometheus_url: str,
    bearer_token_file: Path | None,
    basic_auth: str | None,
    headers: tuple[str, ...],
    ca_file: str | None,
    insecure: bool,
    timeout: float,
) -> PrometheusSource:
    import os

    from diagnoser.source import Auth, PrometheusSource

    token = os.environ.get("PROMETHEUS_BEARER_TOKEN")
    if bearer_token_file is not None:
        try:
            token = bearer_token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            fail(f"cannot read --bearer-token-file {bearer_token_file}: {exc.strerror}")
    basic = None
    if basic_auth:
        user, sep, password = basic_auth.partition(":")
        if not sep:
            fail("--basic-auth must be USER:PASS")
        basic = (user, password)
    extra = {}
    for h in headers:
        name, sep, value = h.partition("=")
        if not sep or not name.strip():
            fail(f"--header {name.strip() or h!r} must be NAME=VALUE")
        extra[name.strip()] = value.strip()
    auth = Auth(bearer_token=token, basic=basic, headers=extra, ca_file=ca_file, insecure=insecure)
    return PrometheusSource(prometheus_url, auth, timeout=timeout)


# --- diagnose -------------------------------------------------------------------------------


def parse_duration_option(value: str) -> float:
    from diagnoser.sim.scenario import parse_duration

    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds <= 0:
        raise click.BadParameter("must be longer than zero")
    return seconds


def _matchers(
    model: str | None, instance: str | None, job: str | None, match: tuple[str, ...]
) -> tuple[str, ...]:
    import re

    out = []
    for label, value in (("model_name", model), ("instance", instance), ("job", job)):
        if value:
            out.append(f'{label}="{value}"')
    for m in match:
        if not re.fullmatch(r'[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"]*"', m.strip()):
            fail(f'--match {m!r} is not a label matcher like job="vllm" or pod=~"vllm-.*"')
        out.append(m.strip())
    return tuple(out)


@main.command("diagnose")
@click.option(
    "--since",
    "since",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Diagnose this much time up to --until (e.g. 30m, 1h, 6h).",
)
@click.option(
    "--until",
    "until",
    default=None,
    metavar="TIME",
    help="End of the window: RFC 3339 or Unix seconds (default: now).",
)
@click.option(
    "--baseline",
    "baseline",
    default="before",
    show_default=True,
    help="Reference period: 'before' (as long as the window, just before it) or a "
    "duration such as 1d (the same hours that long ago).",
)
@click.option("--model", default=None, help="Only this model_name.")
@click.option("--instance", default=None, help="Only this instance.")
@click.option("--job", default=None, help="Only this job.")
@click.option(
    "--match",
    "match",
    multiple=True,
    metavar='LABEL="VALUE"',
    help="Any further label matcher (repeatable).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "markdown", "html"]),
    default="text",
    show_default=True,
    help="html: one self-contained page with plots of the evidence (use --output).",
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
@source_options
@catalog_option
@config_option
@handles_errors
def diagnose_cmd(
    since: str,
    until: str | None,
    baseline: str,
    model: str | None,
    instance: str | None,
    job: str | None,
    match: tuple[str, ...],
    fmt: str,
    output: Path | None,
    explain: str | None,
    catalog_dirs: tuple[Path, ...],
    config_path: Path | None,
    **source_args: Any,
) -> None:
    """Match live Prometheus series against the playbooks; the likely cause first.

    Exit status: 0 the diagnosis ran (with or without findings), 2 bad usage or catalog,
    3 the metric source cannot be reached or answers garbage.

    \b
    Examples:
      diagnose --since 1h
      diagnose --since 6h --model llama-3.1-8b --format json
      diagnose --since 2h --until 2026-11-29T03:00:00Z --prometheus-url http://thanos:10902
      diagnose --explain kv-cache-pressure
    """
    import os
    import sys
    import time

    from diagnoser import report
    from diagnoser.config import load_config
    from diagnoser.diagnosis import Window, diagnose, to_json
    from diagnoser.source import SourceError

    window_s = parse_duration_option(since)
    end = parse_time(until) if until else time.time()
    offset = None if baseline == "before" else parse_duration_option(baseline)
    source = _source(**source_args)
    cat = _catalog(catalog_dirs)
    if explain is not None:
        _playbook(cat, explain)
    cfg = load_config(config_path)
    try:
        result = diagnose(
            source,
            cat,
            Window.plan(window_s, end, offset),
            _matchers(model, instance, job, match),
            cfg,
        )
    except SourceError as exc:
        fail(str(exc), EXIT_SOURCE)
    if explain is not None:
        click.echo(report.explain(result, explain), nl=False)
        return
    doc = to_json(result, cfg)
    if fmt == "json":
        rendered = report.as_json(doc)
    elif fmt == "markdown":
        rendered = report.markdown(doc)
    elif fmt == "html":
        from diagnoser.report_html import render

        rendered = render(result, doc)
    else:
        colour = output is None and sys.stdout.isatty() and os.environ.get("NO_COLOR") is None
        rendered = report.text(doc, colour=colour)
    if output is None:
        click.echo(rendered, nl=False)
        return
    try:
        output.write_text(rendered, encoding="utf-8")
    except OSError as exc:
        fail(f"cannot write {output}: {exc.strerror or exc}")
    top = doc["findings"][0]["id"] if doc["findings"] else "no finding"
    click.echo(
        f"{len(doc['findings'])} finding(s), first: {top}; report written to {output}", err=True
    )


def diagnose_main() -> None:
    """The ``diagnose`` console script: the same as ``servediag diagnose``."""
    diagnose_cmd.main(args=sys.argv[1:], prog_name="diagnose")


# --- webhook --------------------------------------------------------------------------------


@main.command("webhook")
@click.option(
    "--listen",
    required=True,
    metavar="HOST:PORT",
    help="Address to serve on; point Alertmanager's webhook_configs at http://HOST:PORT/alerts.",
)
@click.option(
    "--since",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="How far back each diagnosis looks, up to the moment the alert arrives.",
)
@click.option(
    "--baseline",
    default="before",
    show_default=True,
    help="Reference period, as for diagnose: 'before' or a duration such as 1d.",
)
@click.option(
    "--step",
    default=None,
    metavar="DURATION",
    help="Query resolution, rates over four steps (default: planned from --since, at least "
    "15 s with 5 m rates). Only for fast scrapes and windows of minutes.",
)
@click.option(
    "--slack-url",
    envvar="SERVEDIAG_SLACK_WEBHOOK_URL",
    default=None,
    metavar="URL",
    help="Also post each diagnosis to this Slack-compatible incoming webhook "
    "(also SERVEDIAG_SLACK_WEBHOOK_URL).",
)
@click.option(
    "--dedupe-window",
    default="1h",
    show_default=True,
    metavar="DURATION",
    help="Skip an alert (same name, playbook and model) diagnosed less than this ago.",
)
@click.option(
    "--queue-size",
    type=click.IntRange(1, 10_000),
    default=32,
    show_default=True,
    help="Alert groups that may wait for a diagnosis; beyond it Alertmanager gets 503.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 32),
    default=2,
    show_default=True,
    help="Diagnoses run at once (one per alert group at a time).",
)
@source_options
@catalog_option
@config_option
@handles_errors
def webhook_cmd(
    listen: str,
    since: str,
    baseline: str,
    step: str | None,
    slack_url: str | None,
    dedupe_window: str,
    queue_size: int,
    workers: int,
    catalog_dirs: tuple[Path, ...],
    config_path: Path | None,
    **source_args: Any,
) -> None:
    """Receive Alertmanager notifications and diagnose each firing playbook alert.

    For every firing alert with a `playbook` label, runs the diagnosis of that alert's model
    over the last --since and prints one JSON line on stdout: the alert, its playbook id and
    runbook_url, the top finding and the whole diagnosis. Logs go to stderr. A bad payload is
    answered 400, a full queue 503; a failing diagnosis is logged and the receiver goes on.
    GET /healthz and GET /metrics are served too. Stops on Ctrl-C or SIGTERM.

    \b
    Examples:
      servediag webhook --listen 0.0.0.0:9095 --prometheus-url http://prometheus:9090
      servediag webhook --listen 127.0.0.1:9095 --slack-url https://hooks.slack.com/services/...
    """
    import logging
    import signal
    import threading

    from diagnoser.config import load_config
    from diagnoser.diagnosis import MIN_STEP
    from diagnoser.notify import SlackForwarder
    from diagnoser.source import MAX_POINTS
    from diagnoser.webhook import Webhook
    from diagnoser.webhook_http import serve

    host, port = parse_listen(listen)
    since_s = parse_duration_option(since)
    offset = None if baseline == "before" else parse_duration_option(baseline)
    step_s = parse_duration_option(step) if step else None
    if step_s is not None and 2 * since_s / step_s > MAX_POINTS:
        fail(f"--step {step} is too fine for --since {since}: use at least {MIN_STEP:g}s")
    dedupe_s = parse_duration_option(dedupe_window)
    cat = _catalog(catalog_dirs)
    cfg = load_config(config_path)
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # retries end in one error line

    if slack_url and not slack_url.startswith(("http://", "https://")):
        fail("--slack-url must be an http:// or https:// URL")
    lock = threading.Lock()

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with lock:  # workers emit concurrently; a line is never split
            sys.stdout.write(line)
            sys.stdout.flush()

    hook = Webhook(
        _source(**source_args),
        cat,
        emit,
        cfg,
        since=since_s,
        baseline_offset=offset,
        step=step_s,
        forwarder=SlackForwarder(slack_url, cat) if slack_url else None,
        dedupe_window=dedupe_s,
        workers=workers,
        max_pending=queue_size,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        serve(hook, host, port, stop=stop)
    except OSError as exc:
        fail(f"cannot listen on {listen}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        pass
