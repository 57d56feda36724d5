"""Series kept over simulated time, written as OpenMetrics for ``promtool tsdb
create-blocks-from openmetrics`` or as the Prometheus text format for a live ``/metrics``.

Names are exposed names: counters end in ``_total`` and histograms expose ``_bucket``,
``_sum`` and ``_count`` with ``le`` formatted as ``prometheus_client`` formats it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TextIO

import numpy as np

from diagnoser.metrics.buckets import le_label

Labels = tuple[tuple[str, str], ...]


def labels_of(**kw: str) -> Labels:
    return tuple(sorted(kw.items()))


class Histogram:
    """Cumulative histogram with fixed bounds; observations may carry counts."""

    def __init__(self, bounds: Iterable[float]):
        self.key = tuple(float(b) for b in bounds)
        self.bounds = np.asarray(self.key, dtype=np.float64)
        self.counts = np.zeros(len(self.bounds) + 1, dtype=np.float64)  # last: +Inf only
        self.sum = 0.0

    def observe(self, values: np.ndarray | list[float], weights: np.ndarray | None = None) -> None:
        v = np.asarray(values, dtype=np.float64)
        if v.size == 0:
            return
        idx = np.searchsorted(self.bounds, v, side="left")
        if weights is None:  # each once: whole counts, and a sum of the values as they are
            self.counts += np.bincount(idx, minlength=len(self.counts))
            self.sum += float(v.sum())
            return
        w = np.asarray(weights, dtype=np.float64)
        self.counts += np.bincount(idx, weights=w, minlength=len(self.counts))
        self.sum += float((v * w).sum())

    def cumulative(self) -> np.ndarray:
        return np.cumsum(self.counts)

    @property
    def count(self) -> float:
        return float(self.counts.sum())


@dataclass
class Family:
    name: str  # exposed base name (counters with _total, histograms without suffix)
    type: str  # counter | gauge | histogram
    help: str
    points: dict[Labels, list[tuple[float, float]]] = field(default_factory=dict)
    # histograms: labels -> list of (timestamp, cumulative bucket counts, sum)
    # histograms: labels -> list of (timestamp, bucket bounds, cumulative counts, sum). The
    # bounds travel with each point: a restart with another max_model_len changes them.
    hpoints: dict[Labels, list[tuple[float, tuple[float, ...], np.ndarray, float]]] = field(
        default_factory=dict
    )
    # summaries without quantiles: labels -> list of (timestamp, count, sum)
    spoints: dict[Labels, list[tuple[float, float, float]]] = field(default_factory=dict)


class Recorder:
    """Every sample written so far, by family; ``history=False`` keeps only the latest."""

    def __init__(self, history: bool = True) -> None:
        self.families: dict[str, Family] = {}
        self.history = history

    def family(self, name: str, type_: str, help_: str) -> Family:
        fam = self.families.get(name)
        if fam is None:
            fam = self.families[name] = Family(name, type_, help_)
        return fam

    def sample(
        self, name: str, type_: str, help_: str, labels: Labels, t: float, value: float
    ) -> None:
        points = self.family(name, type_, help_).points
        if self.history:
            points.setdefault(labels, []).append((t, value))
        else:
            points[labels] = [(t, value)]

    def sample_histogram(
        self, name: str, help_: str, labels: Labels, t: float, hist: Histogram
    ) -> None:
        fam = self.family(name, "histogram", help_)
        point = (t, hist.key, hist.cumulative(), hist.sum)
        if self.history:
            fam.hpoints.setdefault(labels, []).append(point)
        else:
            fam.hpoints[labels] = [point]

    def sample_summary(
        self, name: str, help_: str, labels: Labels, t: float, count: float, total: float
    ) -> None:
        points = self.family(name, "summary", help_).spoints
        if self.history:
            points.setdefault(labels, []).append((t, count, total))
        else:
            points[labels] = [(t, count, total)]

    def sample_count(self) -> int:
        n = 0
        for fam in self.families.values():
            n += sum(len(p) for p in fam.points.values())
            n += sum(len(pt[1]) + 3 for p in fam.hpoints.values() for pt in p)
            n += sum(2 * len(p) for p in fam.spoints.values())
        return n


def labelstr(labels: Labels, extra: tuple[tuple[str, str], ...] = ()) -> str:
    """``{k="v",...}`` as OpenMetrics writes labels (empty for none)."""
    items = [*labels, *extra]
    if not items:
        return ""
    body = ",".join(f'{k}="{escape(v)}"' for k, v in items)
    return "{" + body + "}"


def escape(value: str) -> str:
    """A label value as the text formats write it."""
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def number(value: float) -> str:
    """A sample value as the text formats write it (whole numbers without a point)."""
    try:
        whole = int(value)
    except (OverflowError, ValueError):  # infinite, or NaN
        if value != value:
            return "NaN"
        return "+Inf" if value > 0 else "-Inf"
    if value == whole and -1e15 < value < 1e15:
        return str(whole)
    return repr(float(value))


class _Formatted(dict[float, str]):
    """Each value's text, formatted once (``number`` or a timestamp's): a series repeats its
    timestamps and a histogram's buckets their counts."""

    def __init__(self, fmt: Callable[[float], str]):
        super().__init__()
        self.fmt = fmt

    def __missing__(self, value: float) -> str:
        text = self[value] = self.fmt(value)
        return text


def _timestamp(t: float) -> str:
    return f"{t:.3f}"


def _openmetrics_family_name(fam: Family) -> str:
    # OpenMetrics names a counter family without its _total suffix.
    if fam.type == "counter" and fam.name.endswith("_total"):
        return fam.name[: -len("_total")]
    return fam.name


def iter_openmetrics(rec: Recorder) -> Iterator[str]:
    """OpenMetrics text with timestamps, every family's samples contiguous, ``# EOF`` last
    (a line at a time)."""
    for lines in _openmetrics_blocks(rec):
        yield from lines


def _openmetrics_blocks(rec: Recorder) -> Iterator[list[str]]:
    """The lines of ``iter_openmetrics``, a family's header or one series' samples at a time."""
    stamps = _Formatted(_timestamp)
    for fam in rec.families.values():
        base = _openmetrics_family_name(fam)
        yield [f"# TYPE {base} {fam.type}\n", f"# HELP {base} {fam.help}\n"]
        # Counts and sums repeat within a family; NaN, never equal to itself, is formatted
        # each time.
        numbers = _Formatted(number)
        for labels, hpoints in fam.hpoints.items():
            keys = list(dict.fromkeys(p[1] for p in hpoints))
            index = {k: {b: n for n, b in enumerate(k)} for k in keys}
            at = [stamps[p[0]] for p in hpoints]
            cums = [p[2].tolist() for p in hpoints]
            for bound in sorted(set().union(*keys)):
                head = f"{fam.name}_bucket{labelstr(labels, (('le', le_label(bound)),))} "
                if len(keys) == 1:
                    i = index[keys[0]][bound]
                    yield [
                        f"{head}{numbers[cum[i]]} {t}\n" for t, cum in zip(at, cums, strict=True)
                    ]
                    continue
                lines = []
                for p, t, cum in zip(hpoints, at, cums, strict=True):
                    n = index[p[1]].get(bound)
                    if n is not None:
                        lines.append(f"{head}{numbers[cum[n]]} {t}\n")
                yield lines
            head = f"{fam.name}_bucket{labelstr(labels, (('le', '+Inf'),))} "
            counts = [numbers[cum[-1]] for cum in cums]
            yield [f"{head}{c} {t}\n" for c, t in zip(counts, at, strict=True)]
            head = f"{fam.name}_count{labelstr(labels)} "
            yield [f"{head}{c} {t}\n" for c, t in zip(counts, at, strict=True)]
            head = f"{fam.name}_sum{labelstr(labels)} "
            yield [f"{head}{numbers[p[3]]} {t}\n" for p, t in zip(hpoints, at, strict=True)]
        for labels, spoints in fam.spoints.items():
            lbl = labelstr(labels)
            yield [f"{fam.name}_count{lbl} {numbers[c]} {stamps[t]}\n" for t, c, _ in spoints]
            yield [f"{fam.name}_sum{lbl} {numbers[s]} {stamps[t]}\n" for t, _, s in spoints]
        for labels, points in fam.points.items():
            head = f"{fam.name}{labelstr(labels)} "
            yield [f"{head}{numbers[v]} {stamps[t]}\n" for t, v in points]
    yield ["# EOF\n"]


def write_openmetrics(rec: Recorder, out: TextIO) -> None:
    buf: list[str] = []
    for lines in _openmetrics_blocks(rec):
        buf += lines
        if len(buf) >= 4096:
            out.write("".join(buf))
            buf.clear()
    out.write("".join(buf))


def text_exposition(rec: Recorder) -> str:
    """The latest sample of every series, in the Prometheus text format (no timestamps)."""
    lines: list[str] = []
    for fam in rec.families.values():
        lines.append(f"# HELP {fam.name} {fam.help}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for labels, hpoints in fam.hpoints.items():
            _t, key, cum, s = hpoints[-1]
            les = [le_label(b) for b in key] + ["+Inf"]
            for i, le in enumerate(les):
                lines.append(
                    f"{fam.name}_bucket{labelstr(labels, (('le', le),))} {number(float(cum[i]))}"
                )
            lines.append(f"{fam.name}_count{labelstr(labels)} {number(float(cum[-1]))}")
            lines.append(f"{fam.name}_sum{labelstr(labels)} {number(s)}")
        for labels, spoints in fam.spoints.items():
            _t, c, total = spoints[-1]
            lines.append(f"{fam.name}_count{labelstr(labels)} {number(c)}")
            lines.append(f"{fam.name}_sum{labelstr(labels)} {number(total)}")
        for labels, points in fam.points.items():
            lines.append(f"{fam.name}{labelstr(labels)} {number(points[-1][1])}")
    return "\n".join(lines) + "\n"
