"""Click parameter types shared by every command: durations, points in time, HOST:PORT and
request headers. Each turns bad input into click's one-line usage error (exit 2)."""

from __future__ import annotations

import math
import re
from typing import Any

import click

from diagnoser.plumbing.durations import LONGEST, duration, parse_time
from diagnoser.plumbing.limits import Limit


class Duration(click.ParamType):  # type: ignore[type-arg]
    """``30s``, ``15m``, ``2h``, ``1d`` or plain seconds; longer than zero unless ``zero``."""

    name = "duration"

    def __init__(self, zero: bool = False, longest: float = LONGEST) -> None:
        self.zero, self.longest = zero, longest

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            return duration(str(value), self.zero, self.longest)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class Timestamp(click.ParamType):  # type: ignore[type-arg]
    """RFC 3339 (``2026-11-29T02:00:00Z``) or Unix seconds."""

    name = "time"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, float):
            return value
        try:
            return parse_time(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class HostPort(click.ParamType):  # type: ignore[type-arg]
    """``HOST:PORT`` to listen on (``[::1]:9095`` for IPv6)."""

    name = "host:port"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value
        host, _, port = str(value).rpartition(":")
        host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            self.fail(f"{value!r} is not HOST:PORT", param, ctx)
        return host, int(port)


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class Header(click.ParamType):  # type: ignore[type-arg]
    """A request header, ``NAME:VALUE`` (curl's form) or ``NAME=VALUE``: split at whichever
    comes first, since neither can be part of a header name."""

    name = "NAME:VALUE"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        text = str(value)
        cut = min((i for i in (text.find(":"), text.find("=")) if i > 0), default=-1)
        name = text[:cut].strip() if cut > 0 else ""
        if not _HEADER_NAME.fullmatch(name):
            self.fail(f"{text.split(':')[0].split('=')[0]!r} must be NAME:VALUE", param, ctx)
        header_value = text[cut + 1 :].strip()
        if any(ch in header_value for ch in "\r\n\x00"):
            self.fail(f"the value of header {name!r} holds a line break", param, ctx)
        return name, header_value


class _Bounded(click.ParamType):  # type: ignore[type-arg]
    """A number within a ``Limit``: the one the Python API checks the same argument with.
    (Under click's range types, so ``--help`` shows the range.)"""

    limit: Limit

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        try:
            return self.limit.convert(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class _BoundedInt(_Bounded, click.IntRange):
    pass


class _BoundedFloat(_Bounded, click.FloatRange):
    pass


def bounded(limit: Limit) -> click.ParamType:  # type: ignore[type-arg]
    """The click type of an option that takes a number within ``limit``."""
    out: _Bounded
    if limit.integer:
        out = _BoundedInt(min=int(limit.low), max=int(limit.high), min_open=limit.low_open)
    else:
        out = _BoundedFloat(min=limit.low, max=limit.high, min_open=limit.low_open)
    out.limit = limit
    return out


class FiniteRange(click.FloatRange):
    """``click.FloatRange`` without NaN and infinities, which it lets through."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


DURATION = Duration()
TIMESTAMP = Timestamp()
HOST_PORT = HostPort()
HEADER = Header()
