"""Recorded Prometheus answers: a source that records every ``query_range`` it passes on,
and a source that replays them, so a diagnosis reproduces in milliseconds without Prometheus.

A recording is one gzipped JSON document: what was recorded (``meta``) and, per PromQL
expression and step (the key ``expr  # step 60s``: one diagnosis may ask one expression at two
steps, the targets' map finer than the window's signals), the series as Prometheus's API gave
them (``metric`` and ``values`` with the values as Prometheus's strings). A recording keyed by
the expression alone (made before the step was kept) still replays. A replay asked an
expression it has not recorded fails saying so: the query changed, and the recording must be
made again (``make goldens``).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np

from diagnoser.plumbing.source import MetricSource, Series


def answer_key(expr: str, step: float) -> str:
    """The key of one range query's answer: its expression, and its step as a comment."""
    return f"{expr}  # step {step:g}s"


class NotRecorded(KeyError):
    """A query the recording does not hold."""


def instant_key(expr: str, at: float) -> str:
    """The key of one instant query's answer: its expression, and its time as a comment."""
    return f"{expr}  # at {at:.3f}"


class Recording:
    """A ``MetricSource`` that passes queries on and keeps the answers: the range queries'
    always, the instant queries' with ``instants`` (what-if's fit asks them; diagnose does
    not, and its recordings stay as they were)."""

    def __init__(self, inner: MetricSource, instants: bool = False):
        self.inner = inner
        self.answers: dict[str, list[dict[str, Any]]] = {}
        self.instants: dict[str, list[dict[str, Any]]] | None = {} if instants else None

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        series = self.inner.query_range(expr, start, end, step)
        self.answers[answer_key(expr, step)] = _encoded(series)
        return series

    def query(self, expr: str, at: float) -> list[Series]:
        series = self.inner.query(expr, at)
        if self.instants is not None:
            self.instants[instant_key(expr, at)] = _encoded(series)
        return series

    def dump(self, **meta: Any) -> bytes:
        """The recording as the gzipped JSON document ``Replay`` reads."""
        doc: dict[str, Any] = {"meta": meta, "answers": dict(sorted(self.answers.items()))}
        if self.instants is not None:
            doc["instants"] = dict(sorted(self.instants.items()))
        text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
        return gzip.compress(text.encode(), mtime=0)

    def save(self, path: Path, **meta: Any) -> None:
        path.write_bytes(self.dump(**meta))


class Replay:
    """A ``MetricSource`` answering from a recording."""

    def __init__(self, path: Path):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        self.path = path
        self.meta: dict[str, Any] = doc["meta"]
        self.answers: dict[str, list[dict[str, Any]]] = doc["answers"]
        self.instants: dict[str, list[dict[str, Any]]] = doc.get("instants", {})

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        raw = self.answers.get(answer_key(expr, step), self.answers.get(expr))
        if raw is None:
            raise NotRecorded(f"{self.path.name} has no answer for {expr[:120]}...")
        return _series(raw)

    def query(self, expr: str, at: float) -> list[Series]:
        raw = self.instants.get(instant_key(expr, at))
        if raw is None:
            raise NotRecorded(f"{self.path.name} has no instant answer for {expr[:120]}...")
        return _series(raw)


def _encoded(series: list[Series]) -> list[dict[str, Any]]:
    """Series as Prometheus's API gives them (the values as its strings); ``_series`` reads
    them back."""
    return [
        {
            "metric": s.labels,
            "values": [[float(t), repr(float(v))] for t, v in zip(s.t, s.v, strict=True)],
        }
        for s in series
    ]


def _series(raw: list[dict[str, Any]]) -> list[Series]:
    return [
        Series(
            dict(s["metric"]),
            np.array([float(p[0]) for p in s["values"]], dtype=np.float64),
            np.array([float(p[1]) for p in s["values"]], dtype=np.float64),
        )
        for s in raw
    ]
