"""Prometheus API answers read with memory in proportion to their points, and by a deadline.

``json.loads`` makes a list, an int and a str of every point of a range query's answer:
about ten times the answer's bytes (a 60 MB answer took 600 MB, eight at once 5 GB), and the
collector's passes over those millions of objects took seconds more after the last byte had
arrived, past any deadline. Here the answer is walked as the bytes it is. Its few small parts
(``status``, ``error``, ``warnings``, each series' labels) are decoded by ``json``; each
series' points are read into two arrays of float64, in pieces of at most ``PIECE`` bytes,
each sized before it is read (16 bytes a point) and drawn from the query's ``Lease`` (see
``plumbing.http.Budget``), with the deadline checked between pieces. Parts the API does not define
are skipped without being built.

A point is read as ``float()`` reads its two numbers, as before: the timestamp must be finite,
the value may be ``NaN`` or ``±Inf``; a boolean, a nested value or a number ``float()`` cannot
hold is not a point. (A finite time that is no date, before 1970 or after 9999, is a point
here; the source leaves its series out, with a warning: ``plumbing.source``.)
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnoser.plumbing.http import Lease, TimedOut

PIECE = 1 << 20  # the bytes of points read at once
MAX_DEPTH = 64  # deeper than any answer of the API nests (a series' labels are at depth 4)
MAX_WARNINGS = 100  # the warnings kept from one answer (the rest are skipped)
STEPS = 4096  # values walked between two looks at the clock
POINT_BYTES = 16  # a point's two float64
LABEL_BYTES = 160  # a label's two strings and its place in a dict, besides their characters

_WS = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"[^"\\\x00-\x1f]*(?:\\.[^"\\\x00-\x1f]*)*"')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_LITERAL = re.compile(rb"true|false|null")
_EMPTY = re.compile(rb"\[[ \t\n\r]*\]")
# The end of a series' points (the last point's "]" and the array's), and between two points.
_LAST = re.compile(rb"\][ \t\n\r]*\]")
_BETWEEN = re.compile(rb"\][ \t\n\r]*,")
# A piece of points as Prometheus writes them, [1700000000.5,"0.25"], seen by its structure:
# what is left once numbers (with NaN and Inf) and blanks are taken out.
_NUMERIC = b"0123456789.eE+-NaInf \t\n\r"
_STRUCTURE = bytes.maketrans(b'[]",', b"    ")
_POINT = b'[,""]'


class BadAnswer(ValueError):
    """Not the API's JSON (``series`` False), or series not in its format (True)."""

    def __init__(self, series: bool):
        super().__init__("series" if series else "answer")
        self.series = series


Point = tuple[dict[str, str], np.ndarray, np.ndarray]


@dataclass
class Answer:
    status: Any = None  # "success" or "error" in an answer of the API
    error: str | None = None
    error_type: str | None = None
    warnings: list[str] = field(default_factory=list)
    # Each series' labels, times and values; None when the answer has no result list.
    result: list[Point] | None = None


def decode(body: bytes | bytearray, at: float | None = None, lease: Lease | None = None) -> Answer:
    """The answer in ``body``; ``BadAnswer`` if it is not one, ``TimedOut`` past ``at``,
    ``TooLarge`` when its series take more than ``lease`` allows."""
    walk = _Walk(body, at, lease)
    answer = Answer()
    try:
        end = walk.object(walk.ws(0), lambda key, i: walk.top(answer, key, i), series=False)
        if walk.ws(end) != len(body):
            raise BadAnswer(series=False)
    except (IndexError, RecursionError):
        raise BadAnswer(series=False) from None
    return answer


class _Walk:
    def __init__(self, body: bytes | bytearray, at: float | None, lease: Lease | None):
        self.b, self.at, self.lease = body, at, lease
        self.steps = 0
        self.names: dict[str, str] = {}  # label names and short values, one object each
        # The times of the last series read: the series of a range query share their grid,
        # and one read-only array of it serves every series that has the same times.
        self.grid: np.ndarray | None = None

    # --- the clock and the budget --------------------------------------------------------

    def tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps >= STEPS:
            self.steps = 0
            if self.at is not None and time.monotonic() >= self.at:
                raise TimedOut("no time left to read the answer")

    def draw(self, n: int) -> None:
        if self.lease is not None:
            self.lease.draw(n)

    # --- JSON ----------------------------------------------------------------------------

    def ws(self, i: int) -> int:
        m = _WS.match(self.b, i)
        assert m is not None
        return m.end()

    def at_char(self, i: int, char: bytes, series: bool) -> int:
        """The index after ``char`` at ``i`` (after blanks), or ``BadAnswer``."""
        i = self.ws(i)
        if self.b[i : i + 1] != char:
            raise BadAnswer(series)
        return i + 1

    def string(self, i: int, series: bool) -> tuple[str, int]:
        i = self.ws(i)
        m = _STRING.match(self.b, i)
        if m is None:
            raise BadAnswer(series)
        raw = self.b[i + 1 : m.end() - 1]
        try:
            text = json.loads(self.b[i : m.end()]) if b"\\" in raw else raw.decode("utf-8")
        except ValueError:  # a bad escape, or not UTF-8
            raise BadAnswer(series) from None
        return text, m.end()

    def is_string(self, i: int) -> bool:
        i = self.ws(i)
        return self.b[i : i + 1] == b'"'

    def skip(self, i: int, depth: int, series: bool) -> int:
        """The index after the value at ``i``, which is checked but not built."""
        self.tick()
        i = self.ws(i)
        c = self.b[i : i + 1]
        if c == b'"':
            m = _STRING.match(self.b, i)
        elif c in (b"t", b"f", b"n"):
            m = _LITERAL.match(self.b, i)
        elif c == b"[" or c == b"{":
            if depth >= MAX_DEPTH:
                raise BadAnswer(series)
            close = b"]" if c == b"[" else b"}"
            i = self.ws(i + 1)
            if self.b[i : i + 1] == close:
                return i + 1
            while True:
                if c == b"{":
                    _, i = self.string(i, series)
                    i = self.at_char(i, b":", series)
                i = self.ws(self.skip(i, depth + 1, series))
                if self.b[i : i + 1] == close:
                    return i + 1
                i = self.at_char(i, b",", series)
        else:
            m = _NUMBER.match(self.b, i)
        if m is None:
            raise BadAnswer(series)
        return m.end()

    def object(self, i: int, member: Any, series: bool) -> int:
        """Walk the object at ``i``, handing each key and the index of its value to
        ``member``, which returns the index after the value."""
        i = self.at_char(i, b"{", series)
        if self.b[self.ws(i) : self.ws(i) + 1] == b"}":
            return self.ws(i) + 1
        while True:
            key, i = self.string(i, series)
            i = self.at_char(i, b":", series)
            i = self.ws(member(key, self.ws(i)))
            if self.b[i : i + 1] == b"}":
                return i + 1
            i = self.at_char(i, b",", series)

    def array(self, i: int, element: Any, series: bool) -> int:
        i = self.at_char(i, b"[", series)
        if self.b[self.ws(i) : self.ws(i) + 1] == b"]":
            return self.ws(i) + 1
        while True:
            i = self.ws(element(self.ws(i)))
            if self.b[i : i + 1] == b"]":
                return i + 1
            i = self.at_char(i, b",", series)

    # --- the API's answer ----------------------------------------------------------------

    def top(self, answer: Answer, key: str, i: int) -> int:
        if key in ("status", "error", "errorType") and self.is_string(i):
            text, end = self.string(i, series=False)
            if key == "status":
                answer.status = text
            elif key == "error":
                answer.error = text
            else:
                answer.error_type = text
            return end
        if key == "warnings" and self.b[i : i + 1] == b"[":
            answer.warnings = []

            def warning(j: int) -> int:
                if self.is_string(j) and len(answer.warnings) < MAX_WARNINGS:
                    text, end = self.string(j, series=False)
                    answer.warnings.append(text)
                    return end
                return self.skip(j, 2, series=False)

            return self.array(i, warning, series=False)
        if key == "data" and self.b[i : i + 1] == b"{":
            return self.object(i, lambda k, j: self.data(answer, k, j), series=False)
        return self.skip(i, 1, series=False)

    def data(self, answer: Answer, key: str, i: int) -> int:
        if key != "result" or self.b[i : i + 1] != b"[":
            return self.skip(i, 2, series=False)
        result: list[Point] = []

        def one(j: int) -> int:
            self.tick()
            labels, t, v, end = self.series(j)
            result.append((labels, t, v))
            return end

        end = self.array(i, one, series=True)
        answer.result = result
        return end

    def series(self, i: int) -> tuple[dict[str, str], np.ndarray, np.ndarray, int]:
        found: dict[str, Any] = {}

        def member(key: str, j: int) -> int:
            if key == "metric":
                found["metric"], end = self.labels(j)
                return end
            if key in ("values", "value"):
                found[key], end = self.points(j, one=key == "value")
                return end
            return self.skip(j, 4, series=True)

        end = self.object(i, member, series=True)
        points = found.get("values", found.get("value"))
        if "metric" not in found or points is None:
            raise BadAnswer(series=True)
        return found["metric"], points[0], points[1], end

    def labels(self, i: int) -> tuple[dict[str, str], int]:
        out: dict[str, str] = {}
        start = i

        def label(key: str, j: int) -> int:
            value, end = self.string(j, series=True)
            out[self.names.setdefault(key, key)] = (
                self.names.setdefault(value, value) if len(value) <= 64 else value
            )
            return end

        end = self.object(i, label, series=True)
        self.draw(2 * (end - start) + LABEL_BYTES * len(out))
        return out, end

    def points(self, i: int, one: bool) -> tuple[tuple[np.ndarray, np.ndarray], int]:
        """A series' points (``one``: its only point, ``"value"``), as (times, values)."""
        if one:
            end = self.skip(i, 4, series=True)
            t, v = self.piece(self.b[i:end])
            return (t, v), end
        if self.b[i : i + 1] != b"[":
            raise BadAnswer(series=True)
        empty = _EMPTY.match(self.b, i)
        if empty is not None:
            return (np.empty(0), np.empty(0)), empty.end()
        last = _LAST.search(self.b, i)
        if last is None:
            raise BadAnswer(series=True)
        stop = last.start() + 1  # after the last point
        times, values = [], []
        k = i + 1
        while k < stop:
            cut = _BETWEEN.search(self.b, k + PIECE, stop) if k + PIECE < stop else None
            end = cut.start() + 1 if cut is not None else stop
            t, v = self.piece(self.b[k:end])
            times.append(t)
            values.append(v)
            k = cut.end() if cut is not None else stop
            self.tick(STEPS)
        t = times[0] if len(times) == 1 else np.concatenate(times)
        v = values[0] if len(values) == 1 else np.concatenate(values)
        return (self.shared(t), v), last.end()

    def shared(self, t: np.ndarray) -> np.ndarray:
        """``t``, or the equal times of the series before it (a range query's series share a
        grid: one array for all of them halves what an answer's points hold)."""
        g = self.grid
        if g is not None and g.shape == t.shape and np.array_equal(g, t):
            return g
        t.flags.writeable = False
        self.grid = t
        return t

    def piece(self, text: bytes | bytearray) -> tuple[np.ndarray, np.ndarray]:
        """Points ``[t,"v"],[t,"v"]...`` (a piece of an array, without its brackets)."""
        n = text.count(b"[")
        self.draw(POINT_BYTES * n)
        tokens = text.translate(_STRUCTURE).split()
        if text.translate(None, _NUMERIC) == b",".join([_POINT] * n) and len(tokens) == 2 * n:
            try:
                t = np.fromiter(map(float, tokens[0::2]), np.float64, n)
                v = np.fromiter(map(float, tokens[1::2]), np.float64, n)
            except ValueError:  # NaNa, 1e: not numbers after all
                raise BadAnswer(series=True) from None
        else:  # another shape (a value as a number, blanks in a string): as JSON, and checked
            t, v = _points(text, n)
        if not np.isfinite(t).all():
            raise BadAnswer(series=True)
        return t, v


def _points(text: bytes | bytearray, n: int) -> tuple[np.ndarray, np.ndarray]:
    try:
        pts = json.loads(b"[" + bytes(text) + b"]")
    except (ValueError, RecursionError):
        raise BadAnswer(series=True) from None
    t, v = np.empty(len(pts)), np.empty(len(pts))
    for k, p in enumerate(pts):
        if (
            not isinstance(p, list)
            or len(p) != 2
            or any(isinstance(x, bool) or not isinstance(x, (int, float, str)) for x in p)
        ):
            raise BadAnswer(series=True)
        try:
            t[k], v[k] = float(p[0]), float(p[1])
        except (ValueError, OverflowError):
            raise BadAnswer(series=True) from None
    return t, v
