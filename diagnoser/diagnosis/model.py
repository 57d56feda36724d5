"""A diagnosis, typed: what every renderer (text, Markdown, HTML, JSON, the chat message)
reads. ``to_json`` is the JSON contract other tools rely on (``docs/commands/diagnose.md``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from diagnoser.diagnosis.health import Health, Sli
from diagnoser.diagnosis.lookback import Reach
from diagnoser.diagnosis.match import ConditionResult, Match, ScopeData
from diagnoser.diagnosis.rows import findings_frame, series_frame
from diagnoser.diagnosis.window import Window
from diagnoser.metrics import engines
from diagnoser.metrics.family import PROVIDERS
from diagnoser.plumbing.durations import iso
from diagnoser.plumbing.finite import finite
from diagnoser.site import Site

if TYPE_CHECKING:
    import pandas as pd

Scope = dict[str, str]
ScopeKey = tuple[tuple[str, str], ...]


def covers(scope: Scope, finding: Scope) -> bool:
    """Whether a finding's scope lies within ``scope`` (a target's, within its model's)."""
    return all(finding.get(k) == v for k, v in scope.items())


def scope_key(scope: Scope) -> ScopeKey:
    return tuple(sorted(scope.items()))


class ByScope:
    """Matches found by their scope without a scan of them all: those of one scope, and those
    that lie within one (``covers``: a model's own, and its targets'). A fleet of thousands of
    models has hundreds of thousands of verdicts, and a scan of them for each model made the
    diagnosis quadratic in the number of models (2,000 took minutes)."""

    def __init__(self, matches: Iterable[Match]):
        self.matches = list(matches)
        self._of: dict[ScopeKey, list[Match]] = {}
        for m in self.matches:
            self._of.setdefault(scope_key(m.scope), []).append(m)
        # By the names of a scope's labels, then by their values: the matches within it.
        self._within: dict[tuple[str, ...], dict[tuple[str, ...], list[Match]]] = {}

    def of(self, scope: Scope) -> list[Match]:
        """The matches whose scope is ``scope``, in their order."""
        return self._of.get(scope_key(scope), [])

    def within(self, scope: Scope) -> list[Match]:
        """The matches whose scope lies within ``scope`` (``covers``), in their order."""
        names = tuple(sorted(scope))
        index = self._within.get(names)
        if index is None:
            index = {}
            for m in self.matches:
                if all(k in m.scope for k in names):
                    index.setdefault(tuple(m.scope[k] for k in names), []).append(m)
            self._within[names] = index
        return index.get(tuple(scope[k] for k in names), [])


def _indexed(
    cache: dict[str, tuple[Sequence[Any], int, Any]], name: str, items: Sequence[Any], make: Any
) -> Any:
    """``make(items)``, kept while ``items`` is the same list of the same length."""
    held = cache.get(name)
    if held is None or held[0] is not items or held[1] != len(items):
        held = (items, len(items), make(items))
        cache[name] = held
    return held[2]


@dataclass
class Diagnosis:
    window: Window
    site: Site
    findings: list[Match] = field(default_factory=list)
    # Findings whose pattern stopped holding inside the window (``Match.end``), most recent
    # end first: after every current finding, never the likely cause.
    resolved: list[Match] = field(default_factory=list)
    # Incidents that ended before the window began (no finding of the window): what a report
    # may say ended just before it.
    ended_before: list[Match] = field(default_factory=list)
    undecided: list[Match] = field(default_factory=list)
    checked: list[Match] = field(default_factory=list)
    idle: list[Scope] = field(default_factory=list)
    # Scopes with traffic, but never above the site's traffic floor in the window: no alert
    # fires for them, yet they are diagnosed.
    below_floor: list[Scope] = field(default_factory=list)
    scopes: list[Scope] = field(default_factory=list)
    queries: int = 0
    query_seconds: float = 0.0
    # --recorded-rules: the signals read from the site's recording rules, or why none was.
    recorded: int = 0
    not_recorded: str | None = None
    data: dict[tuple[tuple[str, str], ...], ScopeData] = field(default_factory=dict)
    # Each model's state, in the order of ``scopes``.
    health: list[Health] = field(default_factory=list)
    # The scopes judged again from further back, and how far back the data went.
    looked_back: list[Scope] = field(default_factory=list)
    reach: Reach | None = None
    # What the source warned about in its answers (a partial answer from Thanos or Mimir).
    warnings: list[str] = field(default_factory=list)
    # diagnose --what-if: each finding's what-if, by playbook id and scope (the JSON object
    # ``what_if`` of the finding, or None for a fix without levers); None when not asked for.
    what_if: dict[tuple[str, ScopeKey], dict[str, Any] | None] | None = None
    # Indexes of the lists above by scope, made when first asked for (see ``ByScope``).
    _indexes: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def data_for(self, m: Match) -> ScopeData | None:
        return self.data.get(tuple(sorted(m.scope.items())))

    def engine_gap(self, m: Match) -> str:
        """Why an undecided playbook cannot be decided on its scope's engine ("" when the
        series are missing for another reason)."""
        data = self.data_for(m)
        if data is None or not m.missing or not all(s in data.gaps for s in m.missing):
            return ""
        return m.reason

    def runbook(self, m: Match) -> str:
        return self.site.runbook(m.playbook.id)

    def unit(self, signal: str) -> str:
        return self.site.vocabulary[signal].unit if signal in self.site.vocabulary else ""

    def evidence_text(self, r: ConditionResult) -> str:
        return r.text(self.unit(r.condition.signal))

    def ruled_out(self) -> list[Match]:
        return [m for m in self.checked if m.status == "ruled_out"]

    def within(self, scope: Scope) -> Diagnosis:
        """This diagnosis as one of ``scope`` alone would read: every list kept to what lies
        within it (``covers``: a model's own verdicts and its targets'). The window, the
        queries and the warnings stay the whole diagnosis's. Scopes are diagnosed one by one,
        so the findings of a model are those a diagnosis scoped to it names."""

        def kept(matches: list[Match]) -> list[Match]:
            return [m for m in matches if covers(scope, m.scope)]

        return replace(
            self,
            findings=kept(self.findings),
            resolved=kept(self.resolved),
            ended_before=kept(self.ended_before),
            undecided=kept(self.undecided),
            checked=kept(self.checked),
            idle=[s for s in self.idle if covers(scope, s)],
            below_floor=[s for s in self.below_floor if covers(scope, s)],
            scopes=[s for s in self.scopes if covers(scope, s)],
            data={k: v for k, v in self.data.items() if covers(scope, dict(k))},
            health=[h for h in self.health if covers(scope, h.scope)],
            looked_back=[s for s in self.looked_back if covers(scope, s)],
            what_if=None
            if self.what_if is None
            else {k: v for k, v in self.what_if.items() if covers(scope, dict(k[1]))},
            _indexes={},
        )

    def findings_for(self, scope: Scope) -> list[Match]:
        """The findings about a model scope: its own, and those of its targets."""
        return _indexed(self._indexes, "findings", self.findings, ByScope).within(scope)  # type: ignore[no-any-return]

    def resolved_for(self, scope: Scope) -> list[Match]:
        """The findings about a model scope that ended in the window: its own, and those of
        its targets (none of them a cause of the scope's state now)."""
        return _indexed(self._indexes, "resolved", self.resolved, ByScope).within(scope)  # type: ignore[no-any-return]

    def nearest(self, scope: Scope, most: int = 3) -> list[tuple[Match, ConditionResult | None]]:
        """The playbooks that came closest for a scope no playbook explains, each with the
        first required condition that failed (by the share of required conditions held)."""
        health = _indexed(
            self._indexes,
            "health",
            self.health,
            lambda hs: {scope_key(h.scope): h for h in reversed(hs)},
        ).get(scope_key(scope))
        if health is not None and (
            health.stopped_at is not None
            or health.targets_gone_at is not None
            or (health.targets_down and health.targets_down == health.targets_total)
        ):
            return []  # no traffic, or no server up: no pattern comes near or far
        best: dict[str, tuple[float, Match, ConditionResult | None]] = {}
        checked = _indexed(self._indexes, "checked", self.checked, ByScope).of(scope)
        undecided = _indexed(self._indexes, "undecided", self.undecided, ByScope).of(scope)
        for m in (*checked, *undecided):
            required = [r for r in m.results if r.group in ("all", "absolute")]
            held = sum(1 for r in required if r.verdict.holds)
            score = held / len(required) if required else 0.0
            failed = next((r for r in required if r.verdict.holds is False), None)
            if m.status == "ruled_out":
                score -= 0.01  # a look-alike ruled out is less near than one short of a match
            pid = m.playbook.id
            if pid not in best or score > best[pid][0]:
                best[pid] = (score, m, failed)
        ranked = sorted(best.values(), key=lambda x: (-x[0], x[1].playbook.id))
        return [(m, failed) for score, m, failed in ranked[:most] if score > 0]

    def for_alert(self, playbook: str | None) -> list[Match]:
        """The current findings as an alert's record ranks them (one that ended in the window
        is no cause; ``resolved_of`` finds the alert's own among those): the alert's own
        playbook first when the diagnosis confirms it, behind the cause that explains it if
        one was found (the cause first, its symptom second). When the alert's playbook is not
        among the findings but one found explains it (a replica's imbalance explains the
        model's queue), that cause comes first. The rest in the diagnosis's order."""
        ranked = list(self.findings)
        own = next((m for m in ranked if m.playbook.id == playbook), None)
        if own is None:
            cause = next((m for m in ranked if m.playbook.explains(playbook)), None)
            if cause is None:
                return ranked
            return [cause] + [m for m in ranked if m is not cause]
        cause = next((m for m in ranked if m.playbook.id == own.explained_by), None)
        lead = [cause, own] if cause is not None else [own]
        return lead + [m for m in ranked if all(m is not x for x in lead)]

    def resolved_of(self, playbook: str | None) -> Match | None:
        """The alert's own playbook among the findings that ended in the window (the most
        recent end first), when it is not also a current finding."""
        if playbook is None or any(m.playbook.id == playbook for m in self.findings):
            return None
        return next((m for m in self.resolved if m.playbook.id == playbook), None)

    def to_frame(self) -> pd.DataFrame:
        """The series this diagnosis read, long format, for pandas: one row per point, with
        the scope's labels, ``signal``, ``unit``, ``class``, ``period`` (window, baseline,
        before), ``time`` (UTC), ``value`` and ``evidence_for`` (the findings it is evidence
        for, comma separated). Needs pandas (``servediag[notebook]``)."""
        return series_frame(self)

    def findings_frame(self) -> pd.DataFrame:
        """One row per finding and condition of its evidence, likely cause first, with the
        numbers the text report prints (see ``diagnosis.rows.finding_rows``)."""
        return findings_frame(self)

    def to_json(self) -> dict[str, Any]:
        """The JSON contract (``diagnose --format json``) as a dict."""
        return to_json(self)

    def providers(self, m: Match) -> list[str]:
        """What would provide the missing series (every version's vLLM is there already, and
        Prometheus's own ``up``; on SGLang, nothing provides the series it does not export)."""
        vocab, always = self.site.vocabulary, PROVIDERS["prometheus"]
        data = self.data.get(tuple(sorted(m.scope.items())))
        if data is not None and data.gaps:
            engine = engines.get(data.engine)
            found = {
                p
                for s in m.missing
                if s not in data.gaps
                for p in vocab[s].provided_by_on(engine.name)
            }
            return sorted(p for p in found if p not in (engine.provided_by, always))
        found = {p for s in m.missing for p in vocab[s].provided_by()}
        return sorted(p for p in found if p not in ("vLLM (all V1 versions)", always))


def evidence_json(r: ConditionResult) -> dict[str, Any]:
    return {
        "signal": r.condition.signal,
        "over": r.condition.over,
        "condition": r.condition.describe(),
        "group": r.group,
        "holds": r.verdict.holds,
        **r.numbers(),
        **({"read_as": r.read_as} if r.read_as else {}),
    }


def sli_json(s: Sli) -> dict[str, Any]:
    return {
        "good_share": s.good if s.good is None else round(s.good, 6),
        "good_share_now": s.now if s.now is None else round(s.now, 6),
        "objective": s.objective,
        "threshold_seconds": s.threshold,
        "read_at_seconds": list(s.read_at),
        "burn_rate": None if s.burn is None else round(s.burn, 3),
    }


def health_json(d: Diagnosis, h: Health) -> dict[str, Any]:
    def r(v: float | None, n: int = 6) -> float | None:
        return None if v is None else round(v, n)

    out: dict[str, Any] = {
        "scope": h.scope,
        "verdict": h.verdict,
        "reasons": h.reasons,
        "notes": h.notes,
        "request_rate": r(h.request_rate, 4),
        "error_share": r(h.error_share),
        "http_5xx_share": r(h.http_5xx_share),
        "finished_error_share": r(h.finished_error_share),
        "finished_abort_share": r(h.finished_abort_share),
        "slo": {s.name: sli_json(s) for s in h.slis},
        "targets": {
            "total": h.targets_total,
            "down": h.targets_down,
            "down_share": r(h.down_share, 4),
            "down_since": iso(h.down_since),
            "gone_at": iso(h.targets_gone_at),
        },
        "restarts": h.restarts,
        "traffic_stopped_at": iso(h.stopped_at),
        "present": None
        if h.present is None
        else {"start": iso(h.present[0]), "end": iso(h.present[1])},
    }
    ended = [m.playbook.id for m in d.resolved_for(h.scope)]
    if ended:  # what ended in the window: no cause of the state at its end
        out["resolved"] = list(dict.fromkeys(ended))
    if h.verdict == "unhealthy" and not d.findings_for(h.scope):
        out["cause"] = "unknown"
        out["nearest"] = [
            {
                "id": m.playbook.id,
                "failed": failed.condition.describe() if failed else m.reason,
                "evidence": d.evidence_text(failed) if failed else None,
            }
            for m, failed in d.nearest(h.scope)
        ]
    return out


def onset_before(d: Diagnosis, m: Match) -> float | None:
    """Seconds the onset lies before the window's start (None when inside, or unknown)."""
    if m.onset is None or m.onset >= d.window.start:
        return None
    return round(d.window.start - m.onset, 1)


def duration(m: Match) -> float | None:
    """Seconds from the onset to the end of a finding that ended (None while it holds, or
    when its onset is unknown)."""
    if m.onset is None or m.end is None:
        return None
    return round(m.end - m.onset, 1)


def finding_json(d: Diagnosis, m: Match) -> dict[str, Any]:
    pb = m.playbook
    return {
        "id": pb.id,
        "title": pb.title,
        "confidence": m.confidence,
        "severity": pb.severity,
        "scope": m.scope,
        "onset": iso(m.onset),
        "onset_before_window_seconds": onset_before(d, m),
        "resolved_at": iso(m.end),
        "duration_seconds": duration(m),
        "basis": m.basis,
        "evidence": [evidence_json(r) for r in m.shown()],
        "cause": pb.cause,
        "fix": list(pb.fix),
        "guardrail": list(pb.guardrail),
        "runbook": d.runbook(m),
        "explained_by": m.explained_by,
        "caveats": m.caveats,
        "hints": [h.id for h in m.hints],
        **({} if d.what_if is None else {"what_if": what_if_of(d, m)}),
    }


def what_if_of(d: Diagnosis, m: Match) -> dict[str, Any] | None:
    """The finding's what-if (diagnose --what-if), None where its fix has no levers."""
    return None if d.what_if is None else d.what_if.get((m.playbook.id, scope_key(m.scope)))


def to_json(d: Diagnosis) -> dict[str, Any]:
    """The JSON contract. A number that is NaN or infinite (a series can hold either) is
    written as null, and ``non_finite`` lists each such field with what it was."""
    out, non_finite = finite(_to_json(d))
    out["non_finite"] = non_finite
    return dict(out)


def _to_json(d: Diagnosis) -> dict[str, Any]:
    w = d.window
    return {
        "window": {
            "start": iso(w.start),
            "end": iso(w.end),
            "step_seconds": w.step,
            "rate_window": w.rate_window,
        },
        "baseline": {"start": iso(w.baseline_start), "end": iso(w.baseline_end)},
        "scopes": d.scopes,
        "health": [health_json(d, h) for h in d.health],
        "idle": d.idle,
        "below_traffic_floor": d.below_floor,
        "findings": [finding_json(d, m) for m in d.findings],
        "resolved": [finding_json(d, m) for m in d.resolved],
        "ended_before_window": [
            {
                "id": m.playbook.id,
                "scope": m.scope,
                "onset": iso(m.onset),
                "resolved_at": iso(m.end),
            }
            for m in d.ended_before
        ],
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
        "lookback": None
        if d.reach is None
        else {
            "requested_seconds": d.reach.requested,
            "start": iso(d.reach.start),
            "first_sample": iso(d.reach.first_sample),
            "scopes": d.looked_back,
        },
        "stats": {
            "queries": d.queries,
            "query_seconds": round(d.query_seconds, 3),
            "recorded_signals": d.recorded,
            "not_recorded": d.not_recorded,
            "traffic_floor_rps": d.site.config.traffic_floor_rps,
            "warnings": d.warnings,
        },
    }
