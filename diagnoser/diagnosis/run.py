"""``diagnose``: fetch the signals the playbooks need, judge each model's health, match every
playbook per scope, look further back where a sick model found no cause, rank.

Models (with the site's group labels) are diagnosed one by one; target-level playbooks (a
server that never starts) are diagnosed per vLLM scrape target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

import numpy as np

from diagnoser.catalog import Playbook
from diagnoser.diagnosis import platform, recorded
from diagnoser.diagnosis.ends import judge, unended
from diagnoser.diagnosis.fetch import (
    Fetched,
    fetch,
    needed_signals,
    scrape_interval,
    server_buckets,
    target_ups,
)
from diagnoser.diagnosis.health import Health, assess, flag, met_since, went_down
from diagnoser.diagnosis.lookback import fetch_lookback, reassess
from diagnoser.diagnosis.match import Match, ScopeData, evaluate_absolute
from diagnoser.diagnosis.model import ByScope, Diagnosis, ScopeKey, scope_key
from diagnoser.diagnosis.rank import ordered, rank
from diagnoser.diagnosis.targets import Served, Target, by_model
from diagnoser.diagnosis.window import Window
from diagnoser.plumbing.durations import parse_seconds
from diagnoser.plumbing.source import MetricSource, Series, in_time, one_operation, warnings_of
from diagnoser.site import Site

DEFAULT_LOOKBACK = 86400.0
FOUND = ("matched", "contested")


def _target_level(pb: Playbook, site: Site) -> bool:
    sig = pb.signature
    return sig is not None and all(site.vocabulary[c.signal].target_level for c in sig.all)


def diagnose(
    source: MetricSource,
    site: Site,
    window: Window,
    matchers: Sequence[str] = (),
    workers: int = 8,
    lookback: float = DEFAULT_LOOKBACK,
    recorded_rules: bool = False,
) -> Diagnosis:
    """``lookback``: how far before the window's end to look for an onset (0: not at all).
    ``recorded_rules``: read each signal from the site's recording rule where one covers the
    window (``recorded``).
    Every query shares one deadline (a Prometheus source's ``timeout``), and so does the
    analysis of what they answered: past it, ``SourceError``.

    Samples are whatever the source answered: values near 1e308 overflow to infinity when
    summed, and NaN stays NaN through arithmetic. Every judgement reads such a result as no
    value (``finite``), so numpy's warnings about them are not printed."""
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return _diagnose(source, site, window, matchers, workers, lookback, recorded_rules)


def _diagnose(
    source: MetricSource,
    site: Site,
    window: Window,
    matchers: Sequence[str],
    workers: int,
    lookback: float,
    recorded_rules: bool,
) -> Diagnosis:
    source = one_operation(source)
    rules_site = site
    site = site.with_buckets(server_buckets(source, site, window, matchers))
    window = window.fitted(scrape_interval(source, site, window))
    if recorded_rules:  # the rules' rates: read from them, the window's are theirs
        window = window.rated_at_least(parse_seconds(recorded.RULE_WINDOW))
    catalog = site.catalog
    model_level = [pb for pb in catalog.detectable() if not _target_level(pb, site)]
    signals = needed_signals(site)
    plan = None
    if recorded_rules:
        plan = recorded.plan(source, site, rules_site, signals, window, matchers)
    records = plan.records if plan else {}
    # The platform's signals whose exporters the store does not hold are not asked at all.
    unasked = platform.unasked(signals, platform.unscraped(source, window))
    fetched = fetch(
        source, site, signals, window, matchers, workers, max(lookback, 0.0), records, unasked
    )
    result = Diagnosis(
        window,
        site,
        queries=fetched.queries + 3 + (plan.queries if plan else 0),
        query_seconds=fetched.query_seconds + (plan.seconds if plan else 0.0),
        recorded=len(records),
        not_recorded=plan.reason if plan else None,
    )
    span, base = window.span, window.baseline
    matches: list[Match] = []
    judged: dict[tuple[tuple[str, str], ...], tuple[ScopeData, Health]] = {}
    down = [key for key, data in fetched.models.items() if went_down(data, span)]
    # The platform's signals the fetch read already (not from a rule), or knew had no series,
    # are not asked again.
    asked = {s.name for s in signals if not s.attributed and s.name not in records}
    before = {key: data.series for key, data in fetched.models.items()}
    said = (
        platform.read(source, site, window, down, matchers, workers, before, asked) if down else {}
    )
    result.queries += len(platform.still_to_ask(asked)) if down else 0
    for key, data in sorted(fetched.models.items()):
        in_time(source)
        why = platform.reason(said[key], span, data.series) if key in said else None
        health = assess(site, data, span, base, why)
        result.scopes.append(data.scope)
        result.health.append(health)
        result.data[data.key] = data
        if health.verdict == "idle":
            result.idle.append(data.scope)
            continue
        if health.peak_rate <= site.config.traffic_floor_rps and health.stopped_at is None:
            result.below_floor.append(data.scope)
        judged[data.key] = (data, health)
        for pb in model_level:
            matches.append(judge(pb, data, span, base, window.step))
    by = site.config.by
    heirs = _heirs(fetched, result.health, by)
    _inherit(source, site, window, workers, fetched, heirs, result, judged, matches)
    for target, data in sorted(fetched.targets.items()):
        in_time(source)
        result.data[data.key] = data
        owner = fetched.owners.get(target) or heirs.get(target)
        for pb in catalog.detectable():
            if _target_level(pb, site):
                m = judge(pb, data, span, base, window.step)
                if m.status in FOUND:
                    if owner is not None:  # the model it served last: a finding about it
                        m.scope = {**dict(zip(by, owner.model, strict=True)), **m.scope}
                    matches.append(m)
    _look_back(
        source,
        site,
        window,
        matchers,
        lookback,
        model_level,
        judged,
        matches,
        result,
        fetched.first_seen,
    )
    result.warnings = warnings_of(source)
    found = rank(matches, catalog.advisory())
    index, again = ByScope(found), {}
    for data, health in judged.values():
        if health.verdict == "unhealthy":
            since = partial(met_since, data, health)
            again.update(unended(index.within(data.scope), window.start, since))
    if again:
        found = ordered([again.get(id(m), m) for m in found])
    result.findings = [m for m in found if m.current]
    ended = sorted((m for m in found if not m.current), key=lambda m: -(m.end or 0.0))
    result.resolved = [m for m in ended if (m.end or 0.0) > window.start]
    result.ended_before = [m for m in ended if (m.end or 0.0) <= window.start]
    result.undecided = [m for m in matches if m.status == "undecided"]
    result.checked = [m for m in matches if m.status in ("not_matched", "ruled_out")]
    for health in result.health:
        found = result.findings_for(health.scope)
        if found:
            flag(health, f"a known pattern matched: {found[0].playbook.id}")
    return result


def _heirs(
    fetched: Fetched, health: Sequence[Health], by: tuple[str, ...]
) -> dict[tuple[str, str], Served]:
    """Targets that never served, each given to the model whose targets all left service
    discovery in its job: a rollout's new pods that never came up (one such model per job;
    with two the heir is anyone's guess, and stays unattributed)."""
    gone = [tuple(h.scope[k] for k in by) for h in health if h.targets_gone_at is not None]
    if not gone:
        return {}
    jobs: dict[str, set[tuple[str, ...]]] = {}
    for (job, _), owner in fetched.owners.items():
        if owner.model in gone:
            jobs.setdefault(job, set()).add(owner.model)
    out = {}
    for target in fetched.targets:
        models = jobs.get(target[0], set())
        if target not in fetched.owners and len(models) == 1:
            out[target] = Served(next(iter(models)), float("nan"))
    return out


def _inherit(
    source: MetricSource,
    site: Site,
    window: Window,
    workers: int,
    fetched: Fetched,
    heirs: dict[Target, Served],
    result: Diagnosis,
    judged: dict[tuple[tuple[str, str], ...], tuple[ScopeData, Health]],
    matches: list[Match],
) -> None:
    """Each model given targets that never served (``_heirs``) judged again with them as its
    own targets: the time none of them answers is unavailable, and the reason says why its
    new pods never came up, as their own pods' series say it (``platform.read_targets``).
    The playbooks that require a platform signal those pods' series gave are judged again
    with them (a liveness probe that kills the new pods while they load); the others stay
    judged on the model's own targets."""
    given: dict[tuple[str, ...], list[Target]] = {}
    for target, owner in heirs.items():
        given.setdefault(owner.model, []).append(target)
    ups, by = target_ups(fetched), site.config.by
    for model, targets in sorted(given.items()):
        key = tuple(sorted(zip(by, model, strict=True)))
        if key not in judged:  # idle: nothing it served to lose
            continue
        data, old = judged[key]
        owners = {**fetched.owners, **{t: heirs[t] for t in targets}}
        down, total = by_model(ups, owners)[model]
        series = {
            **data.series,
            "targets_down": Series(dict(data.scope), down.t, down.v),
            "targets_total": Series(dict(data.scope), total.t, total.v),
        }
        said, asked = platform.read_targets(source, site, window, targets, workers)
        result.queries += asked
        why = platform.reason(said, window.span) or old.platform
        new = assess(
            site, replace(data, series=series), window.span, window.baseline, why, len(targets)
        )
        result.health[result.health.index(old)] = new
        judged[key] = (data, new)
        heard = {n: platform.merged(data.series.get(n), s, np.fmax) for n, s in said.items()}
        with_pods = replace(data, series={**data.series, **heard})
        for i, m in enumerate(matches):
            sig = m.playbook.signature
            if m.scope == data.scope and sig is not None and set(sig.requires) & set(said):
                matches[i] = judge(m.playbook, with_pods, window.span, window.baseline, window.step)


def window_verdicts(matches: Sequence[Match], scope: dict[str, str]) -> dict[str, Match]:
    """Each playbook's verdict on the change within the window, for one scope."""
    return {m.playbook.id: m for m in matches if m.basis == "window" and m.scope == scope}


def _window_verdicts(found: ByScope, scope: dict[str, str]) -> dict[str, Match]:
    """``window_verdicts`` of the matches in ``found``, from its index."""
    return window_verdicts(found.of(scope), scope)


def _look_back(
    source: MetricSource,
    site: Site,
    window: Window,
    matchers: Sequence[str],
    lookback: float,
    playbooks: list[Playbook],
    judged: dict[tuple[tuple[str, str], ...], tuple[ScopeData, Health]],
    matches: list[Match],
    result: Diagnosis,
    first_seen: float | None,
) -> None:
    """Judge again, from a change before the window, each scope that no change within the
    window explains: a sick scope with no finding, or one whose findings have no onset (a
    state that was there all along, whose look-alikes could not be told apart without the
    change that began it). A scope no playbook explains is also checked for an abnormal
    absolute state."""
    candidates: list[tuple[ScopeData, list[Match]]] = []
    # The verdicts by scope, from one pass over them (not one per scope): the only matches
    # added below are the scope's own contradictions, which are neither found nor "window".
    found = ByScope(matches)
    for data, health in judged.values():
        in_time(source)
        own = [m for m in found.within(data.scope) if m.status in FOUND and m.current]
        # A pattern that ended in the window: its state over the window is the incident's.
        ended = {m.playbook.id for m in found.within(data.scope) if m.status in FOUND} - {
            m.playbook.id for m in own
        }
        if own and all(m.onset is not None for m in own) and health.verdict != "unhealthy":
            continue  # a change inside the window explains it, and the SLOs hold
        changes = _window_verdicts(found, data.scope)
        absolute: list[Match] = []
        if not own:
            absolute = [
                evaluate_absolute(pb, data, window.span, changes.get(pb.id))
                for pb in playbooks
                if pb.id not in ended
            ]
            for m in absolute:
                if m.status in FOUND:
                    flag(health, f"abnormal state of {m.playbook.id}")
        if health.stopped_at is not None:
            continue  # nothing served to judge a pattern by, now or just before
        if own or health.verdict == "unhealthy":
            candidates.append((data, absolute))
        else:  # healthy: say why an abnormal state was not taken for its cause
            matches += [m for m in absolute if m.contradiction is not None]
    if not candidates:
        return
    if lookback <= window.end - window.first:
        for _, absolute in candidates:
            matches += [m for m in absolute if m.status in (*FOUND, "ruled_out")]
        return
    fetched, reach, lb = fetch_lookback(
        source,
        site,
        window,
        lookback,
        [d.scope for d, _ in candidates],
        matchers,
        first_seen,
    )
    result.queries += fetched.queries
    result.query_seconds += fetched.query_seconds
    result.reach = reach
    # Each scope's verdicts by playbook, kept up to date as verdicts are replaced; those
    # replaced leave ``matches`` at the end, in one pass.
    found = ByScope(matches)
    mine: dict[tuple[str, ScopeKey], list[Match]] = {}
    for m in matches:
        mine.setdefault((m.playbook.id, scope_key(m.scope)), []).append(m)
    replaced: set[int] = set()
    for data, _ in candidates:
        in_time(source)
        coarse = fetched.models.get(tuple(data.scope.get(k, "") for k in site.config.by))
        verdicts = reassess(
            playbooks,
            coarse or ScopeData(data.scope),
            data,
            lb,
            window,
            _window_verdicts(found, data.scope),
        )
        for m in verdicts:
            first = mine.setdefault((m.playbook.id, scope_key(m.scope)), [])
            if m.basis == "lookback" and m.onset is not None and m.onset < window.start:
                # A change before the window: against what came before it, not against a
                # baseline that was already sick.
                replaced.update(id(x) for x in first)
                first.clear()
                first.append(m)
                matches.append(m)
            elif m.status in (*FOUND, "ruled_out") and not any(x.status in FOUND for x in first):
                first.append(m)
                matches.append(m)
        result.looked_back.append(data.scope)
    if replaced:
        matches[:] = [m for m in matches if id(m) not in replaced]
