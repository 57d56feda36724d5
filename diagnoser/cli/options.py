"""What the commands share: the exit statuses, one-line failures, the catalog and config
options that make the site, and the Prometheus source options."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from diagnoser.cli.params import HEADER, bounded
from diagnoser.plumbing.limits import MAX_RESPONSE_MB, TIMEOUT

if TYPE_CHECKING:
    from diagnoser.catalog import Catalog, Playbook
    from diagnoser.plumbing.source import PrometheusSource
    from diagnoser.site import Site

EXIT_FOUND = 1
EXIT_USAGE = 2
EXIT_SOURCE = 3

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str, code: int = EXIT_USAGE) -> NoReturn:
    """One line on stderr and exit ``code``. The message may quote what a server answered or
    what a file held: its control characters and line breaks are written as escapes, so it
    stays one line and cannot drive the terminal."""
    from diagnoser.plumbing.printable import printable

    click.echo(f"servediag: error: {printable(message)}", err=True)
    sys.exit(code)


def usage_line(exc: click.ClickException) -> str:
    """A click usage error as one line naming the option, e.g. ``--every: '0s' must be ...``."""
    if isinstance(exc, click.BadParameter) and not isinstance(exc, click.MissingParameter):
        hint = exc.param_hint
        if hint is None and exc.param is not None and exc.ctx is not None:
            hint = exc.param.get_error_hint(exc.ctx)
        if isinstance(hint, (list, tuple)):
            hint = " / ".join(hint)
        if hint:
            return f"{str(hint).replace(chr(39), '')}: {exc.message}"
    return " ".join(exc.format_message().split())


def main_one_line(
    command: click.Command, args: list[str] | None = None, prog_name: str | None = None
) -> None:
    """Run ``command`` as a program, with every usage error one line and exit status 2."""
    try:
        rv = click.Command.main(command, args, prog_name, standalone_mode=False)
    except click.ClickException as exc:
        fail(usage_line(exc), exc.exit_code)
    except click.Abort:
        click.echo("servediag: interrupted", err=True)
        sys.exit(130)
    if isinstance(rv, int):
        sys.exit(rv)


class OneLineGroup(click.Group):
    """The ``servediag`` group: subcommands' usage errors are one line, exit status 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.pop("standalone_mode", True) is False:
            return click.Group.main(self, *args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        args_list = args[0] if args else kwargs.pop("args", None)
        prog = args[1] if len(args) > 1 else kwargs.pop("prog_name", None)
        main_one_line(self, args_list, prog)


def handles_errors(fn: F) -> F:
    """Turn the library's expected errors into one line on stderr and an exit status."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from diagnoser.outputs.rules import PromtoolError
        from diagnoser.plumbing.errors import UserError
        from diagnoser.plumbing.source import SourceError

        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            fail(str(exc))
        except PromtoolError as exc:
            fail(f"promtool: {exc}", EXIT_FOUND)
        except SourceError as exc:
            fail(str(exc), EXIT_SOURCE)

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
    envvar="SERVEDIAG_CONFIG",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Site config: selectors, group labels, SLOs, traffic floor, alert overrides "
    "(also SERVEDIAG_CONFIG); see docs/site-config.md.",
)


def load_site(config_path: Path | None, catalog_dirs: tuple[Path, ...] = ()) -> Site:
    from diagnoser.site import Site

    return Site.load(config_path, catalog_dirs)


def load_catalog(dirs: tuple[Path, ...]) -> Catalog:
    from diagnoser.catalog import load_catalog

    return load_catalog(*dirs)


def check_alert_rules(site: Site, playbooks: Iterable[Playbook]) -> str | None:
    """Parse the playbooks' rendered alerts as Prometheus will: promtool when it is on PATH,
    otherwise the promql-parser library if installed, otherwise only their strings and
    brackets; without promtool the annotations go through ``outputs.gotemplate``.
    Each problem is one line naming the playbook's file and field, then exit 2. Returns what
    parsed the expressions, or None after a warning line that nothing could."""
    from diagnoser.outputs.promcheck import check_alerts

    checked = check_alerts(site, playbooks)
    for problem in checked.problems:
        click.echo(f"servediag: error: {problem}", err=True)
    if checked.problems:
        sys.exit(EXIT_USAGE)
    if checked.parser is None:
        click.echo(
            "servediag: warning: alert expressions checked for closed strings and brackets "
            "only: neither promtool (Debian package 'prometheus') nor the promql-parser "
            "library (pip install 'servediag[promql]') is installed",
            err=True,
        )
    return checked.parser


def playbook(catalog: Catalog, pid: str) -> Playbook:
    if pid not in catalog:
        import difflib

        near = difflib.get_close_matches(pid, catalog.ids(), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else "; see 'servediag catalog list'"
        fail(f"no playbook {pid!r}{hint}")
    return catalog[pid]


def read_token(path: Path, option: str) -> str:
    """A token file's first line; a file too big, binary or of several lines is refused."""
    from diagnoser.plumbing.errors import UserError
    from diagnoser.plumbing.source import read_token as read_one

    try:
        return read_one(path, option)
    except UserError as exc:
        fail(str(exc))


@dataclass(frozen=True)
class SourceOptions:
    """Where the Prometheus-compatible API is and how to reach it, as the options say."""

    url: str | None
    bearer_token_file: Path | None
    basic_auth: str | None
    headers: tuple[tuple[str, str], ...]
    ca_file: str | None
    insecure: bool
    timeout: float
    max_response_mb: int = 64

    def connect(self) -> PrometheusSource:
        """The source, or exit 2 on an unreadable token file or a malformed option."""
        from diagnoser.plumbing.source import Auth, PrometheusSource, bad_url

        url = (self.url or "").strip()
        why = bad_url(url)
        if why:
            fail(f"--prometheus-url {why}")
        if self.ca_file is not None:
            from diagnoser.plumbing.errors import UserError
            from diagnoser.plumbing.tls import check_ca_file

            try:
                check_ca_file(self.ca_file)
            except UserError as exc:
                fail(str(exc))
        token = os.environ.get("PROMETHEUS_BEARER_TOKEN")
        if self.bearer_token_file is not None:
            token = read_token(self.bearer_token_file, "--bearer-token-file")
        basic = None
        if self.basic_auth:
            user, sep, password = self.basic_auth.partition(":")
            if not sep:
                fail("--basic-auth must be USER:PASS")
            basic = (user, password)
        auth = Auth(
            bearer_token=token,
            basic=basic,
            headers=dict(self.headers),
            ca_file=self.ca_file,
            insecure=self.insecure,
        )
        return PrometheusSource(
            url, auth, timeout=self.timeout, max_bytes=self.max_response_mb * (1 << 20)
        )


_SOURCE_PARAMS = (
    "prometheus_url",
    "bearer_token_file",
    "basic_auth",
    "headers",
    "ca_file",
    "insecure",
    "timeout",
    "max_response_mb",
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
            type=HEADER,
            metavar="NAME:VALUE",
            help="Extra request header, e.g. X-Scope-OrgID:tenant (NAME=VALUE works too; "
            "repeatable).",
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
            type=bounded(TIMEOUT),
            default=60.0,
            show_default=True,
            help="Seconds for all the queries of one diagnosis (or kv-budget's reads): "
            "connections, answers, retries and Retry-After waits, and their analysis "
            "(what-if's fit and replays too, under diagnose --what-if as well).",
        ),
        click.option(
            "--max-response-mb",
            type=bounded(MAX_RESPONSE_MB),
            default=64,
            show_default=True,
            help="Largest answer taken from Prometheus, in MiB once decompressed; a larger "
            "one is a source failure (exit status 3). Also the memory the answers read at "
            "once share.",
        ),
    ]

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = [kwargs.pop(name) for name in _SOURCE_PARAMS]
            return fn(*args, source=SourceOptions(*values), **kwargs)

        return with_options(wrapper, options)  # type: ignore[no-any-return]

    return decorate


def with_options(fn: Callable[..., Any], options: list[Callable[[Any], Any]]) -> Any:
    """``fn`` with click ``options``, listed in the order ``--help`` shows them."""
    decorated: Any = fn
    for option in reversed(options):
        decorated = option(decorated)
    return decorated
