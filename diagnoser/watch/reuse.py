"""What a cycle of ``servediag watch`` reads again, and what it takes from the last cycle.

A window of an hour read every minute is 59/60 the same as the last cycle's: each range query
asked again with the same expression and step, over a span that slid forward on the same grid
of steps, is asked of the store only from the last answer's final steps on (``OVERLAP``: the
newest points may have been incomplete, a rate over a scrape not yet ingested), and stitched:
the last answer's points before the new span dropped, its final steps replaced by the new
answer's, the new steps appended. A point of a range query depends only on the samples before
it, so the stitched answer is the answer a full read would give:

- a series present in the last answer keeps its points that are still in the span, also where
  it has none in the new steps (a target gone);
- a series only in the new steps had no point in the last answer's span, so none before them
  (a new target's history in the window was read with it, in the last answer or in no answer).

What a full read would see and this does not is a sample ingested later than ``OVERLAP``
behind the newest point (a store backfilled by hand, remote write hours late): each query is
read whole again once its window has slid past everything its last full read held, so such a
sample is missed for one window's length at most.

A full read instead, always: the first cycle; a query whose expression or step changed (a
window fitted to another scrape interval); a span not on the last answer's grid, or that went
back, or that slid past the last answer; a query whose operation warned (a partial answer of
Thanos or Mimir is not kept). Instant queries are never reused. An entry no query asked for
in a cycle is dropped at its end, and every entry when a cycle fails (an error of any kind): the
next cycle reads everything again. What is kept is bounded (``max_points``): past it, answers
are not kept, and the queries they were are read whole the next cycle.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from diagnoser.plumbing.source import Series

OVERLAP = 60.0  # seconds of the last answer's newest points read again, and
OVERLAP_STEPS = 2  # steps, at least
# Points kept across cycles, at most (16 bytes each: 256 MiB), for a fleet whose answers would
# hold more: what is past it is read whole each cycle.
MAX_POINTS = 16_000_000
EPS = 1e-6  # seconds: times in answers have milliseconds, the grid whole seconds

Labels = tuple[tuple[str, str], ...]


@dataclass
class Entry:
    """The last answer of a range query: its span as asked (whole seconds), its series in
    the store's order (by labels), and the end of its last full read."""

    start: float
    end: float
    series: list[Series]
    full_end: float
    points: int


@dataclass
class Counts:
    """Range queries read whole, read from their last steps on, and points taken from the
    last cycle instead of the store."""

    full: int = 0
    partial: int = 0
    reused: int = 0


@dataclass
class Reuse:
    """The range answers kept from one cycle for the next (shared by the copies a source
    makes of itself for each operation). ``begin`` and ``end`` bound a cycle."""

    max_points: int = MAX_POINTS
    entries: dict[tuple[str, float], Entry] = field(default_factory=dict)
    counts: Counts = field(default_factory=Counts)
    used: set[tuple[str, float]] = field(default_factory=set)
    points: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self) -> None:
        with self.lock:
            self.used.clear()

    def end(self, ok: bool) -> None:
        """A cycle ended: its entries kept if it was good, none of them otherwise, and what
        no query of it asked for dropped either way."""
        with self.lock:
            for key in [k for k in self.entries if not ok or k not in self.used]:
                self.points -= self.entries.pop(key).points
            self.used.clear()

    def read(
        self,
        expr: str,
        start: float,
        end: float,
        step: float,
        ask: Callable[[float], list[Series]],
        clean: Callable[[], bool],
    ) -> list[Series]:
        """The answer to ``query_range(expr, start, end, step)``: ``ask(from)`` reads
        ``[from, end]`` of the store (``start``, or the last answer's final steps), and
        ``clean()`` says whether the answers of this operation may be kept (no warning)."""
        s, e = float(round(start)), float(round(end))  # the span the store is asked
        key = (expr, step)
        with self.lock:
            entry = self.entries.pop(key, None)  # an error below leaves it out
            if entry is not None:
                self.points -= entry.points
            self.used.add(key)
        since = resume(entry, s, e, step)
        reused: int | None = None  # points taken from the last answer (None: a full read)
        if entry is None or since is None:
            kept, full_end = list(ask(start)), e
        else:
            new = ask(since)
            kept = stitch(entry.series, new, s, since)
            full_end = entry.full_end
            reused = sum(int(x.t.size) for x in kept) - sum(int(x.t.size) for x in new)
        for x in kept:  # kept for the next cycle: no reader may change them in place
            x.t.flags.writeable = False
            x.v.flags.writeable = False
        points = sum(int(x.t.size) for x in kept)
        with self.lock:
            if reused is None:
                self.counts.full += 1
            else:
                self.counts.partial += 1
                self.counts.reused += reused
            if clean() and self.max_points > 0 and self.points + points <= self.max_points:
                self.entries[key] = Entry(s, e, kept, full_end, points)
                self.points += points
        return [Series(dict(x.labels), x.t, x.v) for x in kept]


def resume(entry: Entry | None, start: float, end: float, step: float) -> float | None:
    """Where to read ``[start, end]`` from, given the last answer ``entry`` of the same query
    and step: its final ``OVERLAP`` steps, or None (read it whole)."""
    if entry is None or step <= 0 or start < entry.start or end < entry.end:
        return None
    if start >= entry.full_end:  # its last full read has slid out of the window: read it again
        return None
    k = (start - entry.start) / step
    if abs(k - round(k)) > EPS:  # another grid of steps
        return None
    last = entry.start + math.floor((entry.end - entry.start) / step + EPS) * step
    since = last - (max(OVERLAP_STEPS, math.ceil(OVERLAP / step)) - 1) * step
    return since if since > start else None


def stitch(old: list[Series], new: list[Series], start: float, since: float) -> list[Series]:
    """The answer over ``[start, end]``: ``old``'s points from ``start`` up to ``since``,
    then ``new``'s (read from ``since``), per series, in the store's order (by labels)."""
    before: dict[Labels, Series] = {}
    for x in old:
        keep = (x.t >= start - EPS) & (x.t < since - EPS)
        if keep.any():
            before[labels_key(x.labels)] = Series(x.labels, x.t[keep], x.v[keep])
    after = {labels_key(x.labels): x for x in new}
    out = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        if a is not None and b is not None:
            out.append(Series(b.labels, np.concatenate([a.t, b.t]), np.concatenate([a.v, b.v])))
        elif a is not None:
            out.append(a)
        elif b is not None:
            out.append(b)
    return out


def labels_key(labels: dict[str, str]) -> Labels:
    """A series' identity, ordered as Prometheus orders a range query's series."""
    return tuple(sorted(labels.items()))
