"""Formatting shared by every renderer: times, scopes, wrapped paragraphs, evidence lines."""

from __future__ import annotations

import textwrap
import time

from diagnoser.diagnose.match import Match
from diagnoser.diagnose.model import Diagnosis

WIDTH = 96


def clock(t: float | None) -> str:
    """``14:32 UTC`` (or ``?``)."""
    return time.strftime("%H:%M UTC", time.gmtime(t)) if t is not None else "?"


def day(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def scope_text(s: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in s.items())


def wrap(text: str, indent: str, width: int = WIDTH) -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent
    )


def evidence_lines(d: Diagnosis, m: Match, most: int) -> list[str]:
    """The conditions that held and point to the cause, in words, at most ``most``."""
    return [d.evidence_text(r) for r in m.held()[:most]]
