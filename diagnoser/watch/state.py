"""Which findings ``servediag watch`` serves: those that held long enough, until they have been
gone long enough (hysteresis), so that an alert on them neither flaps on one noisy cycle nor
ends on one missed cycle.

A finding is keyed by its scope and playbook. It enters the served set on the ``ENTER``-th
consecutive good cycle whose diagnosis names it as current, and leaves once it has been
absent from every good cycle for ``clear_after`` seconds, counted from the first good cycle
that missed it. While it is served and present, its confidence, onset and severity are the
latest cycle's; while absent but not yet cleared, the last ones seen. A failed cycle changes
nothing here: what was served stays served (the service marks it stale).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from diagnoser.diagnosis.match import Match
from diagnoser.diagnosis.model import Diagnosis, ScopeKey, scope_key

ENTER = 2  # consecutive cycles a finding must be current on before it is served
Key = tuple[ScopeKey, str]  # (the finding's scope, its playbook id)


@dataclass
class Held:
    """A finding as served (or waiting to be): its latest values and its history."""

    scope: dict[str, str]
    playbook: str
    severity: str
    confidence: float
    onset: float | None
    group: tuple[str, ...]  # the model scope it is ranked within
    order: int  # its position among its group's findings in the latest cycle it was in
    streak: int = 1  # consecutive good cycles it was current on
    absent_since: float | None = None  # the first good cycle that missed it
    served: bool = False


@dataclass
class Verdict:
    """A scope's health verdict, as the latest good cycle said."""

    scope: dict[str, str]
    verdict: str


@dataclass
class Undecided:
    """A playbook the latest good cycle could not decide on a scope, and why."""

    scope: dict[str, str]
    playbook: str
    reason: str


MAX_REASON = 120


@dataclass
class Findings:
    """The served findings and the last good cycle's verdicts, updated by ``update``."""

    clear_after: float
    by: tuple[str, ...] = ("model_name",)
    held: dict[Key, Held] = field(default_factory=dict)
    health: list[Verdict] = field(default_factory=list)
    undecided: list[Undecided] = field(default_factory=list)

    def update(self, result: Diagnosis, at: float) -> None:
        """Take the diagnosis of a good cycle ending at ``at``."""
        present: set[Key] = set()
        for order, m in _ordered(result.findings, self.by):
            key = (scope_key(m.scope), m.playbook.id)
            present.add(key)
            old = self.held.get(key)
            new = _held(m, self.by, order)
            if old is not None and old.absent_since is None:
                new.streak = old.streak + 1
            new.served = (old is not None and old.served) or new.streak >= ENTER
            self.held[key] = new
        for key, h in list(self.held.items()):
            if key in present:
                continue
            if not h.served:
                del self.held[key]  # seen once, then gone: never served
                continue
            if h.absent_since is None:
                h.absent_since = at
            h.streak = 0
            if at - h.absent_since >= self.clear_after:
                del self.held[key]
        self.health = [Verdict(dict(h.scope), h.verdict) for h in result.health]
        self.undecided = [
            Undecided(dict(m.scope), m.playbook.id, " ".join(m.reason.split())[:MAX_REASON])
            for m in result.undecided
        ]

    def served(self) -> list[tuple[Held, int]]:
        """The findings served, each with its rank within its model scope: 1 for the likely
        cause. The findings of the latest cycle come in its order; those absent but not yet
        cleared after them, in the order they last had; so each scope has one rank 1."""
        groups: dict[tuple[str, ...], list[Held]] = {}
        for h in self.held.values():
            if h.served:
                groups.setdefault(h.group, []).append(h)
        out: list[tuple[Held, int]] = []
        for group in sorted(groups):
            ranked = sorted(groups[group], key=lambda h: (h.absent_since is not None, h.order))
            out += [(h, rank) for rank, h in enumerate(ranked, 1)]
        return out


def _group(scope: dict[str, str], by: tuple[str, ...]) -> tuple[str, ...]:
    """The model scope a finding is ranked within: its group labels' values, or its whole
    scope for a finding about a scrape target no model owns."""
    if any(k in scope for k in by):
        return tuple(scope.get(k, "") for k in by)
    return tuple(f"{k}={v}" for k, v in sorted(scope.items()))


def _ordered(findings: Sequence[Match], by: tuple[str, ...]) -> list[tuple[int, Match]]:
    """Each finding with its position among its model scope's, in the diagnosis's order."""
    seen: dict[tuple[str, ...], int] = {}
    out = []
    for m in findings:
        group = _group(m.scope, by)
        seen[group] = seen.get(group, 0) + 1
        out.append((seen[group], m))
    return out


def _held(m: Match, by: tuple[str, ...], order: int) -> Held:
    return Held(
        scope=dict(m.scope),
        playbook=m.playbook.id,
        severity=m.playbook.severity,
        confidence=float(m.confidence),
        onset=m.onset,
        group=_group(m.scope, by),
        order=order,
    )
