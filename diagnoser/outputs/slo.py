"""Symptom rules: what users feel, paged on; the cause is left to ``diagnose`` (the webhook
posts it with the page).

- **SLO error ratios** for each SLI (availability, TTFT, ITL) over 5m, 30m, 1h, 2h, 6h, 1d and
  3d, per model, at each model's thresholds (``slo:`` in the site config).
- **Multiwindow, multi-burn-rate alerts** (the SRE workbook's table): page at 14.4x over 1h and
  5m and at 6x over 6h and 30m; ticket at 3x over 1d and 2h and at 1x over 3d and 6h. The
  latency SLIs add a ticket at 10x over 30m and 5m: a budget of 1% lets 40% of slow requests
  run 22 minutes before the 1h pair pages, and users feel them sooner.
- **The servers**: a target that served and is down, no target scraped at all, traffic that
  stopped, HTTP 5xx and engine errors.

Each alert carries ``severity``, ``symptom`` (its id, the name of its runbook page), ``slo``
where it has one, and no ``playbook``: the webhook diagnoses the model and names the cause.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diagnoser.metrics import engines
from diagnoser.metrics import promql as q
from diagnoser.metrics.signals.server import TARGET_MEMORY, targets_held_down
from diagnoser.metrics.signals.slo import error_ratio
from diagnoser.outputs import watch
from diagnoser.site import Site
from diagnoser.site.slo import Matcher, Objectives

WINDOWS = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
SLIS = ("availability", "ttft", "itl")


@dataclass(frozen=True)
class Burn:
    severity: str
    long: str
    short: str
    factor: float
    latency_only: bool = False


BURNS = (
    Burn("critical", "1h", "5m", 14.4),
    Burn("critical", "6h", "30m", 6.0),
    Burn("warning", "1d", "2h", 3.0),
    Burn("warning", "3d", "6h", 1.0),
    Burn("warning", "30m", "5m", 10.0, latency_only=True),
)
ALERT_NAMES = {
    "availability": "VllmAvailabilityBudgetBurn",
    "ttft": "VllmTtftBudgetBurn",
    "itl": "VllmItlBudgetBurn",
}
SLI_WORDS = {
    "availability": "of inference requests failed (HTTP 5xx or finished_reason error)",
    "ttft": "of requests waited longer than {threshold:g} s for their first token",
    "itl": "of output tokens came more than {threshold:g} s after the previous one",
}


@dataclass(frozen=True)
class Group:
    """Models that share objectives (or thresholds): the matchers that select them, and those
    of earlier groups they must not match (the first override that matches applies)."""

    objectives: Objectives
    match: tuple[Matcher, ...]
    exclude: tuple[tuple[Matcher, ...], ...]


def groups(site: Site) -> list[Group]:
    slo = site.config.slo
    out: list[Group] = []
    earlier: list[tuple[Matcher, ...]] = []
    for ov in slo.overrides:
        out.append(Group(ov.objectives, ov.match, tuple(earlier)))
        earlier.append(ov.match)
    out.append(Group(slo.default, (), tuple(earlier)))
    return out


def record_name(site: Site, sli: str, window: str) -> str:
    return f"{'_'.join(site.config.by)}:slo_{sli}:error_ratio_rate{window}"


def _restrict(site: Site, expr: str, group: Group, metric: str | None = None) -> str:
    """``expr`` for the group's models only: its matchers in, earlier groups' out."""
    on = ", ".join(site.config.by)
    for ex in group.exclude:
        sel = ", ".join(str(m) for m in ex)
        series = f"{metric}{{{sel}}}" if metric else q.serving(tuple(str(m) for m in ex))
        expr = f"({expr}) unless on ({on}) group by ({on}) ({series})"
    return expr


def all_down_name(site: Site) -> str:
    """The recorded 1/0 of each model: every one of its targets down (nothing can answer)."""
    return f"{'_'.join(site.config.by)}:slo_availability:all_down"


def _all_down(site: Site) -> str:
    """1 where every target that served the model (within the targets' memory) has been down
    for ``DOWN_HELD``, 0 where one is up or came up within it; no series for a model with no
    target."""
    scope = site.scope()
    down, total = targets_held_down(scope), site.vocabulary["targets_total"].render(scope)
    return f"({down}) == bool (({total}) > 0)"


def _with_downtime(site: Site, ratio: str, window: str) -> str:
    """The availability error ratio counting the time every target was down as unavailable:
    a dead server counts no failed request, yet nothing was served. Where no target series is
    recorded the requests' ratio stands alone; where no request was counted, the downtime."""
    down = f"avg_over_time({all_down_name(site)}[{window}])"
    return f"(1 - (1 - (({ratio}) or {down} * 0)) * (1 - {down})) or ({ratio})"


def recording_group(site: Site) -> dict[str, Any]:
    """Each SLI's error ratio over each window; latency SLIs once per threshold in use; the
    availability's counts the time every target of a model was down."""
    rules: list[dict[str, Any]] = [{"record": all_down_name(site), "expr": _all_down(site)}]
    by_threshold: dict[tuple[float, float], Group] = {}
    for g in groups(site):
        by_threshold.setdefault((g.objectives.ttft_seconds, g.objectives.itl_seconds), g)
    for sli in SLIS:
        for window in WINDOWS:
            name = record_name(site, sli, window)
            seen: list[tuple[float, float]] = []
            for g in groups(site):
                pair = (g.objectives.ttft_seconds, g.objectives.itl_seconds)
                if sli == "availability" and seen:
                    break
                if sli != "availability" and pair in seen:
                    continue
                seen.append(pair)
                scope = site.scope(window=window, matchers=tuple(str(m) for m in g.match))
                expr = error_ratio(sli, *pair)(scope)
                if sli == "availability":
                    expr = _with_downtime(site, expr, window)
                else:
                    others = [
                        x.match
                        for x in groups(site)
                        if (x.objectives.ttft_seconds, x.objectives.itl_seconds) != pair and x.match
                    ]
                    expr = _restrict(site, expr, Group(g.objectives, g.match, tuple(others)))
                rules.append({"record": name, "expr": expr})
    for sli in SLIS:
        for g in groups(site):
            scope = site.scope(matchers=tuple(str(m) for m in g.match))
            models = q.agg("group", scope, q.serving(scope.matchers))
            expr = _restrict(site, f"{models} * 0 + {g.objectives.objective(sli):g}", g)
            rules.append({"record": objective_name(site, sli), "expr": expr})
    return {"name": "servediag.slo", "rules": rules}


def objective_name(site: Site, sli: str) -> str:
    """The recorded objective of each model (for dashboards: budget left, burn rates)."""
    return f"{'_'.join(site.config.by)}:slo_{sli}:objective"


def _pct(share: float) -> str:
    return f"{share * 100:.4g}%"


def burn_alerts(site: Site) -> list[dict[str, Any]]:
    cfg = site.config
    on = ", ".join(cfg.by)
    floor = f"{site.vocabulary['request_rate'].record_name(cfg.by)} > {cfg.traffic_floor_rps:g}"
    days = cfg.slo.period / 86400
    cause = watch.cause_annotations(site)
    out = []
    for sli in SLIS:
        for g in groups(site):
            objective = g.objectives.objective(sli)
            budget = 1 - objective
            threshold = g.objectives.ttft_seconds if sli == "ttft" else g.objectives.itl_seconds
            sel = ", ".join(str(m) for m in g.match)
            for b in BURNS:
                if b.latency_only and sli == "availability":
                    continue
                long_rec = (
                    f"{record_name(site, sli, b.long)}{{{sel}}}"
                    if sel
                    else record_name(site, sli, b.long)
                )
                short_rec = (
                    f"{record_name(site, sli, b.short)}{{{sel}}}"
                    if sel
                    else record_name(site, sli, b.short)
                )
                limit = f"{b.factor * budget:.6g}"
                expr = f"{long_rec} > {limit} and on ({on}) {short_rec} > {limit}"
                expr = _restrict(site, expr, g, record_name(site, sli, b.long))
                served = floor
                if sli == "availability":
                    # A model whose every target is down serves nothing: no request to count
                    # is the outage itself, not a model too quiet to judge.
                    served = f"({floor} or {all_down_name(site)} == 1)"
                if sli == "availability" and b.severity == "critical":
                    expr = f"({expr})\nand on ({on}) ({_still_burning(site, b.short, limit)})"
                what = SLI_WORDS[sli].format(threshold=threshold)
                lasts = days / b.factor
                out.append(
                    {
                        "alert": ALERT_NAMES[sli],
                        "expr": f"({expr})\nand on ({on}) {served}",
                        # Pages, and the fast latency ticket, after 2m; slow tickets after 15m.
                        "for": "2m" if b.severity == "critical" or b.latency_only else "15m",
                        "labels": {
                            "severity": b.severity,
                            "symptom": f"slo-{sli}",
                            "slo": sli,
                            "long_window": b.long,
                            "short_window": b.short,
                        },
                        "annotations": {
                            "summary": f"The {sli_title(sli)} SLO is burning its error budget "
                            f"{b.factor:g} times too fast.",
                            "description": (
                                "{{ $labels.model_name }}: {{ $value | humanizePercentage }} "
                                f"{what} over the last {b.long} (and over {b.short}), "
                                f"{b.factor:g} times the {_pct(budget)} the {_pct(objective)} "
                                f"SLO allows: at this rate the {days:g}-day error budget lasts "
                                f"{lasts:.3g} days. The webhook's message names the cause "
                                "diagnose found; run `diagnose --model` for the evidence."
                            ),
                            "runbook_url": site.runbook(f"slo-{sli}"),
                            **cause,
                        },
                    }
                )
    return out


def _still_burning(site: Site, short: str, limit: str) -> str:
    """Where the availability budget still burns now: every target of the model is down, or
    its requests alone fail beyond ``limit`` over the ``short`` window. The windows remember a
    downtime that has ended (a single replica's minute of restart keeps the 5m ratio up for
    five minutes, the 1h one for an hour): that is budget spent, counted by the tickets, and
    no reason to page someone once the server answers again. A server that stays down pages
    here (and as ``VllmTargetDown``); failing requests page as before."""
    scope = site.scope(window=short)
    requests = error_ratio("availability", 0.0, 0.0)(scope)
    return f"{all_down_name(site)} == 1 or ({requests}) > {limit}"


def sli_title(sli: str) -> str:
    return {"availability": "availability", "ttft": "TTFT", "itl": "ITL"}[sli]


def server_alerts(site: Site) -> list[dict[str, Any]]:
    """Targets down or absent, traffic that stopped, HTTP and engine errors."""
    cfg = site.config
    on = ", ".join(cfg.by)
    keys = ", ".join(("job", "instance", *cfg.group_labels))
    scope = site.scope()
    up = q.up(scope)
    targets = " or ".join(f"{{{cfg.targets(e.name)}}}" for e in engines.all_engines())
    owned = q.model_map(scope, TARGET_MEMORY)
    rate = site.vocabulary["request_rate"].record_name(cfg.by)
    down_n = site.vocabulary["targets_down"].record_name(cfg.by)
    total_n = site.vocabulary["targets_total"].record_name(cfg.by)
    served = f"max_over_time({rate}[{TARGET_MEMORY}]) > 0"
    target_down = f"({up} == 0) * on ({keys}) group_left (model_name) {owned}"
    last = f"{down_n} >= {total_n}"
    http_rate = site.vocabulary["http_request_rate"].record_name(cfg.by)
    floor = cfg.traffic_floor_rps
    cause = watch.cause_annotations(site)

    def rule(
        alert: str,
        expr: str,
        for_: str,
        severity: str,
        symptom: str,
        summary: str,
        text: str,
        of_a_model: bool = True,
    ) -> dict[str, Any]:
        return {
            "alert": alert,
            "expr": expr,
            "for": for_,
            "labels": {"severity": severity, "symptom": symptom},
            "annotations": {
                "summary": summary,
                "description": text,
                "runbook_url": site.runbook(symptom),
                # The cause servediag watch names for the alert's model (absent() has none).
                **(cause if of_a_model else {}),
            },
        }

    return [
        rule(
            "VllmTargetDown",
            f"({target_down})\nand on ({on}) ({last})\nand on ({on}) {served}",
            "2m",
            "critical",
            "target-down",
            "The last serving vLLM target of a model is down.",
            "{{ $labels.model_name }}: {{ $labels.instance }} is down (its scrape fails) and "
            "no other target of the model is up: the model is not served. A dead process "
            "reports nothing, so look at the server's log and the node (out of GPU memory, a "
            "failed start after a config change, the node gone).",
        ),
        rule(
            "VllmTargetDown",
            f"({target_down})\nunless on ({on}) ({last})\nand on ({on}) {served}",
            "2m",
            "warning",
            "target-down",
            "A vLLM target that served a model is down while others still serve it.",
            "{{ $labels.model_name }}: {{ $labels.instance }} is down (its scrape fails); the "
            "model's other targets still serve, with less capacity. Look at the server's log "
            "and the node.",
        ),
        rule(
            "VllmTargetsAbsent",
            f"absent({up})",
            "5m",
            "critical",
            "targets-absent",
            f"No {' or '.join(e.title for e in engines.all_engines())} target is scraped at all.",
            f"Prometheus scrapes no target matching {targets}: every server is gone, or service "
            "discovery or the scrape config lost them. Nothing else can alert while this lasts.",
            of_a_model=False,
        ),
        rule(
            "VllmTrafficStopped",
            f"{rate} == 0\nand on ({on}) max_over_time({rate}[1h] offset 15m) > {floor:g}",
            "10m",
            "warning",
            "traffic-stopped",
            "A model that served requests an hour ago finishes none now.",
            "{{ $labels.model_name }}: no request finished in the last 10 minutes, after more "
            f"than {floor:g} a second within the hour before. The server may be fine and the "
            "traffic routed elsewhere (a gateway, a client, a DNS change), or it may no longer "
            "answer; check the gateway's error rate next to the targets' health.",
        ),
        rule(
            "VllmHttpErrors",
            f"{site.vocabulary['http_5xx_share'].record_name(cfg.by)} > 0.05\n"
            f"and on ({on}) {http_rate} > {floor:g}",
            "5m",
            "warning",
            "http-errors",
            "More than 5% of inference requests are answered with an HTTP 5xx.",
            "{{ $labels.model_name }}: {{ $value | humanizePercentage }} of inference requests "
            "(/v1/completions, /v1/chat/completions, /v1/responses, /v1/messages) are answered "
            "5xx. The availability SLO pages when it burns its budget; this is the ticket.",
        ),
        rule(
            "VllmEngineErrors",
            f"{site.vocabulary['finished_error_share'].record_name(cfg.by)} > 0.05\n"
            f"and on ({on}) {rate} > {floor:g}",
            "5m",
            "warning",
            "engine-errors",
            'More than 5% of requests end with finished_reason="error".',
            "{{ $labels.model_name }}: {{ $value | humanizePercentage }} of finished requests "
            'end with finished_reason="error": the engine failed them (a bad request that '
            "passed validation, an engine fault). The server's log names the exception.",
        ),
    ]


def alert_group(site: Site) -> dict[str, Any]:
    return {"name": "servediag.symptoms", "rules": [*server_alerts(site), *burn_alerts(site)]}
