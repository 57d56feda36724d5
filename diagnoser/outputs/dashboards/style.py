"""The house style: our selectors, units and panel helpers over grafanalib's neutral core.

Every query is a signal from ``diagnoser.core.signals`` rendered for the dashboard's variables, so
dashboards share the recording rules' and the diagnoser's definitions (renamed metrics read
under both names, ``sum by (le)`` in quantiles, ``/ (den > 0)`` guards).
"""

from __future__ import annotations

from grafanalib.core import (
    Annotations,
    Dashboard,
    GridPos,
    Heatmap,
    Stat,
    Target,
    Template,
    Templating,
    Threshold,
    TimeSeries,
)

from diagnoser.core import buckets
from diagnoser.site import Site

DS = "${datasource}"
FLEET = ('job=~"$job"', 'model_name=~"$model_name"', 'instance=~"$instance"', 'engine=~"$engine"')
RATE = "$__rate_interval"
UNITS = {
    "s": "s",
    "ratio": "percentunit",
    "req/s": "reqps",
    "tokens/s": "short",
    "tokens": "short",
    "requests": "short",
    "1/s": "short",
    "cores": "short",
    "bytes": "bytes",
    "restarts": "short",
}


class Board:
    """One dashboard being built for a site: lays panels out left to right, 24 columns wide,
    starting a new line when full, and renders signals with the site's selector."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.x = self.y = self.row_h = 0

    @property
    def fleet(self) -> tuple[str, ...]:
        """The site's selector and the dashboard's variables, for raw series."""
        return (*self.site.config.selector, *FLEET)

    def place(self, w: int, h: int) -> GridPos:
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = GridPos(h=h, w=w, x=self.x, y=self.y)
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def newline(self) -> None:
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0

    def unit(self, signal: str) -> str:
        return UNITS.get(self.site.vocabulary[signal].unit, "short")

    def help(self, signal: str) -> str:
        return self.site.vocabulary[signal].help

    def engines_note(self, signals: list[str]) -> str:
        """A note saying the panel is vLLM only, and why, when a signal has no SGLang series
        (it stays empty on SGLang's models); else "". Scrape health (``up``) is every
        target's."""
        sigs = [self.site.vocabulary[s] for s in signals]
        gaps = [s.sglang_gap for s in sigs if not s.on_sglang and not s.target_level]
        return f" vLLM only: {gaps[0]}." if gaps else ""

    def expr(self, signal: str, *, per_instance: bool = False) -> str:
        sig = self.site.vocabulary[signal]
        scope = self.site.scope(sig, instance=per_instance, window=RATE, matchers=FLEET)
        return sig.render(scope)

    def legend(self, text: str) -> str:
        """A legend naming the model also names the site's group labels (e.g. the cluster)."""
        groups = "".join(f"{{{{{label}}}}} " for label in self.site.config.group_labels)
        return text.replace("{{model_name}}", groups + "{{model_name}}") if groups else text

    def target(self, signal: str, legend: str, ref: str, *, per_instance: bool = False) -> Target:
        return Target(
            expr=self.expr(signal, per_instance=per_instance),
            legendFormat=self.legend(legend),
            refId=ref,
            datasource=DS,
        )


def table_target(query: str) -> Target:
    """An instant query whose series become the rows of a table panel."""
    return Target(expr=query, instant=True, format="table", refId="A", datasource=DS)


def stat(
    board: Board,
    title: str,
    signal: str,
    thresholds: list[tuple[str, float]] | None = None,
    description: str = "",
) -> Stat:
    unit = board.unit(signal)
    steps = [Threshold("green", 0, 0.0)] + [
        Threshold(color, i + 1, value) for i, (color, value) in enumerate(thresholds or [])
    ]
    return Stat(
        title=title,
        dataSource=DS,
        targets=[board.target(signal, title, "A")],
        format=unit,
        gridPos=board.place(3, 4),
        reduceCalc="lastNotNull",
        thresholds=steps,
        description=(description or board.help(signal)) + board.engines_note([signal]),
        graphMode="area",
    )


def series(
    board: Board,
    title: str,
    signals: list[tuple[str, str]],
    *,
    w: int = 8,
    per_instance: bool = False,
    description: str = "",
) -> TimeSeries:
    refs = "ABCDEFGHIJ"
    return TimeSeries(
        title=title,
        dataSource=DS,
        unit=board.unit(signals[0][0]),
        gridPos=board.place(w, 8),
        description=(description or board.help(signals[0][0]))
        + board.engines_note([s for s, _ in signals]),
        targets=[
            board.target(s, legend, refs[i], per_instance=per_instance)
            for i, (s, legend) in enumerate(signals)
        ],
    )


# The generated playbook alerts firing now, for the chosen models.
FIRING_ALERTS = 'ALERTS{alertname=~"Vllm.*", alertstate="firing", model_name=~"$model_name"}'
# Playbook alerts as annotations on every time series: when each began and which playbook.
ALERT_ANNOTATION = {
    "datasource": {"type": "prometheus", "uid": DS},
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
BUILTIN_ANNOTATION = {
    "builtIn": 1,
    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
    "enable": True,
    "hide": True,
    "iconColor": "rgba(0, 211, 255, 1)",
    "name": "Annotations & Alerts",
    "type": "dashboard",
}


def custom(name: str, label: str, values: list[str], default: str) -> Template:
    """A dashboard variable with fixed choices."""
    return Template(name=name, label=label, type="custom", query=",".join(values), default=default)


def heatmap(board: Board, title: str, family: str, description: str, *, w: int = 12) -> Heatmap:
    """The distribution of a histogram over time: observations per bucket and interval."""
    selector = ", ".join(board.fleet)
    if family.startswith("vllm:"):
        description += " vLLM only: SGLang's histogram of the same has other buckets."
    return Heatmap(
        title=title,
        dataSource=DS,
        gridPos=board.place(w, 8),
        description=description,
        dataFormat="tsbuckets",
        targets=[
            Target(
                expr=f"sum by (le) (increase({family}_bucket{{{selector}}}[{RATE}]))",
                format="heatmap",
                legendFormat="{{le}}",
                refId="A",
                datasource=DS,
            )
        ],
        options={
            "calculate": False,
            "cellGap": 1,
            "color": {"mode": "scheme", "scheme": "Oranges", "scale": "exponential"},
            "yAxis": {"axisPlacement": "left", "unit": "short"},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"show": True, "yHistogram": True},
            "cellValues": {"unit": "short"},
        },
    )


# The serving engine (vLLM, SGLang): the job, model and instance choices are its servers'.
ENGINE_VARIABLE = Template(
    name="serving_engine",
    label="Engine",
    type="custom",
    query="vllm,sglang",
    includeAll=True,
    multi=True,
    default="$__all",
)
# Each engine's running gauge: one series per model and server.
SERVING = '__name__=~"(${serving_engine:regex}):num_(requests_running|running_reqs)"'


def variables(site: Site, extra: tuple[Template, ...] = ()) -> Templating:
    def chained(name: str, *matchers: str) -> Template:
        parts = ", ".join((SERVING, *site.config.selector, *matchers))
        return Template(
            name=name,
            label=name,
            dataSource=DS,
            includeAll=True,
            multi=True,
            allValue=".*",
            refresh=2,
            query=f"label_values({{{parts}}}, {name})",
        )

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
            slo(
                "ttft_slo",
                "TTFT SLO (s)",
                buckets.TTFT_BUCKETS,
                buckets.le_label(cfg.ttft_slo_seconds),
            ),
            slo(
                "itl_slo",
                "ITL SLO (s)",
                buckets.ITL_BUCKETS,
                buckets.le_label(cfg.itl_slo_seconds),
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
    """A dashboard in the house style: our title, tags, variables, UTC and schema, with the
    playbook alerts as annotations on every time series."""
    board = Dashboard(
        title=f"vLLM / {title} (servediag)",
        uid=uid,
        tags=["vllm", "servediag"],
        description=description,
        annotations=Annotations(list=[BUILTIN_ANNOTATION, ALERT_ANNOTATION]),
        templating=variables(site, extra_variables),
        panels=panels,
        timezone="utc",
        refresh=refresh,
        schemaVersion=39,
    )
    return board.auto_panel_ids() if auto_ids else board
