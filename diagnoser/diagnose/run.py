"""``diagnose``: fetch the signals the playbooks need, match every playbook per scope, rank.

Models (with the site's group labels) are diagnosed one by one; target-level playbooks (a
server that never starts) are diagnosed per vLLM scrape target.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from diagnoser.catalog import Playbook
from diagnoser.core.source import MetricSource
from diagnoser.diagnose.fetch import fetch, needed_signals
from diagnoser.diagnose.match import Match, ScopeData, evaluate
from diagnoser.diagnose.model import Diagnosis
from diagnoser.diagnose.rank import rank
from diagnoser.diagnose.window import Window
from diagnoser.site import Site

IDLE_RPS = 0.01  # finished requests per second below which a model counts as idle


def _target_level(pb: Playbook, site: Site) -> bool:
    sig = pb.signature
    return sig is not None and all(site.vocabulary[c.signal].target_level for c in sig.all)


def peak_rate(data: ScopeData, span: tuple[float, float]) -> float:
    rate = data.series.get("request_rate")
    if rate is None:
        return 0.0
    inside = np.where((rate.t >= span[0]) & (rate.t <= span[1]), rate.v, np.nan)
    return float(np.nanmax(inside, initial=0.0))


def diagnose(
    source: MetricSource,
    site: Site,
    window: Window,
    matchers: Sequence[str] = (),
    workers: int = 8,
) -> Diagnosis:
    catalog = site.catalog
    fetched = fetch(source, site, needed_signals(site), window, matchers, workers)
    result = Diagnosis(window, site, queries=fetched.queries, query_seconds=fetched.query_seconds)
    span, base = window.span, window.baseline
    matches: list[Match] = []
    for _, data in sorted(fetched.models.items()):
        result.scopes.append(data.scope)
        result.data[data.key] = data
        peak = peak_rate(data, span)
        if peak <= IDLE_RPS:
            result.idle.append(data.scope)
            continue
        if peak <= site.config.traffic_floor_rps:
            result.below_floor.append(data.scope)
        for pb in catalog.detectable():
            if not _target_level(pb, site):
                matches.append(evaluate(pb, data, span, base, window.step))
    for _, data in sorted(fetched.targets.items()):
        result.data[data.key] = data
        for pb in catalog.detectable():
            if _target_level(pb, site):
                m = evaluate(pb, data, span, base, window.step)
                if m.status in ("matched", "contested"):
                    matches.append(m)
    result.findings = rank(matches, catalog.advisory())
    result.undecided = [m for m in matches if m.status == "undecided"]
    result.checked = [m for m in matches if m.status in ("not_matched", "ruled_out")]
    return result
