"""Durations and points in time as users write them: ``90s``, ``15m``, ``2h``, ``1d``;
RFC 3339 or Unix seconds. One parser for every command, scenario and config file."""

from __future__ import annotations

import math
import re
import time
from datetime import datetime

_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# Far enough for any retention, near enough that a timestamp stays a finite datetime.
LONGEST = 10 * 365 * 86400.0
LATEST = 253402300799.0  # 9999-12-31T23:59:59Z


def parse_duration(value: object) -> float:
    """``90s``, ``15m``, ``2h``, ``1d``, ``1h30m`` (or a number of seconds) -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a duration like 30s, 15m or 2h")
        return float(value)
    if isinstance(value, str):
        total, rest = 0.0, value.strip()
        while rest:
            m = _PART.match(rest)
            if not m:
                break
            total += float(m.group(1)) * _UNITS[m.group(2)]
            rest = rest[m.end() :]
        if (not rest and 0 < total < math.inf) or value.strip() in ("0s", "0m", "0h"):
            return total
    raise ValueError(f"{value!r} is not a duration like 30s, 15m or 2h")


def parse_seconds(text: str) -> float:
    """A duration that may also be a plain number of seconds (``30`` or ``30s``)."""
    stripped = text.strip()
    try:
        value = float(stripped)
    except ValueError:
        return parse_duration(stripped)
    if not math.isfinite(value):
        raise ValueError(f"{text!r} is not a duration like 30s, 15m or 2h")
    return value


def duration(value: object, zero: bool = False, longest: float = LONGEST) -> float:
    """A length of time as an option or an argument gives it (``"90m"``, ``"30"`` or a number
    of seconds) -> seconds: longer than zero (or zero, when ``zero``) and no longer than
    ``longest``; else ``ValueError`` saying why."""
    from diagnoser.plumbing.limits import shown

    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{shown(value)} is not a duration like 30s, 15m or 2h")
    if isinstance(value, int) and abs(value) > longest:  # perhaps beyond any float
        seconds = math.inf if value > 0 else -math.inf
    else:
        try:
            seconds = parse_seconds(value) if isinstance(value, str) else parse_duration(value)
        except ValueError:
            raise ValueError(f"{shown(value)} is not a duration like 30s, 15m or 2h") from None
    if seconds < 0 and zero:
        raise ValueError(f"{shown(value)} must not be negative")
    if seconds < 0 or (seconds == 0 and not zero):
        raise ValueError(f"{shown(value)} must be longer than zero")
    if seconds > longest:
        raise ValueError(f"{shown(value)} is longer than {longest / 86400:g} days")
    return seconds


def parse_time(value: str) -> float:
    """RFC 3339 (``2026-11-29T02:00:00Z``) or Unix seconds -> Unix seconds."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise ValueError(f"{value!r} is neither RFC 3339 nor a Unix timestamp") from None
    if not math.isfinite(seconds) or not 0 <= seconds <= LATEST:
        raise ValueError(f"{value!r} is not a time between 1970 and 9999")
    return seconds


def format_duration(seconds: float) -> str:
    """``9000`` -> ``2 h 30 min``; ``90`` -> ``1 min 30 s``."""
    s = round(abs(seconds))
    days, rem = divmod(s, 86400)
    hours, rem = divmod(rem, 3600)
    minutes, secs = divmod(rem, 60)
    parts = [
        f"{n} {unit}" for n, unit in ((days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")) if n
    ]
    if days or hours:
        parts = parts[:2]
    return " ".join(parts) or "0 s"


def iso(t: float | None) -> str | None:
    """Unix seconds as RFC 3339 in UTC (``2026-12-03T20:32:30Z``); None stays None."""
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
