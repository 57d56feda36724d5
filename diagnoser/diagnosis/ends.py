"""When an incident ended, and which stretch of the data was the incident.

``evaluate`` compares the period after a playbook's onset with the baseline before it. An
incident that was mitigated leaves a recovery after it: averaged into the incident, it makes
a weaker incident that never ended. ``judge`` therefore splits the onset signal wherever its
mean shifts (``change_points``), and

- after a match, takes as the incident's end the first change after the onset (searched
  from the onset: an incident that ends is a pulse) after which the signature no longer holds
  to the window's end, and where the onset signal came back nearer its level before the onset
  than its level during the incident (``back``): the evidence is then read over the incident
  alone, and the finding is *resolved* at that time;
- where the strongest change does not match (a window holding baseline, incident and
  recovery, whose strongest change is the recovery), tries each change followed by such an
  end as the onset of an incident that ended, the most recent first, against the stretch
  before it. Only an incident that ended is found so: a change within a lasting incident is
  no onset against the incident's own first minutes.

A signature the data cannot decide after a change (no samples: a server down, an engine
frozen) has not ended there. ``unended`` makes the last incident that ended current again
where its scope never recovered after it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from diagnoser.catalog import Playbook
from diagnoser.catalog.shapes import Periods
from diagnoser.diagnosis.match import Match, ScopeData, evaluate, evaluate_condition
from diagnoser.diagnosis.onset import MIN_SEGMENT, change_points
from diagnoser.plumbing.source import Series

FOUND = ("matched", "contested")


def holds(pb: Playbook, data: ScopeData, p: Periods) -> bool | None:
    """Whether the signature's required conditions hold over ``p`` (exclusions aside):
    False when one fails or none of its alternatives holds, None when the data cannot say."""
    sig = pb.signature
    assert sig is not None
    unknown = False
    for cond in sig.all:
        verdict, _ = evaluate_condition(cond, data, p)
        if verdict.holds is False:
            return False
        unknown = unknown or verdict.holds is None
    if sig.any:
        said = [evaluate_condition(c, data, p)[0].holds for c in sig.any]
        if any(said):
            return None if unknown else True
        if all(h is False for h in said):
            return False
        return None
    return None if unknown else True


def _level(s: Series, span: tuple[float, float], scale: float) -> float | None:
    v = s.v[(s.t >= span[0]) & (s.t <= span[1]) & np.isfinite(s.v)]
    return float(np.mean(np.log1p(np.maximum(v, 0) / scale))) if v.size else None


def back(s: Series, p: Periods, end: float) -> bool:
    """Whether the onset signal after ``end`` came back: nearer (in log space) its level
    before the onset than its level during the incident. A limit that binds on and off has
    quiet stretches that fail the signature, but its signal stays between the two and the
    incident goes on."""
    during = s.v[(s.t >= p.now[0]) & (s.t < end) & np.isfinite(s.v)]
    scale = float(np.median(np.abs(during))) or float(np.mean(np.abs(during))) if during.size else 0
    scale = scale or 1e-12
    b = _level(s, p.baseline, scale)
    d = _level(s, (p.now[0], end - 1e-9), scale)
    a = _level(s, (end, p.window[1]), scale)
    if b is None or d is None or a is None:
        return True  # nothing to hold the end against: the signature said it
    return abs(a - b) < abs(a - d)


def judge(
    pb: Playbook,
    data: ScopeData,
    window: tuple[float, float],
    baseline: tuple[float, float],
    step: float,
    periods: Periods | None = None,
    basis: str = "window",
) -> Match:
    """``evaluate``, with the incident's end where it ended, and, where the strongest
    change does not match, the most recent incident between two changes that does."""
    m = evaluate(pb, data, window, baseline, step, periods, basis)
    sig = pb.signature
    assert sig is not None
    series = data.series.get(sig.onset) if sig.onset else None
    if series is None or m.periods is None:
        return m
    end = m.periods.now[1]
    if m.status in FOUND and m.onset is None:
        return _level_ended(pb, data, m, step, basis)
    if m.status not in FOUND and (m.status != "not_matched" or periods is not None):
        return m  # nothing to end, and no other onset to try
    # The changes after the onset, searched from it: an incident that ends is a pulse, which
    # one split of the whole span may not explain well enough to count.
    after = change_points(series, (m.onset, end)) if m.onset is not None else []
    if m.status in FOUND:
        return _ended(pb, data, m, after, step, basis, series)
    cps = sorted({*change_points(series, (m.periods.baseline[0], end)), *after})
    if m.onset is not None:
        cps = sorted({*cps, m.onset})
    for onset in reversed(cps):
        later = [c for c in cps if c > onset]
        if not later or onset < window[0] - (window[1] - window[0]):
            continue
        before = [c for c in cps if c < onset]
        start = max(baseline[0], before[-1]) if before else baseline[0]
        if onset - step - start < MIN_SEGMENT * step:
            continue
        base = (start, onset - step)
        if holds(pb, data, Periods(base, (later[0], end), window, later[0])) is not False:
            continue
        p = Periods(base, (max(onset, window[0]), later[0] - step), window, onset, later[0])
        if not back(series, p, later[0]):
            continue
        found = evaluate(pb, data, window, baseline, step, p, basis)
        if found.status in FOUND:
            return found
    return m


def _ended(
    pb: Playbook,
    data: ScopeData,
    m: Match,
    cps: list[float],
    step: float,
    basis: str,
    series: Series,
) -> Match:
    """``m`` read over the incident alone, resolved at the first change after its onset
    after which the signature no longer holds; ``m`` itself when it holds to the end."""
    p = m.periods
    if p is None or p.onset is None:
        return m  # no change said when it began: nor can one say when it ended
    end = p.now[1]
    for e in cps:
        if e <= p.onset or e <= p.now[0] + (MIN_SEGMENT - 1) * step:
            continue
        after = Periods(p.baseline, (e, end), p.window, e)
        if holds(pb, data, after) is not False or not back(series, p, e):
            continue
        during = replace(p, now=(p.now[0], e - step), end=e)
        found = evaluate(pb, data, p.window, p.baseline, step, during, basis)
        if found.status in FOUND:
            found.lasting = m
            return found
    return m


def _level_ended(pb: Playbook, data: ScopeData, m: Match, step: float, basis: str) -> Match:
    """A match no change dated (a state held for part of the window, too short for a change
    point): where the signature's level condition on its onset signal (stalled engines at
    one or more) last held well before the window's end, and the signature fails after it,
    the incident ended there."""
    sig = pb.signature
    p = m.periods
    assert sig is not None and p is not None
    cond = next(
        (c for c in sig.all if c.signal == sig.onset and c.shape in ("above", "below")), None
    )
    s = data.series.get(cond.signal) if cond is not None and not cond.over else None
    if cond is None or s is None:
        return m
    inside = (s.t >= p.now[0]) & (s.t <= p.now[1]) & np.isfinite(s.v)
    t, v = s.t[inside], s.v[inside]
    level = float(cond.value)
    at = np.flatnonzero(v >= level if cond.shape == "above" else v <= level)
    if not at.size:
        return m
    end = float(t[at[-1]]) + step
    if end > p.now[1] - MIN_SEGMENT * step:
        return m  # at it still, or too lately to tell
    if holds(pb, data, Periods(p.baseline, (end, p.now[1]), p.window, end)) is not False:
        return m
    # It began where the level first held: the incident is that stretch, dated.
    began = float(t[at[0]])
    during = replace(p, now=(began, end - step), onset=began, end=end)
    found = evaluate(pb, data, p.window, p.baseline, step, during, basis)
    if found.status not in FOUND:
        return m
    found.lasting = m
    return found


def unended(own: list[Match], start: float, recovered: Callable[[float], bool]) -> dict[int, Match]:
    """A scope still unhealthy at the window's end with no current finding has not
    recovered: what ended last in the window (after ``start``) left consequences that last
    (a queue still draining after the preemptions stopped, a limit that binds on and off
    after its first minutes), so that finding of ``own`` (the scope's ranked findings) is
    current again: read to the window's end where it held so, else over its incident, as
    ranked. Not where the service recovered after it (``recovered(end)``: every SLO met for
    a while): the trouble at the end is then something new. Returns the replacement by the
    ``id`` of the finding replaced."""
    if any(m.current for m in own):
        return {}
    ended = [m for m in own if m.end is not None and m.end > start]
    if not ended:
        return {}
    m = max(ended, key=lambda m: m.end or 0.0)
    if m.end is None or recovered(m.end):
        return {}
    if m.lasting is not None:
        again = m.lasting
    else:
        assert m.periods is not None
        again = replace(m, periods=replace(m.periods, end=None))
    again.status, again.confidence = m.status, m.confidence
    again.explained_by, again.hints, again.caveats = m.explained_by, m.hints, m.caveats
    return {id(m): again}
