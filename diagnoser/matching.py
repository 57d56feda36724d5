"""Evaluate one playbook's signature against one scope's series, and rank the results.

Periods: the *baseline* is the reference before the change; *now* runs from the onset (the
change point of the playbook's onset signal, searched over baseline and window) to the end;
the *window* is what the user asked to diagnose. A condition whose series is absent is
undecided, never healthy; a playbook with an undecided required condition is reported as
undecided with the series it lacked.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from diagnoser import shapes
from diagnoser.catalog import Condition, Playbook
from diagnoser.shapes import Verdict
from diagnoser.source import Series

MIN_SEGMENT = 8  # samples on each side of a change point
# Share of the variance (in log space) a single step must explain to count as a change. With
# hundreds of samples a clear step explains far more than noise; no healthy scenario of the
# library, or its variants, yields a finding at this threshold (make bench).
MIN_GAIN = 0.2
BASE_CONFIDENCE = 0.55
SUPPORT_WEIGHT = 0.3
MARGIN_WEIGHT = 0.15
EXPLAINED_FACTOR = 0.5
CONTESTED_FACTOR = 0.75  # an exclusion held, but the cause it points to was not found


@dataclass(frozen=True)
class Periods:
    baseline: tuple[float, float]
    now: tuple[float, float]
    window: tuple[float, float]
    onset: float | None


@dataclass
class ScopeData:
    """One scope's series by signal name; by-class signals keep one series per class."""

    scope: dict[str, str]
    series: dict[str, Series] = field(default_factory=dict)
    classes: dict[str, dict[str, Series]] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.series or name in self.classes


@dataclass
class ConditionResult:
    condition: Condition
    group: str
    verdict: Verdict
    missing: list[str] = field(default_factory=list)


@dataclass
class Match:
    playbook: Playbook
    scope: dict[str, str]
    status: str  # matched | ruled_out | not_matched | undecided (| contested, until resolved)
    confidence: float = 0.0
    periods: Periods | None = None
    results: list[ConditionResult] = field(default_factory=list)
    reason: str = ""
    missing: list[str] = field(default_factory=list)
    explained_by: str | None = None
    hints: list[Playbook] = field(default_factory=list)
    # Exclusions that held but whose alternative causes were not found (why, alternatives).
    caveats: list[str] = field(default_factory=list)


def _slice(s: Series, span: tuple[float, float]) -> np.ndarray:
    mask = (s.t >= span[0]) & (s.t <= span[1])
    return s.v[mask]


def change_point(s: Series, search: tuple[float, float]) -> float | None:
    """Time of the strongest shift in mean (in log space) within ``search``."""
    mask = (s.t >= search[0]) & (s.t <= search[1]) & np.isfinite(s.v)
    t, v = s.t[mask], s.v[mask]
    if v.size < 2 * MIN_SEGMENT:
        return None
    # Log space around a typical level, so a doubling counts the same at any scale. A series
    # that is mostly zero (a queue that is usually empty) takes its mean as the level: with
    # the median, every non-zero sample would look alike and the size of the change be lost.
    level = float(np.median(np.abs(v))) or float(np.mean(np.abs(v)))
    x = np.log1p(np.maximum(v, 0) / (level + 1e-12))
    csum, csum2, n = np.cumsum(x), np.cumsum(x * x), x.size
    k = np.arange(MIN_SEGMENT, n - MIN_SEGMENT + 1)
    left_sse = csum2[k - 1] - csum[k - 1] ** 2 / k
    right_sum, right_sum2 = csum[-1] - csum[k - 1], csum2[-1] - csum2[k - 1]
    right_sse = right_sum2 - right_sum**2 / (n - k)
    total = csum2[-1] - csum[-1] ** 2 / n
    gain = total - (left_sse + right_sse)
    best = int(np.argmax(gain))
    if total <= 1e-12 or gain[best] / total < MIN_GAIN:
        return None  # no clear shift
    return float(t[k[best]])


def periods_for(
    onset_series: Series | None,
    window: tuple[float, float],
    baseline: tuple[float, float],
    step: float,
) -> Periods:
    """Now = from the onset to the end; baseline = the reference period before the onset."""
    onset = None
    if onset_series is not None:
        onset = change_point(onset_series, (baseline[0], window[1] - MIN_SEGMENT * step))
    if onset is None or onset < window[0] - (window[1] - window[0]):
        return Periods(baseline, window, window, onset)
    base_end = min(baseline[1], onset - step)
    if base_end - baseline[0] < MIN_SEGMENT * step:  # too little clean baseline: keep it
        base_end = baseline[1]
    now_start = max(onset, window[0]) if onset >= window[0] else window[0]
    return Periods((baseline[0], base_end), (now_start, window[1]), window, onset)


def _values(data: ScopeData, cond: Condition, span: tuple[float, float]) -> np.ndarray | None:
    s = data.series.get(cond.signal)
    if s is None:
        return None
    v = _slice(s, span)
    if cond.over:
        o = data.series.get(cond.over)
        if o is None:
            return None
        common, ia, ib = np.intersect1d(s.t, o.t, return_indices=True)
        keep = (common >= span[0]) & (common <= span[1])
        with np.errstate(divide="ignore", invalid="ignore"):
            v = s.v[ia][keep] / o.v[ib][keep]
    return v


def evaluate_condition(cond: Condition, data: ScopeData, p: Periods) -> tuple[Verdict, list[str]]:
    needed = (
        [cond.signal]
        + ([cond.over] if cond.over else [])
        + ([str(cond.value)] if cond.shape == "tracks" else [])
    )
    missing = [n for n in needed if not data.has(n)]
    if missing:
        return Verdict.undecided("no series"), missing
    shape, value = cond.shape, cond.value
    if shape != "grows_with" and cond.signal not in data.series:
        return Verdict.undecided("a per-class signal is tested only with grows_with"), []
    if shape in ("rises", "falls", "flat", "rises_by"):
        base, now = _values(data, cond, p.baseline), _values(data, cond, p.now)
        assert base is not None and now is not None
        return shapes.compare(shape, float(value), base, now, cond.stat, cond.floor), []
    if shape in ("above", "below"):
        now = _values(data, cond, p.now)
        assert now is not None
        return shapes.level(shape, float(value), now, cond.stat, cond.held), []
    if shape == "grows_with":
        per_class = data.classes.get(cond.signal, {})
        medians = {}
        for label, s in per_class.items():
            v = shapes.summarise(_slice(s, p.now), "median")
            if v is not None:
                medians[label] = v
        return shapes.grows_with(float(cond.exponent or 1.0), medians), []
    window = _values(data, cond, p.window)
    assert window is not None
    if shape == "drifts":
        s = data.series[cond.signal]
        mask = (s.t >= p.window[0]) & (s.t <= p.window[1])
        return shapes.drifts(float(value), s.t[mask], window, cond.floor), []
    if shape == "spikes":
        return shapes.spikes(float(value), window), []
    if shape == "plateau":  # pinned since the change, not before it
        now = _values(data, cond, p.now)
        assert now is not None
        return shapes.plateau(float(value), float(cond.held or 0.5), now), []
    if shape == "tracks":
        other = data.series[str(value)]
        common, ia, ib = np.intersect1d(data.series[cond.signal].t, other.t, return_indices=True)
        keep = (common >= p.window[0]) & (common <= p.window[1])
        a = data.series[cond.signal].v[ia][keep]
        return shapes.tracks(float(cond.min_corr or 0.6), a, other.v[ib][keep]), []
    raise ValueError(shape)


def evaluate(
    pb: Playbook,
    data: ScopeData,
    window: tuple[float, float],
    baseline: tuple[float, float],
    step: float,
) -> Match:
    sig = pb.signature
    assert sig is not None
    onset_series = data.series.get(sig.onset) if sig.onset else None
    p = periods_for(onset_series, window, baseline, step)
    match = Match(pb, data.scope, "not_matched", periods=p)
    for group, conds in (
        ("all", sig.all),
        ("any", sig.any),
        ("none", sig.none),
        ("supporting", sig.supporting),
    ):
        for cond in conds:
            verdict, missing = evaluate_condition(cond, data, p)
            match.results.append(ConditionResult(cond, group, verdict, missing))
    required = [r for r in match.results if r.group == "all"]
    failed = [r for r in required if r.verdict.holds is False]
    if failed:
        match.reason = f"{failed[0].condition.describe()} does not hold"
        return match
    unknown = [r for r in required if r.verdict.holds is None]
    anys = [r for r in match.results if r.group == "any"]
    if anys and not any(r.verdict.holds for r in anys):
        if all(r.verdict.holds is None for r in anys):
            unknown += anys
        else:
            match.reason = "none of its alternatives holds"
            return match
    if unknown:
        match.status = "undecided"
        match.missing = sorted({m for r in unknown for m in r.missing})
        match.reason = "; ".join(sorted({r.verdict.note for r in unknown}))
        return match
    excluded = [r for r in match.results if r.group == "none" and r.verdict.holds]
    hard = [r for r in excluded if not r.condition.instead]
    if hard:
        match.status = "ruled_out"
        match.reason = hard[0].condition.why or hard[0].condition.describe()
        return match
    match.status = "contested" if excluded else "matched"
    match.confidence = _confidence(match, sig.max_confidence)
    return match


def _by_scope(matches: Iterable[Match]) -> list[dict[str, Match]]:
    """The matches of each scope (model or target), by playbook id."""
    groups: dict[tuple[tuple[str, str], ...], dict[str, Match]] = {}
    for m in matches:
        groups.setdefault(tuple(sorted(m.scope.items())), {})[m.playbook.id] = m
    return list(groups.values())


def resolve(matches: list[Match]) -> None:
    """Settle contested matches: an exclusion that names the causes it points to (``instead``)
    rules a playbook out only if one of them matched the same scope at least as strongly.
    Otherwise what it saw may be this cause's own consequence (a KV cache filled by the very
    prefills that stall decoding), so the match stands at lower confidence, with a caveat.
    Decided on the confidences before resolution, so two playbooks that point at each other
    leave the stronger one standing."""
    decisions: list[tuple[Match, str | None, list[str]]] = []
    for same in _by_scope(m for m in matches if m.status in ("matched", "contested")):
        for m in same.values():
            if m.status != "contested":
                continue
            ruled: str | None = None
            caveats = []
            for r in m.results:
                if r.group != "none" or not r.verdict.holds:
                    continue
                stronger = [
                    i
                    for i in r.condition.instead
                    if i in same and (same[i].confidence, m.playbook.id) > (m.confidence, i)
                ]
                why = r.condition.why or r.condition.describe()
                if stronger:
                    ruled = ruled or f"{why} (and {stronger[0]} matched)"
                else:
                    weaker = [i for i in r.condition.instead if i in same]
                    verdict = "matched less strongly" if weaker else "did not match"
                    names = " or ".join(weaker or r.condition.instead)
                    caveats.append(f"{why}, but {names} {verdict}")
            decisions.append((m, ruled, caveats))
    for m, ruled, caveats in decisions:
        if ruled:
            m.status, m.reason, m.confidence = "ruled_out", ruled, 0.0
        else:
            m.status, m.caveats = "matched", caveats
            m.confidence = round(m.confidence * CONTESTED_FACTOR, 3)


def _confidence(m: Match, cap: float) -> float:
    support = [r for r in m.results if r.group == "supporting" and r.verdict.holds is not None]
    weight = sum(r.condition.weight for r in support)
    held = sum(r.condition.weight for r in support if r.verdict.holds)
    support_share = held / weight if weight else 0.5
    core = [r for r in m.results if r.group in ("all", "any") and r.verdict.holds]
    margin = float(np.mean([r.verdict.margin for r in core])) if core else 0.0
    raw = BASE_CONFIDENCE + SUPPORT_WEIGHT * support_share + MARGIN_WEIGHT * margin
    return round(min(cap, raw), 3)


def rank(matches: list[Match], advisory: list[Playbook]) -> list[Match]:
    """Order findings: demote those explained by another finding of the same scope, attach
    advisory hints. Every scope (model or target) keeps its own findings."""
    resolve(matches)
    found = [m for m in matches if m.status == "matched"]
    for same in _by_scope(found):
        for m in same.values():
            for other in same.values():
                sig = other.playbook.signature
                explains = other is not m and sig is not None and m.playbook.id in sig.explains
                if explains and (
                    m.explained_by is None or other.confidence > same[m.explained_by].confidence
                ):
                    m.explained_by = other.playbook.id
    for m in found:
        if m.explained_by:
            m.confidence = round(m.confidence * EXPLAINED_FACTOR, 3)
        m.hints = [a for a in advisory if m.playbook.id in a.relates_to]
    return sorted(
        found,
        key=lambda m: (
            -m.confidence,
            -len(m.playbook.signature.all if m.playbook.signature else ()),
            m.playbook.id,
            sorted(m.scope.items()),
        ),
    )
