"""Evaluate one playbook's signature against one scope's series.

Periods: the *baseline* is the reference before the change; *now* runs from the onset (the
change point of the playbook's onset signal, searched over baseline and window) to the end;
the *window* is what the user asked to diagnose. A condition whose series is absent is
undecided, never healthy; a playbook with an undecided required condition is reported as
undecided with the series it lacked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from diagnoser.catalog import Condition, Playbook, Signature
from diagnoser.catalog.shapes import SHAPES, Periods, Verdict
from diagnoser.diagnosis.onset import periods_for
from diagnoser.plumbing.source import Series
from diagnoser.plumbing.units import AtLeast

BASE_CONFIDENCE = 0.55
SUPPORT_WEIGHT = 0.3
MARGIN_WEIGHT = 0.15
# A pattern judged on its absolute state alone (no change point said when it began) is
# reported at no more than this confidence, below any that a change confirms.
ABSOLUTE_CAP = 0.6


@dataclass
class ScopeData:
    """One scope's series by signal name; by-class signals keep one series per class."""

    scope: dict[str, str]
    series: dict[str, Series] = field(default_factory=dict)
    classes: dict[str, dict[str, Series]] = field(default_factory=dict)
    # Signals the scope's engine does not have, and why (SGLang exports no finished_reason):
    # a playbook that needs one is undecided for that reason, whatever else its series say.
    gaps: dict[str, str] = field(default_factory=dict)
    engine: str = ""  # the engine serving the scope, where not the reference engine
    # The rate window the series were read with, in seconds: a change seen through it is
    # spread over that long (a step becomes a ramp), which shapes of a trend must allow for.
    smoothing: float = 0.0
    # The targets' scrape interval in seconds, where known (0: not known).
    scrape: float = 0.0
    # A quantile's histogram's top finite bucket bounds (``Signal.ceiling``): a value at one
    # fell in the +Inf bucket and is a lower bound.
    ceilings: dict[str, tuple[float, ...]] = field(default_factory=dict)
    # Signals read through another in their place, and what that one is (``Signal.stand_in``).
    stand_ins: dict[str, str] = field(default_factory=dict)

    def has(self, name: str) -> bool:
        return name in self.series or name in self.classes

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(self.scope.items()))


@dataclass
class ConditionResult:
    condition: Condition
    group: str
    verdict: Verdict
    missing: list[str] = field(default_factory=list)
    # The top finite bucket bounds of the signal's histogram (see ScopeData.ceilings).
    ceilings: tuple[float, ...] = ()
    # The signal read in the condition's signal's place, and what it is (ScopeData.stand_ins).
    read_as: str = ""

    def numbers(self) -> dict[str, float | None]:
        """The verdict's numbers as reports show them: finite, rounded, else None."""
        return {k: clean(v) for k, v in self.verdict.numbers.items()}

    def text(self, unit: str) -> str:
        """The evidence in words, by the condition's shape (e.g. ``ttft_p95 74 ms -> 2.22 s``);
        a quantile at its histogram's top finite bound reads ``≥ 2,000``."""
        numbers: dict[str, float | None] = dict(self.numbers())
        if self.ceilings and not self.condition.over:
            for k in ("baseline", "now", "value", "start", "end", "peak", "max"):
                v = numbers.get(k)
                if v is not None and any(math.isclose(v, c, rel_tol=1e-6) for c in self.ceilings):
                    numbers[k] = AtLeast(v)
        text = SHAPES[self.condition.shape].evidence(self.condition, numbers, unit)
        return f"{text} (read as {self.read_as})" if self.read_as else text


def clean(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), 6)


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
    # What the verdict rests on: a change within the window ("window"), a change found in the
    # lookback before it ("lookback"), or an abnormal state with no change found ("absolute").
    basis: str = "window"
    # On the absolute basis: the required condition that the window's change contradicts (the
    # state began there with a change that is not this cause's), which ruled the state out.
    contradiction: ConditionResult | None = None
    # A finding that ended: the verdict over its onset to the window's end, as it stood
    # before the end was found (what it is taken for while its scope is still unhealthy).
    lasting: Match | None = None

    @property
    def onset(self) -> float | None:
        return self.periods.onset if self.periods else None

    @property
    def end(self) -> float | None:
        """When the pattern stopped holding (None: it holds at the window's end)."""
        return self.periods.end if self.periods else None

    @property
    def current(self) -> bool:
        return self.end is None

    def shown(self) -> list[ConditionResult]:
        """The evidence that decided something (or was missing)."""
        return [r for r in self.results if r.verdict.holds is not None or r.missing]

    def held(self) -> list[ConditionResult]:
        """The conditions that held and point to this cause (exclusions aside)."""
        return [r for r in self.results if r.verdict.holds and r.group != "none"]


def evaluate_condition(cond: Condition, data: ScopeData, p: Periods) -> tuple[Verdict, list[str]]:
    missing = [n for n in cond.needs() if not data.has(n)]
    if missing:
        return Verdict.undecided("no series"), missing
    shape = SHAPES[cond.shape]
    if not shape.per_class and cond.signal not in data.series:
        return Verdict.undecided("a per-class signal is tested only with grows_with"), []
    return shape.evaluate(cond, data, p), []


def result(
    cond: Condition, group: str, verdict: Verdict, missing: list[str], data: ScopeData
) -> ConditionResult:
    """A condition's result, with what the scope knows of its signal's series."""
    ceilings = data.ceilings.get(cond.signal, ())
    return ConditionResult(
        cond, group, verdict, missing, ceilings, data.stand_ins.get(cond.signal, "")
    )


def evaluate(
    pb: Playbook,
    data: ScopeData,
    window: tuple[float, float],
    baseline: tuple[float, float],
    step: float,
    periods: Periods | None = None,
    basis: str = "window",
) -> Match:
    """The playbook's signature on the scope (or its ``otherwise``, ``judged_on``);
    ``periods`` instead of finding the onset."""
    sig = judged_on(pb, data)
    if periods is None:
        onset_series = data.series.get(sig.onset) if sig.onset else None
        periods = periods_for(onset_series, window, baseline, step)
    p = periods
    match = Match(pb, data.scope, "not_matched", periods=p, basis=basis)
    gaps = engine_gaps(pb, data)
    if gaps:
        match.status = "undecided"
        match.missing = sorted(gaps)
        match.reason = "; ".join(sorted(set(gaps.values())))
        return match
    if unmeasured(pb, data, match):
        return match
    for group, conds in sig.groups():
        for cond in conds:
            verdict, missing = evaluate_condition(cond, data, p)
            match.results.append(result(cond, group, verdict, missing, data))
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
    match.confidence = confidence(match, sig.max_confidence)
    return match


def _measured(data: ScopeData, name: str) -> bool:
    return (s := data.series.get(name)) is not None and bool(np.isfinite(s.v).any())


def judged_on(pb: Playbook, data: ScopeData) -> Signature:
    """The signature the scope is judged by: the playbook's, or its ``otherwise`` where
    what it requires is not scraped and what the other requires is."""
    assert pb.signature is not None
    return pb.signature.judged_on(lambda name: _measured(data, name))


def unmeasured(pb: Playbook, data: ScopeData, match: Match) -> bool:
    """Whether a signal the playbook requires (what measures its cause) has no sample on the
    scope, nor one its ``otherwise`` requires in its place; if so ``match`` is made
    undecided, naming them."""
    assert pb.signature is not None
    sig = judged_on(pb, data)
    absent = [name for name in sig.requires if not _measured(data, name)]
    if absent and sig.otherwise is not None:
        absent += [n for n in sig.otherwise.requires if not _measured(data, n)]
    if absent:
        match.status = "undecided"
        match.missing = absent
        match.reason = f"no series of {', '.join(absent)}: what would show its cause is not scraped"
    return bool(absent)


def engine_gaps(pb: Playbook, data: ScopeData) -> dict[str, str]:
    """The signals the playbook needs that the scope's engine does not export, with why."""
    assert pb.signature is not None
    return pb.signature.lacking(data.gaps) if data.gaps else {}


def evaluate_absolute(
    pb: Playbook, data: ScopeData, window: tuple[float, float], change: Match | None = None
) -> Match:
    """The playbook's absolute state over the window, with the exclusions that need no
    baseline; ``not_matched`` when the playbook has no absolute state. ``change`` is the
    playbook's verdict on the window's change: where it contradicts the playbook over a clean
    baseline (see ``contradicted``), the state is ruled out, since the change that brought it
    is not this cause's."""
    sig = judged_on(pb, data)
    p = Periods(window, window, window, None)
    match = Match(pb, data.scope, "not_matched", periods=p, basis="absolute")
    if not sig.absolute:
        match.reason = "no absolute state to judge"
        return match
    if unmeasured(pb, data, match):
        return match
    for cond in sig.absolute:
        verdict, missing = evaluate_condition(cond, data, p)
        match.results.append(result(cond, "absolute", verdict, missing, data))
    for cond in sig.none:
        if not SHAPES[cond.shape].relative:
            verdict, missing = evaluate_condition(cond, data, p)
            match.results.append(result(cond, "none", verdict, missing, data))
    state = [r for r in match.results if r.group == "absolute"]
    if not all(r.verdict.holds for r in state):
        failed = next((r for r in state if r.verdict.holds is False), None)
        match.reason = f"{failed.condition.describe()} does not hold" if failed else "no series"
        return match
    excluded = [r for r in match.results if r.group == "none" and r.verdict.holds]
    hard = [r for r in excluded if not r.condition.instead]
    if hard:
        match.status = "ruled_out"
        match.reason = hard[0].condition.why or hard[0].condition.describe()
        return match
    against = contradicted(pb, data, change) if change is not None else None
    if against is not None:
        match.results.append(against)
        match.contradiction = against
        match.status = "ruled_out"
        match.reason = (
            f"its absolute state holds, but began in the window with a change that contradicts "
            f"it: {against.condition.describe()}, yet {against.text('')}"
        )
        return match
    match.status = "contested" if excluded else "matched"
    margin = float(np.mean([r.verdict.margin for r in state]))
    match.confidence = round(
        min(sig.max_confidence, ABSOLUTE_CAP, BASE_CONFIDENCE + 0.05 * margin), 3
    )
    return match


def contradicted(pb: Playbook, data: ScopeData, change: Match) -> ConditionResult | None:
    """The required condition of the window's verdict that the change contradicts, when the
    baseline was clean; else None.

    Contradicted: the verdict is ``not_matched`` because a required condition moved clearly
    the other way (its shape's ``contradicts``: a rise required, a fall as large seen), not
    because it moved too little or could not be judged. Clean: the playbook's absolute state
    did not hold over the verdict's baseline, with samples enough to say so; the state began
    in the window, so the change seen there is what brought it. Over a baseline already in
    that state (an incident older than the window) the change says nothing, and None."""
    sig = pb.signature
    if sig is None or change.status != "not_matched" or change.periods is None:
        return None
    against = next(
        (
            r
            for r in change.results
            if r.group == "all" and SHAPES[r.condition.shape].contradicts(r.condition, r.verdict)
        ),
        None,
    )
    if against is None:
        return None
    b = change.periods.baseline
    before = [evaluate_condition(c, data, Periods(b, b, b, None))[0] for c in sig.absolute]
    if any(v.holds is None for v in before) or all(v.holds for v in before):
        return None
    return against


def confidence(m: Match, cap: float) -> float:
    support = [r for r in m.results if r.group == "supporting" and r.verdict.holds is not None]
    weight = sum(r.condition.weight for r in support)
    held = sum(r.condition.weight for r in support if r.verdict.holds)
    support_share = held / weight if weight else 0.5
    core = [r for r in m.results if r.group in ("all", "any") and r.verdict.holds]
    margin = float(np.mean([r.verdict.margin for r in core])) if core else 0.0
    raw = BASE_CONFIDENCE + SUPPORT_WEIGHT * support_share + MARGIN_WEIGHT * margin
    return round(min(cap, raw), 3)
