"""When the trouble began before the window: look further back.

The first pass compares the window with its baseline, the period just before it. When the
model is unhealthy (or abnormal on absolute terms) and that pass found no cause, the baseline
may be as sick as the window: the incident began earlier. The lookback then fetches every
needed signal once more, coarsely (one ``query_range`` each, at most ``MAX_POINTS`` points)
over ``lookback`` before the window's end, finds when each playbook's onset signal changed,
and compares the period after that change with the period before it. What no change explains
but is abnormal on its own (a playbook's ``absolute`` state) is reported at lower confidence.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from diagnoser.catalog import Playbook
from diagnoser.catalog.shapes import Periods
from diagnoser.diagnosis.ends import judge
from diagnoser.diagnosis.fetch import Fetched, fetch, needed_signals
from diagnoser.diagnosis.match import Match, ScopeData, evaluate_absolute
from diagnoser.diagnosis.onset import MIN_SEGMENT, change_point
from diagnoser.diagnosis.window import MIN_STEP, Window, rate_text
from diagnoser.plumbing.durations import parse_seconds
from diagnoser.plumbing.source import MetricSource
from diagnoser.site import Site

MAX_POINTS = 1500
MIN_BASELINE = 3600.0  # the period before a change found in the lookback, at most this long


@dataclass(frozen=True)
class Reach:
    """How far the lookback asked and how far the data went."""

    requested: float  # seconds before the window's end
    start: float  # where the lookback began
    first_sample: float | None  # the earliest sample it found (None: no data at all)


def plan(window: Window, lookback: float) -> Window:
    """The coarse lookback window ``[end - lookback, end]``."""
    start = window.end - lookback
    step = max(MIN_STEP, math.ceil(lookback / MAX_POINTS / MIN_STEP) * MIN_STEP)
    # The window's own rates where the coarser step allows: a lookback that reads the last
    # hour through five-minute rates blurs an incident of minutes into its neighbours.
    rate = max(int(4 * step), int(parse_seconds(window.rate_window)))
    return Window(start, window.end, start, start, step, rate_text(rate))


def scope_matchers(scopes: Sequence[dict[str, str]]) -> tuple[str, ...]:
    names = sorted({s["model_name"] for s in scopes if "model_name" in s})
    if not names:
        return ()
    pattern = "|".join(re.escape(n) for n in names).replace("\\", "\\\\").replace('"', '\\"')
    return (f'model_name=~"{pattern}"',)


def fetch_lookback(
    source: MetricSource,
    site: Site,
    window: Window,
    lookback: float,
    sick: Sequence[dict[str, str]],
    matchers: Sequence[str] = (),
    first_seen: float | None = None,
) -> tuple[Fetched, Reach, Window]:
    """The lookback's data. ``first_seen`` (the earliest vLLM sample within the lookback,
    when known) bounds it: a lookback longer than the data is used as far as the data goes,
    at the resolution that span allows."""
    reach_start = window.end - lookback
    span = lookback
    if first_seen is not None and first_seen > reach_start:
        span = max(window.end - first_seen, window.end - window.first)
    lb = plan(window, span)
    signals = needed_signals(site)
    fetched = fetch(source, site, signals, lb, (*matchers, *scope_matchers(sick)), lookback=span)
    firsts = [float(s.t[0]) for d in fetched.models.values() for s in d.series.values() if s.t.size]
    first = min(firsts) if firsts else first_seen
    return fetched, Reach(lookback, reach_start, first), lb


def onset_periods(pb: Playbook, data: ScopeData, lb: Window, window: Window) -> Periods | None:
    """After the strongest change of the playbook's onset signal in the lookback, against up
    to an hour (or the window's length) before it; None when no change or no clean period."""
    sig = pb.signature
    if sig is None or not sig.onset or sig.onset not in data.series:
        return None
    series = data.series[sig.onset]
    onset = change_point(series, (lb.start, lb.end - MIN_SEGMENT * lb.step))
    if onset is None:
        return None
    length = max(MIN_BASELINE, window.end - window.start)
    base = (max(lb.start, onset - length), onset - lb.step)
    if base[1] - base[0] < MIN_SEGMENT * lb.step:
        return None
    now = (onset, lb.end)
    return Periods(base, now, (min(onset, window.start), lb.end), onset)


def reassess(
    playbooks: Sequence[Playbook],
    data: ScopeData,
    fine: ScopeData,
    lb: Window,
    window: Window,
    changes: Mapping[str, Match] | None = None,
) -> list[Match]:
    """Each playbook judged on the lookback (a change before the window), else on its
    absolute state over the window (ruled out where ``changes``, each playbook's verdict on
    the window's change, contradicts it); every verdict is returned (findings and not)."""
    out = []
    for pb in playbooks:
        periods = onset_periods(pb, data, lb, window)
        found = None
        if periods is not None:
            found = judge(pb, data, window.span, window.baseline, lb.step, periods, "lookback")
        if found is None or found.status not in ("matched", "contested"):
            change = (changes or {}).get(pb.id)
            absolute = evaluate_absolute(pb, fine, window.span, change)
            if absolute.status in ("matched", "contested", "ruled_out") or found is None:
                found = absolute
        out.append(found)
    return out
