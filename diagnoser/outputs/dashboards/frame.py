"""What every dashboard has around its panels: the variables, the playbook alerts as
annotations, links to the other servediag dashboards that keep the time range and the
variables, and a crosshair shared by every panel."""

from __future__ import annotations

import re
from collections.abc import Iterable

import attr
from grafanalib.core import (
    GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
    Annotations,
    Dashboard,
    DashboardLink,
    Template,
    Templating,
)

from diagnoser.metrics import buckets, engines
from diagnoser.outputs.dashboards.style import DS
from diagnoser.site import Site

TAG = "servediag"
# The generated playbook alerts firing now, for the chosen models.
FIRING_ALERTS = 'ALERTS{alertname=~"Vllm.*", alertstate="firing", model_name=~"$model_name"}'
# Playbook alerts as annotations on every time series: when each began and which playbook.
ALERT_ANNOTATION = {
    "datasource": DS,
    "enable": True,
    "expr": FIRING_ALERTS,
    "iconColor": "red",
    "name": "Playbook alerts",
    "step": "60s",
    "titleFormat": "{{alertname}}",
    "textFormat": "{{playbook}} ({{severity}}) on {{model_name}}",
    "tagKeys": "playbook,severity",
    "useValueForTime": False,
}
# Each finding of servediag watch at its onset, naming the playbook: Grafana reads the value
# as the event's time in milliseconds (useValueForTime), so every step of a finding that
# holds gives the same instant, drawn once. Empty where the service is not scraped. Drawn
# only on the time series of latency, KV cache and queue (``ONSET_READS``: ``filter``).
ONSET_ANNOTATION = {
    "datasource": DS,
    "enable": True,
    "expr": 'servediag_finding_onset_timestamp_seconds{model_name=~"$model_name"} * 1000',
    "iconColor": "orange",
    "name": "Onsets named by servediag watch",
    "step": "60s",
    "titleFormat": "{{playbook}}",
    "textFormat": "{{playbook}} ({{severity}}) began on {{model_name}}: servediag watch",
    "tagKeys": "playbook,severity",
    "useValueForTime": True,
}
# What a time series reads to carry the onsets: a latency histogram's buckets or sums (TTFT,
# ITL, end-to-end, queue, prefill, decode, KV transfer; not a count, which is a request rate),
# the KV cache's usage or its preemptions, or the requests waiting.
ONSET_READS = re.compile(
    r"(?:time_to_first_token|inter_token_latency|e2e_request_latency|queue_time|"
    r"time_per_output_token|request_(?:decode|prefill|inference)_time|per_stage_req_latency|"
    r"xfer_time)_seconds_(?:bucket|sum)\b"
    r"|kv_cache_usage_perc|gpu_cache_usage_perc|:token_usage\b|num_preemptions|num_retracted"
    r"|num_requests_waiting|num_queue_reqs"
)
BUILTIN_ANNOTATION = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}
# Every servediag dashboard, by its tag, opened on the same time range and variables.
LINKS = [
    DashboardLink(
        asDropdown=False,
        icon="dashboard",
        includeVars=True,
        keepTime=True,
        tags=[TAG],
        targetBlank=False,
        title="servediag",
        tooltip="Other servediag dashboards, same time range and variables",
        type="dashboards",
    )
]
ALL = {"selected": True, "text": ["All"], "value": ["$__all"]}


def custom(name: str, label: str, values: list[str], default: str) -> Template:
    """A dashboard variable with fixed choices."""
    return Template(name=name, label=label, type="custom", query=",".join(values), default=default)


# The serving engine (vLLM, SGLang): the job, model and instance choices are its servers'.
ENGINE_VARIABLE = Template(
    name="serving_engine",
    label="Engine",
    type="custom",
    query=",".join(engines.names()),
    includeAll=True,
    multi=True,
    default="$__all",
)
# Each engine's running gauge: one series per model and server.
SERVING = '__name__=~"(${serving_engine:regex}):num_(requests_running|running_reqs)"'


def variables(site: Site, extra: tuple[Template, ...] = ()) -> Templating:
    def chained(name: str, *matchers: str) -> Template:
        parts = ", ".join((SERVING, *site.config.selector, *matchers))
        template = Template(
            name=name,
            label=name,
            dataSource=DS,
            includeAll=True,
            multi=True,
            allValue=".*",
            refresh=2,
            query=f"label_values({{{parts}}}, {name})",
        )
        template._current = dict(ALL)  # every value until one is chosen
        return template

    def slo(name: str, label: str, bounds: tuple[float, ...], default: str) -> Template:
        return custom(name, label, [buckets.le_label(b) for b in bounds], default)

    cfg = site.config
    return Templating(
        list=[
            Template(name="datasource", label="Data source", type="datasource", query="prometheus"),
            ENGINE_VARIABLE,
            chained("job"),
            chained("model_name", 'job=~"$job"'),
            chained("instance", 'job=~"$job"', 'model_name=~"$model_name"'),
            chained("engine", 'job=~"$job"', 'model_name=~"$model_name"', 'instance=~"$instance"'),
            # The options are the site's bucket bounds; a threshold between two is shown
            # at the bound below it, where the rules read it.
            slo(
                "ttft_slo",
                "TTFT SLO (s)",
                cfg.bounds("time_to_first_token"),
                buckets.le_label(site.read_at("time_to_first_token", cfg.ttft_slo_seconds)[-1]),
            ),
            slo(
                "itl_slo",
                "ITL SLO (s)",
                cfg.bounds("inter_token_latency"),
                buckets.le_label(site.read_at("inter_token_latency", cfg.itl_slo_seconds)[-1]),
            ),
            *extra,
        ]
    )


def dashboard(
    site: Site,
    title: str,
    uid: str,
    description: str,
    panels: list[object],
    *,
    refresh: str = "30s",
    auto_ids: bool = True,
    extra_variables: tuple[Template, ...] = (),
) -> Dashboard:
    """A dashboard in the house style: our title, tags, variables, UTC and schema, the
    playbook alerts as annotations on every time series and servediag watch's finding onsets
    on those of latency, KV cache and queue, links to the other dashboards and a shared
    crosshair."""
    board = Dashboard(
        title=f"LLM serving / {title} (servediag)",
        uid=uid,
        tags=["vllm", TAG],
        description=description,
        annotations=Annotations(list=[BUILTIN_ANNOTATION, ALERT_ANNOTATION, ONSET_ANNOTATION]),
        templating=variables(site, extra_variables),
        panels=panels,
        links=LINKS,
        graphTooltip=GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        timezone="utc",
        refresh=refresh,
        schemaVersion=39,
    )
    board = board.auto_panel_ids() if auto_ids else board
    onsets = {**ONSET_ANNOTATION, "filter": {"exclude": False, "ids": onset_panels(board.panels)}}
    return attr.evolve(
        board,
        annotations=Annotations(list=[BUILTIN_ANNOTATION, ALERT_ANNOTATION, onsets]),
    )


def onset_panels(panels: Iterable[object]) -> list[int]:
    """The ids of the time series (rows' panels included) that read latency, the KV cache or
    the queue (``ONSET_READS``): where servediag watch's onsets are drawn."""
    out: list[int] = []
    for panel in panels:
        out += onset_panels(getattr(panel, "panels", None) or ())
        if type(panel).__name__ != "TimeSeries":
            continue
        exprs = " ".join(getattr(t, "expr", "") or "" for t in getattr(panel, "targets", ()))
        if ONSET_READS.search(exprs):
            out.append(int(panel.id))  # type: ignore[attr-defined]
    return sorted(out)
