"""``servediag watch``: the diagnosis run every --every over the last --since, served on
``/metrics`` for alert rules and dashboards."""

from __future__ import annotations

import contextlib
import logging
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
    source_options,
)
from diagnoser.cli.params import Duration
from diagnoser.cli.shared import (
    history_options,
    listen_option,
    scope,
    scope_options,
    since_option,
)
from diagnoser.cli.webhook import receiver, receiver_options

DEFAULT_LISTEN = "127.0.0.1:9466"  # the probe's /metrics is 9464


@click.command("watch")
@since_option("Each cycle diagnoses this much time up to the cycle's start (a sliding window).")
@click.option(
    "--every",
    type=Duration(),
    default="1m",
    show_default=True,
    metavar="DURATION",
    help="Time between two cycles (at least 10s).",
)
@click.option(
    "--clear-after",
    type=Duration(zero=True),
    default="5m",
    show_default=True,
    metavar="DURATION",
    help="A served finding leaves /metrics once it has been absent from the cycles this long "
    "(it enters once it holds on 2 consecutive cycles).",
)
@listen_option(
    DEFAULT_LISTEN, "Serve /metrics and /healthz here (0.0.0.0:9466 for a Prometheus elsewhere)."
)
@click.option(
    "--max-connections",
    type=click.IntRange(1, 1024),
    default=16,
    show_default=True,
    help="Connections served at once; the next wait in the listen backlog.",
)
@click.option(
    "--alerts",
    is_flag=True,
    help="Also take Alertmanager's notifications on POST /alerts, as servediag webhook does: "
    "each firing playbook alert's model is answered from the last cycle when that cycle is "
    "good, at most two --every old and saw the alert begin, else diagnosed anew; one JSON "
    "line on stdout per alert.",
)
@receiver_options
@history_options
@source_options(
    "http://localhost:9090",
    "Prometheus-compatible API (also PROMETHEUS_URL). --timeout is each cycle's deadline "
    "(default: the smaller of 60 s and --every).",
)
@scope_options
@catalog_option
@config_option
@handles_errors
def watch_cmd(
    since: float,
    every: float,
    clear_after: float,
    listen: tuple[str, int],
    max_connections: int,
    alerts: bool,
    slack_url: str | None,
    dedupe_window: float,
    queue_size: int,
    drain_timeout: float,
    workers: int,
    lookback: float,
    baseline: float | None,
    source: SourceOptions,
    model: str | None,
    instance: str | None,
    job: str | None,
    match: tuple[str, ...],
    catalog_dirs: tuple[Path, ...],
    config_path: Path | None,
) -> None:
    """Diagnose continuously and serve the findings as Prometheus metrics.

    Every --every, runs the diagnosis diagnose runs over the last --since (the same scope
    options) and serves what it found on GET /metrics: each finding with its confidence,
    onset and rank (servediag_finding...), each model's health verdict, the undecided
    playbooks, and how the cycles go (see docs/commands/watch.md for the series). A finding
    is served once it holds on 2 consecutive cycles, until it has been absent for
    --clear-after. Recording rules are read wherever the site deploys them and they cover
    the window. When Prometheus is down or answers garbage, the error is counted, the last
    good cycle's findings stay served with servediag_stale 1, and the service goes on.
    GET /healthz answers 200 while serving. With --alerts it is also the alerts' webhook
    (POST /alerts; the options of servediag webhook). Stops on SIGTERM or Ctrl-C, exit
    status 0 (a cycle in flight is abandoned; with --alerts, after diagnosing the alerts
    it accepted, --drain-timeout, and 128 + the signal's number when a second one ends
    that); 2 for a bad argument.

    \b
    Examples:
      servediag watch --prometheus-url http://prometheus:9090 --listen 0.0.0.0:9466
      servediag watch --since 30m --every 30s --model llama-3.1-8b
      servediag watch --listen 0.0.0.0:9466 --alerts --slack-url https://hooks.slack.com/...
    """
    from click.core import ParameterSource

    from diagnoser.watch.http import listen as bind
    from diagnoser.watch.http import serve
    from diagnoser.watch.loop import DEFAULT_TIMEOUT, MIN_EVERY, Watch
    from diagnoser.webhook.http import SafeFormatter
    from diagnoser.webhook.stop import SignalStop

    if every < MIN_EVERY:
        fail(f"--every {every:g}s is too short: at least {MIN_EVERY:g}s")
    ctx = click.get_current_context()
    given = ctx.get_parameter_source("timeout") not in (None, ParameterSource.DEFAULT)
    timeout = source.timeout if given else min(DEFAULT_TIMEOUT, every)
    within = scope(model, instance, job, match)
    prometheus = source.connect()
    site = load_site(config_path, catalog_dirs)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    watch = Watch(
        prometheus,
        site,
        since,
        every=every,
        clear_after=clear_after,
        timeout=timeout,
        scope=within,
        lookback=lookback,
        baseline=baseline,
        version=_version(),
    )
    hook = None
    if alerts:  # the alerts' diagnoses read the store as the cycles do, but never their reuse
        hook = receiver(
            prometheus,
            site,
            since=since,
            baseline_offset=baseline,
            slack_url=slack_url,
            dedupe_window=dedupe_window,
            lookback=lookback,
            workers=workers,
            recorded_rules=True,
            queue_size=queue_size,
            recent=watch.recent,
        )
    host, port = listen
    try:
        server = bind(watch, host, port, max_connections, hook)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    stop = SignalStop()
    stop.install()
    abandoned = serve(watch, server, stop, hook, drain_timeout)
    logging.getLogger("servediag.watch").info("stopped %s", stop.why())
    forcing = stop.forcing() if hook is not None else None
    code = 0 if forcing is None else 128 + forcing
    if abandoned:
        # The cycle (or an alert's diagnosis) in flight still waits on its queries, in
        # threads Python joins at exit: up to --timeout later, past a container's grace
        # period. Nothing of it is kept; the alerts left were printed as undone.
        logging.shutdown()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("servediag")
    except PackageNotFoundError:
        return "unknown"
