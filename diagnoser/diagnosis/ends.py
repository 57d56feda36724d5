"""When an incident ended, and which stretch of the data was the incident.

``evaluate`` compares the period after a playbook's onset with the baseline before it. An
incident that was mitigated leaves a recovery after it: averaged into the incident, it makes
a weaker incident that never ended. ``judge`` therefore splits the onset signal wherever its
mean shifts (``change_points``), and

- after a match, takes as the incident's end the first later change after which the
  signature no longer holds (and stays so to the window's end): the evidence is then read
  over the incident alone, and the finding is *resolved* at that time;
- where the strongest change does not match (a window holding baseline, incident and
  recovery, whose strongest change is the recovery), tries each other change as the onset,
  the most recent first, against the stretch before it.

A signature the data cannot decide after a change (no samples: a server down, an engine
frozen) has not ended there.
"""

from __future__ import annotations

from dataclasses import replace

from diagnoser.catalog import Playbook
from diagnoser.catalog.shapes import Periods
from diagnoser.diagnosis.match import Match, ScopeData, evaluate, evaluate_condition
from diagnoser.diagnosis.onset import MIN_SEGMENT, change_points

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
    change does not match, the most recent other change that does."""
    m = evaluate(pb, data, window, baseline, step, periods, basis)
    sig = pb.signature
    assert sig is not None
    series = data.series.get(sig.onset) if sig.onset else None
    if series is None or m.periods is None:
        return m
    end = m.periods.now[1]
    cps = change_points(series, (m.periods.baseline[0], end))
    if m.status in FOUND:
        return _ended(pb, data, m, cps, step, basis)
    if m.status != "not_matched" or periods is not None:
        return m
    for onset in reversed(cps):
        if onset < window[0] - (window[1] - window[0]):
            continue
        before = [c for c in cps if c < onset]
        start = max(baseline[0], before[-1]) if before else baseline[0]
        if onset - step - start < MIN_SEGMENT * step:
            continue
        base, now_start = (start, onset - step), max(onset, window[0])
        if onset != m.onset:  # the strongest change was judged to the end already
            p = Periods(base, (now_start, end), window, onset)
            found = evaluate(pb, data, window, baseline, step, p, basis)
            if found.status in FOUND:
                return _ended(pb, data, found, cps, step, basis)
        later = [c for c in cps if c > onset]
        if later and holds(pb, data, Periods(base, (later[0], end), window, later[0])) is False:
            p = Periods(base, (now_start, later[0] - step), window, onset, later[0])
            found = evaluate(pb, data, window, baseline, step, p, basis)
            if found.status in FOUND:
                return found
    return m


def _ended(
    pb: Playbook, data: ScopeData, m: Match, cps: list[float], step: float, basis: str
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
        if holds(pb, data, after) is not False:
            continue
        during = replace(p, now=(p.now[0], e - step), end=e)
        found = evaluate(pb, data, p.window, p.baseline, step, during, basis)
        if found.status in FOUND:
            found.lasting = m
            return found
    return m


def unended(own: list[Match], start: float) -> dict[int, Match]:
    """A scope still unhealthy at the window's end with no current finding has not
    recovered: what ended in the window (after ``start``) left consequences that last (a
    queue still draining after the preemptions stopped). Each such finding of ``own`` (the
    scope's ranked findings) is current again, read to the window's end, as ranked. Returns
    the replacements by the ``id`` of the finding replaced."""
    if any(m.current for m in own):
        return {}
    out = {}
    for m in own:
        if m.lasting is None or m.end is None or m.end <= start:
            continue
        again = m.lasting
        again.status, again.confidence = m.status, m.confidence
        again.explained_by, again.hints, again.caveats = m.explained_by, m.hints, m.caveats
        out[id(m)] = again
    return out
