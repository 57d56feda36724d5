"""A playbook as the rest of the toolkit sees it, once loaded and checked."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from diagnoser.catalog.shapes import SHAPES

CHAPTERS = {
    "tokens": "Models read tokens, not words",
    "prefill-decode": "Prefill fills the KV cache. Decode reads it",
    "attention": "Why keep the Keys and Values?",
    "latency": "The anatomy of \u201cit feels slow\u201d",
    "batching": "Static vs continuous batching",
    "memory": "The GPU memory budget",
    # Not a chapter of the seed: the features and topologies production servers run today.
    "serving-stack": "Caches, drafts, replicas and adapters: today's serving stack",
}
GROUPS = ("all", "any", "none", "supporting", "absolute")


@dataclass(frozen=True)
class Condition:
    signal: str
    shape: str
    value: float | str
    over: str | None = None
    held: float | None = None
    stat: str = "median"
    floor: float | None = None
    min_corr: float | None = None
    exponent: float | None = None
    weight: float = 1.0
    why: str | None = None
    # An exclusion with ``instead`` is contested: it rules the playbook out only when one of
    # these playbooks matches the same scope at least as strongly (see diagnose.rank).
    instead: tuple[str, ...] = ()
    # The alert parameter whose value this condition's threshold is (one source for both).
    param: str | None = None

    def describe(self) -> str:
        """Readable form, e.g. ``ttft_p95 rises >= 1.5x``."""
        subject = f"{self.signal} / {self.over}" if self.over else self.signal
        text = SHAPES[self.shape].describe(self)
        if self.held is not None:
            text += f" for {self.held:.0%} of the window"
        return f"{subject} {text}"

    def needs(self) -> tuple[str, ...]:
        """The signals this condition reads."""
        return SHAPES[self.shape].needs(self)


@dataclass(frozen=True)
class Signature:
    all: tuple[Condition, ...]
    any: tuple[Condition, ...] = ()
    none: tuple[Condition, ...] = ()
    supporting: tuple[Condition, ...] = ()
    onset: str | None = None
    explains: tuple[str, ...] = ()
    max_confidence: float = 1.0
    # A state abnormal on its own (no baseline needed): reported, at lower confidence, when no
    # change point tells when the pattern began.
    absolute: tuple[Condition, ...] = ()
    # Signals whose series must exist on a scope for the pattern to be judged there: what
    # measures the cause itself (a GPU's memory for a GPU-memory cause). Without them the
    # pattern is undecided, whatever its symptoms' conditions say.
    requires: tuple[str, ...] = ()
    # Where ``requires`` has no series on a scope: the signature judged there instead, from
    # weaker evidence of the same cause (node-exporter's host-wide OOM kills where
    # kube-state-metrics does not say which container), with its own ``requires``, conditions
    # and lower ``max_confidence``; its ``onset`` and ``explains`` are this one's unless given.
    otherwise: Signature | None = None

    def groups(self) -> Iterator[tuple[str, tuple[Condition, ...]]]:
        """The groups a change is judged by (``absolute`` apart)."""
        yield from (
            ("all", self.all),
            ("any", self.any),
            ("none", self.none),
            ("supporting", self.supporting),
        )

    def conditions(self) -> Iterator[Condition]:
        """Every condition, ``otherwise``'s included."""
        for _, conds in self.groups():
            yield from conds
        yield from self.absolute
        if self.otherwise is not None:
            yield from self.otherwise.conditions()

    def judged_on(self, has: Callable[[str], bool]) -> Signature:
        """The signature a scope is judged by: this one, or ``otherwise`` where a signal this
        one requires has no series (``has``: whether the scope has a signal's) and every one
        ``otherwise`` requires has."""
        other = self.otherwise
        if other is None or all(has(n) for n in self.requires):
            return self
        return other if all(has(n) for n in other.requires) else self

    def bound(self) -> dict[str, Condition]:
        """Alert parameter name -> the condition that holds its value."""
        return {c.param: c for c in self.conditions() if c.param}

    def lacking(self, gaps: Mapping[str, str]) -> dict[str, str]:
        """Of the signals ``gaps`` says an engine lacks (name -> why), those this signature
        cannot be judged without: any of its required conditions', or every alternative's."""

        def needed(cond: Condition) -> dict[str, str]:
            return {n: gaps[n] for n in cond.needs() if n in gaps}

        out: dict[str, str] = {}
        for cond in self.all:
            out.update(needed(cond))
        alternatives = [needed(c) for c in self.any]
        if alternatives and all(alternatives):
            for found in alternatives:
                out.update(found)
        return out


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    floor: str
    summary: str
    description: str
    # Every parameter's value: those bound to a signature condition and the alert's own.
    params: Mapping[str, float] = field(default_factory=dict)
    # The alert's own parameters (not a signature threshold), each with why it stands apart.
    why: Mapping[str, str] = field(default_factory=dict)
    keep_firing_for: str | None = None
    # Where an ``offset`` comparison finds no series (a new model), compare this far back.
    fallback: str | None = None


@dataclass(frozen=True)
class Playbook:
    id: str
    title: str
    kind: str
    chapter: str
    severity: str
    symptom: str
    cause: str
    fix: tuple[str, ...]
    guardrail: tuple[str, ...]
    evidence: tuple[str, ...]
    seed_symptoms: tuple[str, ...]
    seed_scenario: str | None
    path: Path
    impact: str | None = None
    relates_to: tuple[str, ...] = ()
    signature: Signature | None = None
    alert: Alert | None = None
    # The fix's levers in ``catalog.levers``' grammar (what ``what-if`` replays).
    levers: tuple[str, ...] = ()

    @property
    def detectable(self) -> bool:
        return self.kind == "detectable"

    @property
    def chapter_title(self) -> str:
        return CHAPTERS[self.chapter]

    def explains(self, other: str | None) -> bool:
        """Whether a finding of this playbook accounts for ``other``'s symptoms (its
        signature's ``explains``)."""
        return self.signature is not None and other in self.signature.explains
