"""``diagnose``: fetch the signals the playbooks need, match every playbook per scope, rank.

One ``query_range`` per signal covers the baseline and the window for every model at once
(so the cost grows with the number of signals and models, not instances); queries run
concurrently. Models are diagnosed one by one; target-level playbooks (a server that never
starts) are diagnosed per vLLM scrape target.
"""

from __future__ import annotations

import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from diagnoser.catalog import Catalog, Playbook
from diagnoser.config import RulesConfig
from diagnoser.matching import Match, ScopeData, evaluate, rank
from diagnoser.promql import Scope
from diagnoser.signals import SIGNALS, Signal
from diagnoser.source import MetricSource, Series

MAX_STEP_POINTS = 1500  # per series per query: plenty for shapes, far below Prometheus's cap
MIN_STEP = 15.0
TRAFFIC_FLOOR = 0.01  # finished requests per second below which a model counts as idle


@dataclass(frozen=True)
class Window:
    start: float
    end: float
    baseline_start: float
    baseline_end: float
    step: float
    rate_window: str

    @classmethod
    def plan(cls, since: float, end: float, baseline_offset: float | None = None) -> Window:
        """The window ``[end - since, end]`` and its baseline.

        By default the baseline is the period of the same length just before the window; with
        ``baseline_offset`` (e.g. one day) it is the window shifted back by that much.
        """
        start = end - since
        if baseline_offset:
            b_start, b_end = start - baseline_offset, end - baseline_offset
        else:
            b_start, b_end = start - since, start
        total = end - min(b_start, start)
        step = max(MIN_STEP, math.ceil(total / MAX_STEP_POINTS / MIN_STEP) * MIN_STEP)
        rate = max(300, int(4 * step))
        return cls(
            start, end, b_start, b_end, step, f"{rate // 60}m" if rate % 60 == 0 else f"{rate}s"
        )


@dataclass
class Diagnosis:
    window: Window
    findings: list[Match] = field(default_factory=list)
    undecided: list[Match] = field(default_factory=list)
    checked: list[Match] = field(default_factory=list)
    idle: list[dict[str, str]] = field(default_factory=list)
    scopes: list[dict[str, str]] = field(default_factory=list)
    queries: int = 0
    query_seconds: float = 0.0
    series: dict[tuple[str, ...], ScopeData] = field(default_factory=dict)


def needed_signals(catalog: Catalog) -> list[Signal]:
    names: set[str] = set()
    for pb in catalog.detectable():
        assert pb.signature is not None
        names |= set(pb.evidence)
        if pb.signature.onset:
            names.add(pb.signature.onset)
        for c in pb.signature.conditions():
            names.add(c.signal)
            if c.over:
                names.add(c.over)
            if c.shape == "tracks":
                names.add(str(c.value))
    names |= {"request_rate", "requests_running"}
    return [SIGNALS[n] for n in sorted(names)]


def _target_level(pb: Playbook) -> bool:
    sig = pb.signature
    return sig is not None and all(SIGNALS[c.signal].by == ("job", "instance") for c in sig.all)


def diagnose(
    source: MetricSource,
    catalog: Catalog,
    window: Window,
    matchers: tuple[str, ...] = (),
    cfg: RulesConfig | None = None,
    workers: int = 8,
) -> Diagnosis:
    cfg = cfg or RulesConfig()
    result = Diagnosis(window)
    signals = needed_signals(catalog)
    start = min(window.baseline_start, window.start)

    def fetch(sig: Signal) -> tuple[Signal, list[Series], float]:
        sel = (*matchers, cfg.vllm_targets) if sig.by == ("job", "instance") else matchers
        expr = sig.render(Scope(matchers=sel, by=sig.by, window=window.rate_window))
        t0 = time.perf_counter()
        series = source.query_range(expr, start, window.end, window.step)
        return sig, series, time.perf_counter() - t0

    with ThreadPoolExecutor(max_workers=workers) as pool:
        fetched = list(pool.map(fetch, signals))
    result.queries = len(fetched)
    result.query_seconds = sum(sec for _, _, sec in fetched)

    models: dict[str, ScopeData] = {}
    targets: dict[tuple[str, str], ScopeData] = {}
    for sig, series, _ in fetched:
        for s in series:
            if sig.by == ("job", "instance"):
                key = (s.labels.get("job", ""), s.labels.get("instance", ""))
                data = targets.setdefault(key, ScopeData({"job": key[0], "instance": key[1]}))
                data.series[sig.name] = s
                continue
            model = s.labels.get("model_name")
            if model is None:
                continue
            data = models.setdefault(model, ScopeData({"model_name": model}))
            bucket = s.labels.get("prompt_bucket")
            if bucket is not None:
                data.classes.setdefault(sig.name, {})[bucket] = s
            else:
                data.series[sig.name] = s

    span = (window.start, window.end)
    base = (window.baseline_start, window.baseline_end)
    advisory = catalog.advisory()
    matches: list[Match] = []
    for model, data in sorted(models.items()):
        result.scopes.append(data.scope)
        result.series[("model_name", model)] = data
        rate = data.series.get("request_rate")
        busy = (
            rate is not None
            and np.nanmax(
                np.where((rate.t >= span[0]) & (rate.t <= span[1]), rate.v, np.nan), initial=0.0
            )
            > TRAFFIC_FLOOR
        )
        if not busy:
            result.idle.append(data.scope)
            continue
        for pb in catalog.detectable():
            if not _target_level(pb):
                matches.append(evaluate(pb, data, span, base, window.step))
    for key, data in sorted(targets.items()):
        result.series[("target", *key)] = data
        for pb in catalog.detectable():
            if _target_level(pb):
                m = evaluate(pb, data, span, base, window.step)
                if m.status in ("matched", "contested"):
                    matches.append(m)
    result.findings = rank(matches, advisory)
    result.undecided = [m for m in matches if m.status == "undecided"]
    result.checked = [m for m in matches if m.status in ("not_matched", "ruled_out")]
    return result


def to_json(d: Diagnosis, cfg: RulesConfig | None = None) -> dict[str, Any]:
    cfg = cfg or RulesConfig()
    w = d.window

    def iso(t: float | None) -> str | None:
        if t is None:
            return None
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    def evidence(m: Match) -> list[dict[str, Any]]:
        out = []
        for r in m.results:
            if r.verdict.holds is None and not r.missing:
                continue
            out.append(
                {
                    "signal": r.condition.signal,
                    "over": r.condition.over,
                    "condition": r.condition.describe(),
                    "group": r.group,
                    "holds": r.verdict.holds,
                    **{k: _num(v) for k, v in r.verdict.numbers.items()},
                }
            )
        return out

    findings = []
    for m in d.findings:
        pb = m.playbook
        findings.append(
            {
                "id": pb.id,
                "title": pb.title,
                "confidence": m.confidence,
                "severity": pb.severity,
                "scope": m.scope,
                "onset": iso(m.periods.onset if m.periods else None),
                "evidence": evidence(m),
                "cause": pb.cause,
                "fix": list(pb.fix),
                "guardrail": list(pb.guardrail),
                "runbook": cfg.runbook_for(pb.id),
                "explained_by": m.explained_by,
                "caveats": m.caveats,
                "hints": [h.id for h in m.hints],
            }
        )
    return {
        "window": {"start": iso(w.start), "end": iso(w.end), "step_seconds": w.step},
        "baseline": {"start": iso(w.baseline_start), "end": iso(w.baseline_end)},
        "scopes": d.scopes,
        "idle": d.idle,
        "findings": findings,
        "undecided": [
            {
                "id": m.playbook.id,
                "scope": m.scope,
                "reason": m.reason,
                "missing": m.missing,
                "provided_by": _providers(m.missing),
            }
            for m in d.undecided
        ],
        "ruled_out": [
            {"id": m.playbook.id, "scope": m.scope, "reason": m.reason}
            for m in d.checked
            if m.status == "ruled_out"
        ],
        "stats": {"queries": d.queries, "query_seconds": round(d.query_seconds, 3)},
    }


def _providers(missing: list[str]) -> list[str]:
    """What would provide the missing series (every version's vLLM is there already)."""
    found = {p for s in missing for p in SIGNALS[s].provided_by()}
    return sorted(p for p in found if p != "vLLM (all V1 versions)")


def _num(v: float) -> float | None:
    return None if v is None or not math.isfinite(v) else round(float(v), 6)
