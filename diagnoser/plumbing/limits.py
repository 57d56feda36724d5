"""The range of a number that an option of the command line and an argument of the Python API
both take, decided once: the command line's click type wraps a ``Limit`` (``cli/params.py``)
and ``diagnoser.diagnose()``, ``kv_budget()`` and ``connect()`` check their arguments with the
same one, so a value one refuses the other refuses, in the same words."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Limit:
    """A number from ``low`` to ``high`` (``low`` itself left out when ``low_open``), whole
    when ``integer``. It may be given as a number or as the text of one (as the command line
    reads it); ``True`` and ``False`` are not numbers here."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False

    def convert(self, value: object) -> float:
        """``value`` as a number within the limit, else ``ValueError`` saying why (one line,
        without the argument's name: the caller puts its own in front)."""
        number = self._number(value)
        if isinstance(number, float) and not math.isfinite(number):
            raise ValueError(f"{shown(value)} is not a finite number")
        below = number <= self.low if self.low_open else number < self.low
        if below or number > self.high:
            raise ValueError(f"{shown(number)} is not in the range {self.range()}")
        return int(number) if self.integer else float(number)

    def check(self, value: object, name: str) -> float:
        """``convert``, with the argument's ``name`` at the front of the message."""
        try:
            return self.convert(value)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from None

    def range(self) -> str:
        """``1<=x<=600``, ``0<x<=1``: as click writes a range."""
        low = "<" if self.low_open else "<="
        return f"{shown(self.low)}{low}x<={shown(self.high)}"

    def _number(self, value: object) -> float:
        kind = "a whole number" if self.integer else "a number"
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"{shown(value)} is not {kind}")
        if isinstance(value, str):  # as the command line reads it: "16", "16.0", "1e3"
            text = value.strip()
            try:
                value = int(text) if self.integer and text.lstrip("+-").isdigit() else float(text)
            except ValueError:
                raise ValueError(f"{shown(value)} is not {kind}") from None
        if self.integer and isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{shown(value)} is not {kind}")
        return value


def shown(value: object) -> str:
    """A value as a message quotes it: a number as written (``1e+10``, ``16``), anything else
    by its ``repr``, cut to 60 characters."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) < 10**15:
            return str(value)
        digits = len(str(abs(value))) if abs(value) < 10**4000 else "over 4000"
        return f"{'a negative' if value < 0 else 'a'} number of {digits} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# The metric source's, as ``--timeout`` and ``--max-response-mb`` and ``connect()`` take them.
TIMEOUT = Limit(1, 600)  # seconds for all the queries of one diagnosis
MAX_RESPONSE_MB = Limit(1, 4096, integer=True)  # MiB of one answer, once decompressed
