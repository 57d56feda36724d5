"""What the lab's entry points share for their arguments: a bad one is one line on stderr,
``PROG: error: ...`` naming it, and exit status 2, before any work starts (no server
installed, no benchmark begun). Names are checked against the known lists, numbers against a
``Limit`` (``diagnoser.plumbing.limits``), durations as the command line reads them, and a
file to read must exist and be a regular file (a FIFO would block the read for ever)."""

from __future__ import annotations

import argparse
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import click

from diagnoser.plumbing.durations import duration
from diagnoser.plumbing.limits import Limit
from diagnoser.plumbing.printable import printable

EXIT_USAGE = 2


def refuse(prog: str, message: str) -> NoReturn:
    """One line on stderr and exit status 2."""
    print(f"{prog}: error: {printable(message)}", file=sys.stderr)
    raise SystemExit(EXIT_USAGE)


class Parser(argparse.ArgumentParser):
    """argparse with every usage error one line (no usage block above it), exit status 2."""

    def error(self, message: str) -> NoReturn:
        refuse(self.prog, message)


def one_of(prog: str, what: str, names: Iterable[str], known: Sequence[str]) -> None:
    """Each of ``names`` is one of ``known``, else one line naming the first that is not."""
    for name in names:
        if name not in known:
            refuse(prog, f"no {what} {name!r} (known: {', '.join(known)})")


def number(limit: Limit) -> Callable[[str], float]:
    """An argparse ``type``: a number within ``limit``."""

    def convert(text: str) -> float:
        try:
            return limit.convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = "number"
    return convert


def seconds(zero: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a duration (``90s``, ``15m``, ``2h`` or seconds), longer than
    zero unless ``zero``."""

    def convert(text: str) -> float:
        try:
            return duration(text, zero)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = "duration"
    return convert


class ClickNumber(click.ParamType):  # type: ignore[type-arg]
    """A click type: a number within a ``Limit`` (NaN and infinities refused, as argparse's
    ``number``), for the lab's click commands."""

    name = "number"

    def __init__(self, limit: Limit) -> None:
        self.limit = limit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self.limit.convert(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def regular_file(text: str) -> Path:
    """An argparse ``type``: a file that exists and is a regular file."""
    path = Path(text)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{text}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        raise argparse.ArgumentTypeError(f"{text}: not a regular file")
    return path


def click_main(command: click.Command, prog: str, argv: Sequence[str] | None = None) -> Any:
    """Run a click ``command`` with its usage errors one line, exit status 2."""
    try:
        rv = command.main(list(argv) if argv is not None else None, prog, standalone_mode=False)
    except click.ClickException as exc:
        refuse(prog, " ".join(exc.format_message().split()))
    except click.Abort:
        print(f"{prog}: interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    if isinstance(rv, int):
        raise SystemExit(rv)
    return rv
