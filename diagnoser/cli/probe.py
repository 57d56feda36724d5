"""``servediag probe``: a synthetic streaming client, what users see, on its own /metrics."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from diagnoser.cli.options import EXIT_SOURCE, fail, handles_errors
from diagnoser.cli.params import HEADER, Duration
from diagnoser.cli.shared import listen_option
from diagnoser.plumbing.printable import inert, printable

DURATION = Duration(longest=86400)


def _positive_int(option: str, value: str, most: int) -> int:
    text = value.strip()
    if not text.isdigit() or not 1 <= int(text) <= most:
        fail(f"{option} {value!r} must be a whole number from 1 to {most}")
    return int(text)


@click.command("probe")
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
    type=DURATION,
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
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    metavar="N",
    help="At most N requests at once.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 4096),
    default=16,
    show_default=True,
    metavar="N",
    help="max_tokens of every request: keep it small.",
)
@click.option(
    "--timeout",
    type=Duration(longest=3600),
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
@listen_option(
    "127.0.0.1:9464",
    "Serve the probe's /metrics here (loopback by default: 0.0.0.0:9464 for a Prometheus on "
    "another host).",
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
    type=HEADER,
    metavar="NAME:VALUE",
    help="Extra request header (NAME=VALUE works too; repeatable).",
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
    every: float,
    budget: str,
    max_in_flight: int,
    max_tokens: int,
    timeout: float,
    tokenizer: Path | None,
    listen: tuple[str, int],
    target_label: str | None,
    headers: tuple[tuple[str, str], ...],
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
    every_s, timeout_s = every, timeout
    per_min = budget.strip().removesuffix("/min").removesuffix("/m")
    budget_n = _positive_int("--budget", per_min, 100_000)
    in_flight, out_tokens = max_in_flight, max_tokens
    host, port = listen
    ep = Endpoint(target, dict(headers), bearer_token_file, ca_file)
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
        f"probing {printable(name)} at {printable(ep.shown)} ({api}, "
        f'target="{printable(cfg.target_label)}"); prompt tokens: {counter.description}',
        err=True,
    )
    if cfg.needed_per_minute() > budget_n + 1e-9:
        click.echo(
            f"servediag: warning: {len(sizes)} classes every {every:g} s need "
            f"{cfg.needed_per_minute():g} requests a minute; --budget {budget_n}/min skips "
            "the rest (llm_probe_skipped_total)",
            err=True,
        )
    if once:
        attempts = prober.round()
        click.echo(inert(runner.table(attempts)))
        results = [a.result for a in attempts if a.result is not None]
        if results and all(r.outcome == "connection_error" for r in results):
            sys.exit(EXIT_SOURCE)
        sys.exit(0 if all(a.result and a.result.outcome == "ok" for a in attempts) else 1)
    try:
        server = runner.serve_metrics(prober, host, port)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    click.echo(f"metrics on http://{host}:{port}/metrics; a round every {every:g} s", err=True)
    stop = threading.Event()

    def log(line: str) -> None:
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        click.echo(f"{stamp} {printable(line)}", err=True)

    import signal

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        prober.run(stop, log)
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.server_close()
