"""A diagnosis, typed: what every renderer (text, Markdown, HTML, JSON, the chat message)
reads. ``to_json`` is the JSON contract other tools rely on (see the README)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from diagnoser.diagnose.match import ConditionResult, Match, ScopeData
from diagnoser.diagnose.window import Window
from diagnoser.site import Site

Scope = dict[str, str]


@dataclass
class Diagnosis:
    window: Window
    site: Site
    findings: list[Match] = field(default_factory=list)
    undecided: list[Match] = field(default_factory=list)
    checked: list[Match] = field(default_factory=list)
    idle: list[Scope] = field(default_factory=list)
    # Scopes with traffic, but never above the site's traffic floor in the window: no alert
    # fires for them, yet they are diagnosed.
    below_floor: list[Scope] = field(default_factory=list)
    scopes: list[Scope] = field(default_factory=list)
    queries: int = 0
    query_seconds: float = 0.0
    data: dict[tuple[tuple[str, str], ...], ScopeData] = field(default_factory=dict)

    def data_for(self, m: Match) -> ScopeData | None:
        return self.data.get(tuple(sorted(m.scope.items())))

    def runbook(self, m: Match) -> str:
        return self.site.runbook(m.playbook.id)

    def unit(self, signal: str) -> str:
        return self.site.vocabulary[signal].unit if signal in self.site.vocabulary else ""

    def evidence_text(self, r: ConditionResult) -> str:
        return r.text(self.unit(r.condition.signal))

    def ruled_out(self) -> list[Match]:
        return [m for m in self.checked if m.status == "ruled_out"]

    def providers(self, m: Match) -> list[str]:
        """What would provide the missing series (every version's vLLM is there already)."""
        vocab = self.site.vocabulary
        found = {p for s in m.missing for p in vocab[s].provided_by()}
        return sorted(p for p in found if p != "vLLM (all V1 versions)")


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def evidence_json(r: ConditionResult) -> dict[str, Any]:
    return {
        "signal": r.condition.signal,
        "over": r.condition.over,
        "condition": r.condition.describe(),
        "group": r.group,
        "holds": r.verdict.holds,
        **r.numbers(),
    }


def finding_json(d: Diagnosis, m: Match) -> dict[str, Any]:
    pb = m.playbook
    return {
        "id": pb.id,
        "title": pb.title,
        "confidence": m.confidence,
        "severity": pb.severity,
        "scope": m.scope,
        "onset": iso(m.onset),
        "evidence": [evidence_json(r) for r in m.shown()],
        "cause": pb.cause,
        "fix": list(pb.fix),
        "guardrail": list(pb.guardrail),
        "runbook": d.runbook(m),
        "explained_by": m.explained_by,
        "caveats": m.caveats,
        "hints": [h.id for h in m.hints],
    }


def to_json(d: Diagnosis) -> dict[str, Any]:
    w = d.window
    return {
        "window": {"start": iso(w.start), "end": iso(w.end), "step_seconds": w.step},
        "baseline": {"start": iso(w.baseline_start), "end": iso(w.baseline_end)},
        "scopes": d.scopes,
        "idle": d.idle,
        "below_traffic_floor": d.below_floor,
        "findings": [finding_json(d, m) for m in d.findings],
        "undecided": [
            {
                "id": m.playbook.id,
                "scope": m.scope,
                "reason": m.reason,
                "missing": m.missing,
                "provided_by": d.providers(m),
            }
            for m in d.undecided
        ],
        "ruled_out": [
            {"id": m.playbook.id, "scope": m.scope, "reason": m.reason} for m in d.ruled_out()
        ],
        "stats": {
            "queries": d.queries,
            "query_seconds": round(d.query_seconds, 3),
            "traffic_floor_rps": d.site.config.traffic_floor_rps,
        },
    }
