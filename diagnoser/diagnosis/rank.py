"""Rank what matched: settle contested exclusions, demote symptoms explained by a cause
found in the same scope, and attach the advisory playbooks as hints."""

from __future__ import annotations

from collections.abc import Iterable

from diagnoser.catalog import Playbook
from diagnoser.diagnosis.match import Match

EXPLAINED_FACTOR = 0.5
CONTESTED_FACTOR = 0.75  # an exclusion held, but the cause it points to was not found


def by_scope(matches: Iterable[Match]) -> list[dict[str, Match]]:
    """The matches of each scope (model or target), by playbook id."""
    groups: dict[tuple[tuple[str, str], ...], dict[str, Match]] = {}
    for m in matches:
        groups.setdefault(_key(m), {})[m.playbook.id] = m
    return list(groups.values())


def resolve(matches: list[Match]) -> None:
    """Settle contested matches: an exclusion that names the causes it points to (``instead``)
    rules a playbook out only if one of them matched the same scope at least as strongly.
    Otherwise what it saw may be this cause's own consequence (a KV cache filled by the very
    prefills that stall decoding), so the match stands at lower confidence, with a caveat.
    When the stronger one found *explains* this one (a queue is a symptom of a crowded KV
    cache), this one is kept as its symptom instead: what was seen is real, and ``rank``
    puts it behind its cause. When none of the causes it points to matched and one of them
    could not be decided on the scope (a series its server does not export), what was seen
    may well be that cause's: the match is undecided too, for that reason, rather than a
    likely cause its own exclusion contradicts. Decided on the confidences before
    resolution, so two playbooks that point at each other leave the stronger one standing."""
    undecided = {(_key(m), m.playbook.id): m for m in matches if m.status == "undecided"}
    decisions: list[tuple[Match, str | None, list[str], list[str], list[Match]]] = []
    for same in by_scope(m for m in matches if m.status in ("matched", "contested")):
        for m in same.values():
            if m.status != "contested":
                continue
            ruled: str | None = None
            caveats: list[str] = []
            unjudged: list[Match] = []
            open_: list[str] = []  # why the exclusion stays open: its causes undecided
            for r in m.results:
                if r.group != "none" or not r.verdict.holds:
                    continue
                why = r.condition.why or r.condition.describe()
                found = [i for i in r.condition.instead if i in same]
                pending = [
                    undecided[k] for i in r.condition.instead if (k := (_key(m), i)) in undecided
                ]
                if pending and not found:
                    names = " or ".join(u.playbook.id for u in pending)
                    unjudged += pending
                    open_.append(f"{why}, and {names} could not be decided: {pending[0].reason}")
                    continue
                stronger = [
                    i
                    for i in r.condition.instead
                    if i in same and (same[i].confidence, m.playbook.id) > (m.confidence, i)
                ]
                causes = [i for i in stronger if m.playbook.id in _explains(same[i])]
                if causes:
                    continue  # a symptom of the cause found: kept, explained by it (see rank)
                if stronger:
                    ruled = ruled or f"{why} (and {stronger[0]} matched)"
                else:
                    weaker = [i for i in r.condition.instead if i in same]
                    verdict = "matched less strongly" if weaker else "did not match"
                    names = " or ".join(weaker or r.condition.instead)
                    caveats.append(f"{why}, but {names} {verdict}")
            decisions.append((m, ruled, caveats, open_, unjudged))
    for m, ruled, caveats, open_, unjudged in decisions:
        if not ruled and not caveats and not open_:
            m.status = "matched"  # every exclusion that held points at the cause of it
            continue
        if ruled:
            m.status, m.reason, m.confidence = "ruled_out", ruled, 0.0
        elif unjudged:
            m.status, m.confidence = "undecided", 0.0
            m.reason = "; ".join(open_)
            m.missing = sorted({s for u in unjudged for s in u.missing})
        else:
            m.status, m.caveats = "matched", caveats
            m.confidence = round(m.confidence * CONTESTED_FACTOR, 3)


def _key(m: Match) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(m.scope.items()))


def _explains(m: Match) -> tuple[str, ...]:
    return m.playbook.signature.explains if m.playbook.signature else ()


def _explained(m: Match, by: Match) -> bool:
    """Whether ``by`` explains ``m``: its signature says so, and where each says it explains
    the other (either can be the other's consequence: a prefix cache that stopped hitting
    fills the KV cache, a full KV cache evicts the prefixes), the one that began first is
    the cause; with no order of events, the stronger."""
    if by is m or m.playbook.id not in _explains(by):
        return False
    if m.current and not by.current:
        return False  # a cause that ended explains nothing that goes on
    if by.playbook.id not in _explains(m):
        return True
    if by.onset is not None and m.onset is not None and by.onset != m.onset:
        return by.onset < m.onset
    return (by.confidence, m.playbook.id) > (m.confidence, by.playbook.id)


def rank(matches: list[Match], advisory: list[Playbook]) -> list[Match]:
    """Order findings: demote those explained by another finding of the same scope, attach
    advisory hints. Every scope (model or target) keeps its own findings."""
    resolve(matches)
    found = [m for m in matches if m.status == "matched"]
    for same in by_scope(found):
        for m in same.values():
            for other in same.values():
                if _explained(m, by=other) and (
                    m.explained_by is None or other.confidence > same[m.explained_by].confidence
                ):
                    m.explained_by = other.playbook.id
    for m in found:
        if m.explained_by:
            m.confidence = round(m.confidence * EXPLAINED_FACTOR, 3)
        m.hints = [a for a in advisory if m.playbook.id in a.relates_to]
    return ordered(found)


def ordered(found: list[Match]) -> list[Match]:
    """Findings by confidence, then by the size of their signatures, id and scope."""
    return sorted(
        found,
        key=lambda m: (
            -m.confidence,
            -len(m.playbook.signature.all if m.playbook.signature else ()),
            m.playbook.id,
            sorted(m.scope.items()),
        ),
    )
