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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

# Preset names and KV dtypes for the options' help; the module is stdlib only, so still fast.
from diagnoser.sim.hardware import KV_CACHE_DTYPES, MODEL_ALIASES

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
@click.option(
    "--proxy-buffer",
    "proxy_buffer",
    default=None,
    metavar="SECONDS|full",
    help="With --serve: a buffering proxy in front of the API that releases streams every "
    "SECONDS (simulated), or only when complete ('full').",
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
    proxy_buffer: str | None,
    force: bool,
    list_: bool,
) -> None:
    """Simulate a scenario with vLLM's real metric names.

    SCENARIO is a name from the library (fixtures/scenarios) or a path to a YAML file. With
    --serve it runs in real time and also answers OpenAI-compatible requests
    (/v1/completions, /v1/chat/completions, streamed or not) with the timing its engine
    predicts.

    \b
    Examples:
      servediag simulate retrieval-launch --out incident.om
      promtool tsdb create-blocks-from openmetrics incident.om ./data
      servediag simulate healthy-diurnal --serve 127.0.0.1:8000
      servediag simulate healthy-steady --serve 127.0.0.1:8000 --proxy-buffer full
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
    if proxy_buffer is not None and listen is None:
        fail("--proxy-buffer needs --serve")
    proxy = None
    if proxy_buffer is not None:
        from diagnoser.sim.openai import ProxyBuffer

        try:
            proxy = ProxyBuffer.parse(proxy_buffer)
        except ValueError as exc:
            fail(f"--proxy-buffer: {exc}")
    sc = library.find(scenario)
    if listen is not None:
        from diagnoser.sim.live import serve

        host, port = parse_listen(listen)
        click.echo(
            f"serving {sc.name} on http://{host}:{port} (/metrics, /v1/models, /v1/completions,"
            " /v1/chat/completions; Ctrl-C to stop)",
            err=True,
        )
        try:
            serve(sc, host, port, speed=speed, proxy=proxy)
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


# --- probe ----------------------------------------------------------------------------------


def _positive_int(option: str, value: str, most: int) -> int:
    text = value.strip()
    if not text.isdigit() or not 1 <= int(text) <= most:
        fail(f"{option} {value!r} must be a whole number from 1 to {most}")
    return int(text)


def _seconds(option: str, value: str) -> float:
    from diagnoser.sim.scenario import parse_duration

    try:
        seconds = parse_duration(float(value) if value.strip().isdecimal() else value)
    except ValueError as exc:
        fail(f"{option}: {exc}")
    if seconds <= 0:
        fail(f"{option} must be longer than zero")
    return seconds


def _header_pairs(headers: tuple[str, ...]) -> dict[str, str]:
    """``NAME:VALUE`` (or ``NAME=VALUE``): split at whichever comes first."""
    out = {}
    for h in headers:
        cut = min((i for i in (h.find(":"), h.find("=")) if i > 0), default=-1)
        if cut < 0 or not h[:cut].strip() or " " in h[:cut].strip():
            fail(f"--header {h.split(':')[0].split('=')[0]!r} must be NAME:VALUE")
        out[h[:cut].strip()] = h[cut + 1 :].strip()
    return out


@main.command("probe")
@click.option(
    "--target",
    default=None,
    metavar="URL",
    help="Base URL of the OpenAI-compatible "
    "API, as users reach it (through the same gateway), with or without /v1.",
)
@click.option("--model", default=None, help="Model to ask (default: the first of /v1/models).")
@click.option(
    "--api",
    type=click.Choice(["chat", "completions"]),
    default="chat",
    show_default=True,
    help="/v1/chat/completions or /v1/completions.",
)
@click.option(
    "--classes",
    default="128,1k,4k,16k",
    show_default=True,
    help="Prompt length classes in tokens (k = 1024): the prompt_bucket labels.",
)
@click.option(
    "--every",
    default="30s",
    show_default=True,
    metavar="DURATION",
    help="Time between rounds; a round sends one request per class.",
)
@click.option(
    "--budget",
    default="12/min",
    show_default=True,
    metavar="N/min",
    help="At most N requests started in any minute.",
)
@click.option(
    "--max-in-flight",
    default="2",
    show_default=True,
    metavar="N",
    help="At most N requests at once.",
)
@click.option(
    "--max-tokens",
    default="16",
    show_default=True,
    metavar="N",
    help="max_tokens of every request: keep it small.",
)
@click.option(
    "--timeout",
    default="30s",
    show_default=True,
    metavar="DURATION",
    help="Longest a request may take, stream included.",
)
@click.option(
    "--tokenizer",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The served model's tokenizer.json, for exact prompt lengths (needs the "
    "tokenizers package); without it, a documented approximation.",
)
@click.option(
    "--listen",
    default="0.0.0.0:9464",
    show_default=True,
    metavar="HOST:PORT",
    help="Serve the probe's /metrics here.",
)
@click.option(
    "--target-label",
    default=None,
    metavar="NAME",
    help="The target label's value (default: the URL's host[:port]).",
)
@click.option(
    "--header",
    "headers",
    multiple=True,
    metavar="NAME:VALUE",
    help="Extra request header (repeatable).",
)
@click.option(
    "--bearer-token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Send its content as a bearer token (read again per request).",
)
@click.option(
    "--ca-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="CA bundle to verify the target's certificate.",
)
@click.option(
    "--once",
    is_flag=True,
    help="One round, a table, and exit: 0 all ok, 1 some not ok, 3 unreachable.",
)
@handles_errors
def probe_cmd(
    target: str | None,
    model: str | None,
    api: str,
    classes: str,
    every: str,
    budget: str,
    max_in_flight: str,
    max_tokens: str,
    timeout: str,
    tokenizer: Path | None,
    listen: str,
    target_label: str | None,
    headers: tuple[str, ...],
    bearer_token_file: Path | None,
    ca_file: str | None,
    once: bool,
) -> None:
    """A synthetic streaming client: what users see, per prompt length, on /metrics.

    Sends small streamed requests on a schedule and exports llm_probe_ttft_seconds,
    llm_probe_itl_seconds, llm_probe_e2e_seconds and llm_probe_requests_total (by outcome:
    ok, http_error, timeout, truncated, connection_error). Run it outside the cluster, through
    the gateway users use: its TTFT against the server's shows time lost outside the engine.

    \b
    Examples:
      servediag probe --target http://127.0.0.1:8000 --once
      servediag probe --target https://llm.example.com --bearer-token-file token \\
          --every 1m --budget 6/min --listen 0.0.0.0:9464
    """
    import threading
    from datetime import datetime, timezone

    from diagnoser.probe import runner
    from diagnoser.probe.prompts import load_counter, parse_classes
    from diagnoser.probe.stream import Endpoint, ProbeError

    if not target:
        fail("give --target URL, the OpenAI-compatible API to probe")
    sizes = tuple(parse_classes(classes))
    every_s, timeout_s = _seconds("--every", every), _seconds("--timeout", timeout)
    per_min = budget.strip().removesuffix("/min").removesuffix("/m")
    budget_n = _positive_int("--budget", per_min, 100_000)
    in_flight = _positive_int("--max-in-flight", max_in_flight, 64)
    out_tokens = _positive_int("--max-tokens", max_tokens, 4096)
    host, port = parse_listen_or_fail(listen)
    ep = Endpoint(target, _header_pairs(headers), bearer_token_file, ca_file)
    counter, warning = load_counter(tokenizer)
    if warning:
        click.echo(f"servediag: warning: {warning}", err=True)
    try:
        name = model or runner.discover_model(ep, timeout_s)
    except ProbeError as exc:
        fail(str(exc), EXIT_SOURCE)
    cfg = runner.ProbeConfig(
        ep,
        name,
        api,
        sizes,
        every_s,
        budget_n,
        in_flight,
        out_tokens,
        timeout_s,
        target_label or "",
        counter,
    )
    prober = runner.Prober(cfg)
    click.echo(
        f'probing {name} at {ep.shown} ({api}, target="{cfg.target_label}"); prompt tokens: '
        f"{counter.description}",
        err=True,
    )
    if cfg.needed_per_minute() > budget_n + 1e-9:
        click.echo(
            f"servediag: warning: {len(sizes)} classes every {every} need "
            f"{cfg.needed_per_minute():g} requests a minute; --budget {budget_n}/min skips "
            "the rest (llm_probe_skipped_total)",
            err=True,
        )
    if once:
        attempts = prober.round()
        click.echo(runner.table(attempts))
        results = [a.result for a in attempts if a.result is not None]
        if results and all(r.outcome == "connection_error" for r in results):
            sys.exit(EXIT_SOURCE)
        sys.exit(0 if all(a.result and a.result.outcome == "ok" for a in attempts) else 1)
    try:
        server = runner.serve_metrics(prober, host, port)
    except OSError as exc:
        fail(f"cannot listen on {listen}: {exc.strerror or exc}")
    click.echo(f"metrics on http://{host}:{port}/metrics; a round every {every}", err=True)
    stop = threading.Event()

    def log(line: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        click.echo(f"{stamp} {line}", err=True)

    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        prober.run(stop, log)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()


def parse_listen_or_fail(value: str) -> tuple[str, int]:
    try:
        return parse_listen(value)
    except click.BadParameter as exc:
        fail(f"--listen: {exc.message}")


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


@dataclass(frozen=True)
class SourceOptions:
    """Where the Prometheus-compatible API is and how to reach it, as the options say."""

    url: str | None
    bearer_token_file: Path | None
    basic_auth: str | None
    headers: tuple[str, ...]
    ca_file: str | None
    insecure: bool
    timeout: float

    def connect(self) -> PrometheusSource:
        """The source, or exit 2 on an unreadable token file or a malformed option."""
        import os

        from diagnoser.source import Auth, PrometheusSource

        token = os.environ.get("PROMETHEUS_BEARER_TOKEN")
        if self.bearer_token_file is not None:
            try:
                token = self.bearer_token_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                fail(f"cannot read --bearer-token-file {self.bearer_token_file}: {exc.strerror}")
        basic = None
        if self.basic_auth:
            user, sep, password = self.basic_auth.partition(":")
            if not sep:
                fail("--basic-auth must be USER:PASS")
            basic = (user, password)
        extra = {}
        for h in self.headers:
            name, sep, value = h.partition("=")
            if not sep or not name.strip():
                fail(f"--header {name.strip() or h!r} must be NAME=VALUE")
            extra[name.strip()] = value.strip()
        auth = Auth(
            bearer_token=token,
            basic=basic,
            headers=extra,
            ca_file=self.ca_file,
            insecure=self.insecure,
        )
        return PrometheusSource(self.url or "", auth, timeout=self.timeout)


_SOURCE_PARAMS = (
    "prometheus_url",
    "bearer_token_file",
    "basic_auth",
    "headers",
    "ca_file",
    "insecure",
    "timeout",
)


def source_options(default_url: str | None, url_help: str) -> Callable[[F], F]:
    """``--prometheus-url`` with its auth, TLS and timeout options, handed to the command
    as one ``source: SourceOptions`` argument (shared by every command that queries)."""
    options = [
        click.option(
            "--prometheus-url",
            envvar="PROMETHEUS_URL",
            default=default_url,
            show_default=default_url is not None,
            help=url_help,
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
    ]

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = [kwargs.pop(name) for name in _SOURCE_PARAMS]
            return fn(*args, source=SourceOptions(*values), **kwargs)

        decorated: Any = wrapper
        for option in reversed(options):
            decorated = option(decorated)
        return decorated  # type: ignore[no-any-return]

    return decorate


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
@source_options("http://localhost:9090", "Prometheus-compatible API (also PROMETHEUS_URL).")
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
@catalog_option
@config_option
@handles_errors
def diagnose_cmd(
    since: str,
    until: str | None,
    baseline: str,
    source: SourceOptions,
    model: str | None,
    instance: str | None,
    job: str | None,
    match: tuple[str, ...],
    fmt: str,
    output: Path | None,
    explain: str | None,
    catalog_dirs: tuple[Path, ...],
    config_path: Path | None,
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
    prometheus = source.connect()
    cat = _catalog(catalog_dirs)
    if explain is not None:
        _playbook(cat, explain)
    cfg = load_config(config_path)
    try:
        result = diagnose(
            prometheus,
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
@source_options("http://localhost:9090", "Prometheus-compatible API (also PROMETHEUS_URL).")
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
    source: SourceOptions,
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
        source.connect(),
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


# --- kv-budget ------------------------------------------------------------------------------


@main.command("kv-budget")
@click.option(
    "--model",
    "model_ref",
    metavar="PRESET|CONFIG",
    help=f"A preset ({', '.join(MODEL_ALIASES)}) or a Hugging Face config.json "
    "(or the directory holding it).",
)
@click.option("--gpu", "gpu_name", default="H100-80GB", show_default=True, help="GPU preset.")
@click.option(
    "--gpu-memory-gb",
    type=click.FloatRange(min=0, min_open=True),
    help="GPU memory in GB (10^9 bytes), instead of the preset's.",
)
@click.option(
    "--gpu-memory-utilization",
    type=click.FloatRange(min=0, max=1, min_open=True),
    default=0.9,
    show_default=True,
    help="vLLM's share of the GPU's memory.",
)
@click.option(
    "--weights-gb",
    type=click.FloatRange(min=0),
    help="The weights' size in GB (default: the preset's, or estimated from config.json).",
)
@click.option(
    "--overhead-gb",
    type=click.FloatRange(min=0),
    default=2.14,
    show_default=True,
    help="Runtime overhead per GPU in GB (activations, CUDA graphs).",
)
@click.option(
    "--max-model-len",
    type=click.IntRange(min=1),
    help="Longest sequence (default: the model's max_position_embeddings).",
)
@click.option(
    "--context",
    type=click.IntRange(min=1),
    help="Tokens each user holds, prompt and answer (default: --max-model-len).",
)
@click.option("--users", type=click.IntRange(min=1), help="Concurrent users to check against.")
@click.option(
    "--tensor-parallel-size",
    "--tp",
    "tensor_parallel",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="GPUs the model is split across.",
)
@click.option(
    "--kv-cache-dtype",
    type=click.Choice(list(KV_CACHE_DTYPES)),
    default="auto",
    show_default=True,
    help="As vLLM's flag: auto is the model's dtype; fp8 halves the bytes.",
)
@click.option(
    "--block-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    help="Tokens per KV-cache block, as vLLM's flag.",
)
@source_options(
    None, "Also read each vLLM engine's live KV capacity from here (also PROMETHEUS_URL)."
)
@click.option(
    "--at",
    "at",
    default=None,
    metavar="TIME",
    help="With --prometheus-url: when to read it, RFC 3339 or Unix seconds (default: now).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@handles_errors
def kv_budget_cmd(
    model_ref: str | None,
    gpu_name: str,
    gpu_memory_gb: float | None,
    gpu_memory_utilization: float,
    weights_gb: float | None,
    overhead_gb: float,
    max_model_len: int | None,
    context: int | None,
    users: int | None,
    tensor_parallel: int,
    kv_cache_dtype: str,
    block_size: int,
    source: SourceOptions,
    at: str | None,
    fmt: str,
) -> None:
    """Plan the KV cache: bytes per token, sequences and users that fit, and what if.

    From a preset or a model's config.json (MLA models such as DeepSeek-V3 included):
    KV bytes per token, the free memory after weights and overhead, how many full-length
    sequences and users fit, and what FP8 KV or 2x/4x tensor parallelism would change. With
    --prometheus-url, also each running engine's capacity from vllm:cache_config_info.
    Exit status: 0 done, 2 bad input (one line naming the config field), 3 the metric
    source cannot be reached or answers garbage.

    \b
    Examples:
      servediag kv-budget --model llama-3.1-8b --context 8192 --users 64 --weights-gb 16
      servediag kv-budget --model ./DeepSeek-V3/config.json --gpu H200 --tp 8
      servediag kv-budget --model llama-3.1-8b --max-model-len 131072 \\
          --prometheus-url http://prometheus:9090 --format json
    """
    import time

    from diagnoser import kvbudget, kvbudget_report
    from diagnoser.source import SourceError

    if model_ref is None and source.url is None:
        fail("give --model PRESET|CONFIG, or --prometheus-url for the live capacity")
    if at is not None and source.url is None:
        fail("--at reads Prometheus: give --prometheus-url too")
    budget = None
    if model_ref is not None:
        budget = kvbudget.make_budget(
            model_ref,
            gpu_name=gpu_name,
            gpu_memory_gb=gpu_memory_gb,
            gpu_memory_utilization=gpu_memory_utilization,
            weights_gb=weights_gb,
            overhead_gb=overhead_gb,
            max_model_len=max_model_len,
            context=context,
            users=users,
            tensor_parallel=tensor_parallel,
            kv_cache_dtype=kv_cache_dtype,
            block_size=block_size,
        )
    live = None
    if source.url is not None:
        when = parse_time(at) if at else time.time()
        longest_live = budget.max_model_len if budget else max_model_len
        try:
            live = kvbudget.read_live(
                source.connect(), when, longest_live, budget.context if budget else context
            )
        except SourceError as exc:
            fail(str(exc), EXIT_SOURCE)
    doc = kvbudget_report.to_json(budget, live)
    if fmt == "json":
        click.echo(json.dumps(doc, indent=2))
    else:
        click.echo(kvbudget_report.text(doc), nl=False)
