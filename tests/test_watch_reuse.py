"""What a cycle of ``servediag watch`` takes from the last one: ``reuse``'s stitching over a
store of known series (a target that appears, one that goes, a grid that changes, an error,
a warning, the bound on what is kept)."""

from __future__ import annotations

import numpy as np
import pytest

from diagnoser.plumbing.source import Series, SourceError
from diagnoser.watch.reuse import Reuse

STEP = 60.0


class Store:
    """Range answers as a Prometheus would give them over ``[start, end]`` on the grid from
    ``start``: each series's value at ``t`` is a function of ``t`` alone, present between
    its first and last time. Counts the points it answered."""

    def __init__(self, lives: dict[str, tuple[float, float]]):
        self.lives = lives
        self.points = 0
        self.asked: list[tuple[float, float]] = []

    def answer(self, start: float, end: float, step: float = STEP) -> list[Series]:
        self.asked.append((start, end))
        grid = np.arange(round(start), round(end) + 1e-9, step)
        out = []
        for name in sorted(self.lives):
            first, last = self.lives[name]
            t = grid[(grid >= first) & (grid <= last)]
            if t.size:
                out.append(Series({"instance": name}, t, t / 1000 + len(name)))
        self.points += sum(s.t.size for s in out)
        return out


def read(reuse: Reuse, store: Store, start: float, end: float, clean: bool = True):
    reuse.begin()
    got = reuse.read("up", start, end, STEP, lambda since: store.answer(since, end), lambda: clean)
    reuse.end(True)
    return got


def same(a: list[Series], b: list[Series]) -> None:
    assert [s.labels for s in a] == [s.labels for s in b]
    for x, y in zip(a, b, strict=True):
        assert np.array_equal(x.t, y.t) and np.array_equal(x.v, y.v)


def test_a_slid_window_reads_its_new_steps_and_the_last_two_and_equals_a_full_read():
    # "new" appears within the cycles' new steps, "gone" ends in the kept part, "late" only
    # in the overlap, "early" leaves the window as it slides.
    store = Store({"a": (0, 1e9), "new": (3700, 1e9), "gone": (1200, 3000), "early": (0, 700)})
    reuse = Reuse()
    first = read(reuse, store, 0, 3600)
    same(first, Store(store.lives).answer(0, 3600))
    for k in range(1, 12):
        start, end = k * STEP, 3600 + k * STEP
        store.asked.clear()
        got = read(reuse, store, start + 0.3, end - 0.2)  # asked as the source rounds
        assert store.asked == [(end - 2 * STEP, end - 0.2)]  # the last answer's final 2 steps
        same(got, Store(store.lives).answer(start, end))
    assert reuse.counts.full == 1 and reuse.counts.partial == 11


def test_a_series_absent_from_the_last_answer_had_no_point_in_its_span():
    """A target scraped again after a gap longer than the window: its points come with the
    new steps, and a full read has no older ones either."""
    store = Store({"a": (0, 1e9), "back": (4000, 1e9)})
    reuse = Reuse()
    read(reuse, store, 0, 3600)
    for k in range(1, 10):
        same(read(reuse, store, k * STEP, 3600 + k * STEP), store.answer(k * STEP, 3600 + k * STEP))


@pytest.mark.parametrize(
    ("start", "end", "why"),
    [
        (90.0, 3690.0, "another grid of steps"),
        (0.0, 3660.0, "the same start: nothing slid out, but the span grew"),
        (3600.0, 7200.0, "slid past the last answer"),
        (-60.0, 3540.0, "went back"),
    ],
)
def test_a_span_off_the_last_answers_grid_or_beyond_it_is_read_whole(start, end, why):
    store = Store({"a": (-1e9, 1e9)})
    reuse = Reuse()
    read(reuse, store, 0, 3600)
    store.asked.clear()
    same(read(reuse, store, start, end), Store(store.lives).answer(start, end))
    if why.startswith("the same start"):
        assert store.asked == [(3540.0, 3660.0)]  # a grown span still reuses its start
    else:
        assert store.asked == [(start, end)], why


def test_a_full_read_again_once_the_last_full_read_slid_out_of_the_window():
    store = Store({"a": (0, 1e9)})
    reuse = Reuse()
    read(reuse, store, 0, 3600)
    for k in range(1, 61):
        store.asked.clear()
        read(reuse, store, k * STEP, 3600 + k * STEP)
        full = store.asked == [(k * STEP, 3600 + k * STEP)]
        assert full == (k == 60), k  # the window no longer holds any point of the first read


def test_an_error_drops_everything_and_the_next_cycle_reads_whole():
    store = Store({"a": (0, 1e9)})
    reuse = Reuse()
    read(reuse, store, 0, 3600)
    reuse.read("other", 0, 3600, STEP, lambda since: store.answer(since, 3600), lambda: True)
    reuse.begin()

    def down(since: float) -> list[Series]:
        raise SourceError("cannot reach")

    with pytest.raises(SourceError):
        reuse.read("up", 60, 3660, STEP, down, lambda: True)
    reuse.end(False)
    assert reuse.entries == {} and reuse.points == 0
    store.asked.clear()
    read(reuse, store, 120, 3720)
    assert store.asked == [(120, 3720)]


def test_what_a_cycle_did_not_ask_for_is_dropped_and_warned_answers_are_not_kept():
    store = Store({"a": (0, 1e9)})
    reuse = Reuse()
    read(reuse, store, 0, 3600)
    reuse.begin()
    reuse.end(True)  # a cycle that did not ask for it
    assert reuse.entries == {} and reuse.points == 0
    read(reuse, store, 60, 3660, clean=False)  # a partial answer (its operation warned)
    assert reuse.entries == {}


def test_what_is_kept_is_bounded_and_cannot_be_changed_by_its_readers():
    store = Store({"a": (0, 1e9), "b": (0, 1e9)})
    reuse = Reuse(max_points=100)
    got = read(reuse, store, 0, 3600)  # 122 points: not kept
    assert reuse.entries == {} and reuse.points == 0
    reuse = Reuse()
    got = read(reuse, store, 0, 3600)
    with pytest.raises(ValueError):
        got[0].v[0] = 1.0
    got[0].labels["instance"] = "x"  # its own labels
    assert reuse.entries[("up", STEP)].series[0].labels == {"instance": "a"}
    assert reuse.points == 122
