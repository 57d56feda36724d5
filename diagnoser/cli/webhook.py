"""``servediag webhook``: Alertmanager notifications in, diagnosed alerts out."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from diagnoser.cli.options import (
    F,
    SourceOptions,
    catalog_option,
    config_option,
    fail,
    handles_errors,
    load_site,
    source_options,
    with_options,
)
from diagnoser.cli.params import DURATION, Duration
from diagnoser.cli.shared import listen_option, reading_options, since_option

if TYPE_CHECKING:
    from diagnoser.plumbing.source import MetricSource
    from diagnoser.site import Site
    from diagnoser.webhook.receiver import Recent, Webhook


# How a receiver of Alertmanager's notifications works, as webhook and watch --alerts take it.
_RECEIVER = [
    click.option(
        "--slack-url",
        envvar="SERVEDIAG_SLACK_WEBHOOK_URL",
        default=None,
        metavar="URL",
        help="Also post each diagnosis to this Slack-compatible incoming webhook "
        "(also SERVEDIAG_SLACK_WEBHOOK_URL).",
    ),
    click.option(
        "--dedupe-window",
        type=Duration(zero=True),
        default="1h",
        show_default=True,
        metavar="DURATION",
        help="Skip an alert (same name, playbook and model) diagnosed less than this ago.",
    ),
    click.option(
        "--queue-size",
        type=click.IntRange(1, 100_000),
        default=100,
        show_default=True,
        help="Alerts that may wait for a diagnosis; a notification that would go beyond gets "
        "503 (Alertmanager retries), one with more new alerts than this gets 413 (set "
        "max_alerts in Alertmanager's webhook_config).",
    ),
    click.option(
        "--drain-timeout",
        type=Duration(zero=True),
        default="8s",
        show_default=True,
        metavar="DURATION",
        help="On SIGTERM, Ctrl-C or any signal that would end it: time to diagnose the alerts "
        "already accepted (new ones get 503); those left are printed as JSON lines with outcome "
        "undone. The default fits Docker's 10 s before SIGKILL; a second signal ends it at once.",
    ),
    click.option(
        "--workers",
        type=click.IntRange(1, 32),
        default=2,
        show_default=True,
        help="Diagnoses run at once (one per alert group at a time).",
    ),
]


def receiver_options(fn: F) -> F:
    """``--slack-url``, ``--dedupe-window``, ``--queue-size``, ``--drain-timeout`` and
    ``--workers``: how alerts are taken, diagnosed and sent on (``receiver`` makes the
    receiver of them)."""
    return with_options(fn, _RECEIVER)  # type: ignore[no-any-return]


@click.command("webhook")
@listen_option(
    None, "Address to serve on; point Alertmanager's webhook_configs at http://HOST:PORT/alerts."
)
@since_option("How far back each diagnosis looks, up to the moment the alert arrives.")
@reading_options
@click.option(
    "--step",
    type=DURATION,
    default=None,
    metavar="DURATION",
    help="Query resolution, rates over four steps (default: planned from --since, at least "
    "15 s with 5 m rates). Only for fast scrapes and windows of minutes.",
)
@receiver_options
@source_options("http://localhost:9090", "Prometheus-compatible API (also PROMETHEUS_URL).")
@catalog_option
@config_option
@handles_errors
def webhook_cmd(
    listen: tuple[str, int],
    since: float,
    lookback: float,
    baseline: float | None,
    recorded_rules: bool,
    step: float | None,
    slack_url: str | None,
    dedupe_window: float,
    queue_size: int,
    drain_timeout: float,
    workers: int,
    catalog_dirs: tuple[Path, ...],
    config_path: Path | None,
    source: SourceOptions,
) -> None:
    """Receive Alertmanager notifications and diagnose each firing playbook alert.

    For every firing alert with a `playbook` label, runs the diagnosis of that alert's model
    over the last --since and prints one JSON line on stdout: the alert, its playbook id and
    runbook_url, the top finding and the whole diagnosis. Logs go to stderr. A bad payload is
    answered 400, a full queue 503; a failing diagnosis is logged, printed with its error,
    and the receiver goes on. GET /healthz and GET /metrics are served too. Stops on Ctrl-C,
    SIGTERM or any signal that would end it, after diagnosing what it accepted
    (--drain-timeout), exit status 0; a second signal ends the drain at once, the alerts
    left printed as undone, exit status 128 + that signal's number (130 for Ctrl-C).

    \b
    Examples:
      servediag webhook --listen 0.0.0.0:9095 --prometheus-url http://prometheus:9090
      servediag webhook --listen 127.0.0.1:9095 --slack-url https://hooks.slack.com/services/...
    """
    from diagnoser.diagnosis import MIN_STEP
    from diagnoser.plumbing.source import MAX_POINTS
    from diagnoser.webhook.http import SafeFormatter, serve
    from diagnoser.webhook.stop import SignalStop

    host, port = listen
    since_s, step_s, dedupe_s = since, step, dedupe_window
    offset = baseline
    if step_s is not None and 2 * since_s / step_s > MAX_POINTS:
        fail(f"--step {step_s:g}s is too fine for --since {since_s:g}s: use at least {MIN_STEP:g}s")
    site = load_site(config_path, catalog_dirs)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(asctime)s %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])

    hook = receiver(
        source.connect(),
        site,
        since=since_s,
        baseline_offset=offset,
        step=step_s,
        slack_url=slack_url,
        dedupe_window=dedupe_s,
        lookback=lookback,
        workers=workers,
        recorded_rules=recorded_rules,
        queue_size=queue_size,
    )
    stop = SignalStop()
    stop.install()
    try:
        serve(hook, host, port, stop=stop, drain=drain_timeout)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    forcing = stop.forcing()
    code = 0 if forcing is None else 128 + forcing
    if hook.dispatcher.running:
        # Diagnoses the drain gave up on (their alerts were printed as undone) still wait on
        # their queries, in executor threads that Python joins at exit: up to --timeout
        # later, past a container's grace period. Their records are written: leave now.
        logging.shutdown()
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os._exit(code)
    if code:
        sys.exit(code)


def receiver(
    source: MetricSource,
    site: Site,
    *,
    slack_url: str | None,
    queue_size: int,
    recent: Recent | None = None,
    **settings: Any,
) -> Webhook:
    """The receiver the options describe: each record a JSON line on stdout (one at a time,
    never split), sent on to ``slack_url`` when given (exit 2 when it is no http(s) URL);
    ``settings`` are ``Webhook``'s."""
    from diagnoser.webhook.notify import SlackForwarder
    from diagnoser.webhook.receiver import Webhook

    if slack_url is not None:
        _check_url(slack_url, "--slack-url")
    lock = threading.Lock()
    write = _stdout_writer()

    def emit(record: dict[str, Any]) -> None:
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with lock:  # workers emit concurrently; a line is never split
            write(line.encode())

    return Webhook(
        source,
        site,
        emit,
        forwarder=SlackForwarder(slack_url, site) if slack_url else None,
        max_pending=queue_size,
        recent=recent,
        **settings,
    )


def _stdout_writer() -> Callable[[bytes], None]:
    """How a record line is written: straight to stdout's file descriptor, so no buffer is
    left for Python to flush (and fail on) at exit when stdout broke; when it fails (closed,
    its reader gone, a full disk), the receiver logs the record instead. A stdout closed
    before Python started is never written: descriptor 1 may be a socket by now."""
    stream = sys.stdout
    if stream is None:

        def closed(data: bytes) -> None:
            raise OSError(errno.EBADF, "stdout is closed")

        logging.getLogger("servediag.webhook").warning(
            "stdout is closed: each record is logged instead"
        )
        return closed
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # a stdout captured in memory

        def captured(data: bytes) -> None:
            stream.write(data.decode())
            stream.flush()

        return captured

    def direct(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    return direct


def _check_url(url: str, option: str) -> None:
    """An http(s) URL with a host and a valid port, or exit 2 (the URL is not shown: a chat
    webhook's URL is its secret)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port out of range)
    except ValueError as exc:
        fail(f"{option} is not a valid URL: {exc}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        fail(f"{option} must be an http:// or https:// URL")
