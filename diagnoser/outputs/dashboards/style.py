"""The house style: our selectors, units and panel helpers over grafanalib's neutral core.

Every query is a signal from ``diagnoser.metrics.signals`` rendered for the dashboard's
variables, so dashboards share the recording rules' and the diagnoser's definitions (renamed
metrics read under both names, ``sum by (le)`` in quantiles, ``/ (den > 0)`` guards).

Every panel is drawn at full resolution: no ``maxDataPoints`` (Grafana asks for one point per
pixel of the panel's width), every query at ``intervalFactor`` 1, and the site's scrape
interval as the panel's minimum step. Time series share one look: a table legend with each
series' last and largest value, a tooltip that lists every series, ratios on a 0-1 axis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from grafanalib.core import GridPos, Heatmap, RowPanel, Stat, Table, Target, TimeSeries

from diagnoser.metrics import engines
from diagnoser.site import Site

# What Grafana itself saves for a panel bound to the `datasource` variable.
DS = {"type": "prometheus", "uid": "${datasource}"}
FLEET = ('job=~"$job"', 'model_name=~"$model_name"', 'instance=~"$instance"', 'engine=~"$engine"')
RATE = "$__rate_interval"
RANGE = "$__range"  # the dashboard's time range: for stats that count events
RATIO = "percentunit"
UNITS = {
    "s": "s",
    "ratio": RATIO,
    "req/s": "reqps",
    "tokens/s": "short",
    "tokens": "short",
    "requests": "short",
    "1/s": "short",
    "cores": "short",
    "bytes": "bytes",
    "B/s": "Bps",
    "restarts": "short",
    "engines": "short",
    "x": "short",
    "targets": "short",
    "W": "watt",
    "celsius": "celsius",
    "Hz": "hertz",
    "xid": "none",
}
Steps = list[dict[str, Any]]


def steps(base: str, *upper: tuple[str, float]) -> Steps:
    """Threshold steps: ``base`` from -infinity (a null value), then each (colour, from)."""
    return [{"color": base, "value": None}, *({"color": c, "value": v} for c, v in upper)]


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

    @property
    def interval(self) -> str:
        """The smallest step a panel asks for: the site's scrape interval."""
        return self.site.config.scrape_interval

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

    def row(self, title: str) -> RowPanel:
        return RowPanel(title=title, gridPos=self.place(24, 1))

    def collapsed_row(self, title: str, build: Callable[[], list[object]]) -> RowPanel:
        """A row that starts collapsed, holding the panels ``build`` lays out under it; the
        dashboard goes on right below the row (its panels show only when it is opened)."""
        self.newline()
        top = self.y
        pos = self.place(24, 1)
        panels = build()
        self.x, self.y, self.row_h = 0, top + 1, 0
        return RowPanel(title=title, gridPos=pos, collapsed=True, panels=panels)

    def unit(self, signal: str) -> str:
        return UNITS.get(self.site.vocabulary[signal].unit, "short")

    def help(self, signal: str) -> str:
        return self.site.vocabulary[signal].help

    def describe(self, text: str, families: Sequence[str]) -> str:
        """A panel's description: what it shows and what a bad value means, then the metric
        families it reads."""
        names = ", ".join(dict.fromkeys(families))
        return f"{text} Metrics: {names}." if names else text

    def engines_note(self, signals: Sequence[str]) -> str:
        """A note saying the panel is the reference engine's only, and why, when a signal has
        no series on another engine (it stays empty on that engine's models); else "". Scrape
        health (``up``) is every target's; a target-level signal that reads vLLM's series is
        vLLM's."""
        ref = engines.reference()
        sigs = [self.site.vocabulary[s] for s in signals]
        gaps = [
            s.gap(e.name)
            for e in engines.others()
            for s in sigs
            if s.gap(e.name)
            and (not s.target_level or any(f.startswith(ref.prefix) for f in s.families))
        ]
        return f" {ref.title} only: {gaps[0]}." if gaps else ""

    def families(self, *signals: str) -> list[str]:
        return [f for s in signals for f in self.site.vocabulary[s].families]

    def expr(
        self, signal: str, *, per_instance: bool = False, window: str = RATE, side: str = ""
    ) -> str:
        """A signal's expression on the dashboard; over one ``side`` of a disaggregated
        deployment where given (else the side the signal is about)."""
        sig = self.site.vocabulary[signal]
        scope = self.site.scope(sig, instance=per_instance, window=window, matchers=FLEET)
        return sig.render(replace(scope, side=side))

    def legend(self, text: str) -> str:
        """A legend naming the model also names the site's group labels (e.g. the cluster)."""
        groups = "".join(f"{{{{{label}}}}} " for label in self.site.config.group_labels)
        return text.replace("{{model_name}}", groups + "{{model_name}}") if groups else text

    def target(
        self,
        signal: str,
        legend: str,
        ref: str,
        *,
        per_instance: bool = False,
        window: str = RATE,
        instant: bool = False,
        side: str = "",
    ) -> Target:
        expr = self.expr(signal, per_instance=per_instance, window=window, side=side)
        return query(expr, self.legend(legend), ref, instant=instant)


def query(expr: str, legend: str = "", ref: str = "A", *, instant: bool = False) -> Target:
    """A Prometheus query at full resolution (one point per step, no intervalFactor)."""
    return Target(
        expr=expr,
        legendFormat=legend,
        refId=ref,
        datasource=DS,
        intervalFactor=1,
        instant=instant,
    )


def table_target(expr: str, ref: str = "A") -> Target:
    """An instant query whose series become the rows of a table panel."""
    return Target(
        expr=expr,
        instant=True,
        format="table",
        refId=ref,
        datasource=DS,
        intervalFactor=1,
    )


def _resolution(board: Board) -> dict[str, Any]:
    return {"dataSource": DS, "interval": board.interval, "maxDataPoints": None}


def stat_panel(
    board: Board,
    title: str,
    targets: list[Target],
    *,
    unit: str,
    thresholds: Steps,
    description: str,
    decimals: int | None = None,
    instant: bool = False,
    w: int = 3,
    h: int = 4,
) -> Stat:
    """A single value with its thresholds; ratios bounded 0 to 1."""
    defaults: dict[str, Any] = {"min": 0, "max": 1} if unit == RATIO else {}
    return Stat(
        title=title,
        targets=targets,
        format=unit,
        gridPos=board.place(w, h),
        reduceCalc="lastNotNull",
        decimals=decimals,
        thresholds=thresholds,
        color={"mode": "thresholds"},
        description=description,
        graphMode="none" if instant else "area",
        extraJson={
            "options": {
                "percentChangeColorMode": "standard",
                "showPercentChange": False,
                "wideLayout": True,
            },
            "fieldConfig": {"defaults": defaults},
        },
        **_resolution(board),
    )


def stat(
    board: Board,
    title: str,
    signal: str,
    thresholds: list[tuple[str, float]] | None = None,
    description: str = "",
    *,
    window: str = RATE,
) -> Stat:
    """A signal's value now, one per model; over ``RANGE`` an instant query counts the events
    of the whole time range (``window`` is the range of its rate or changes)."""
    instant = window == RANGE
    return stat_panel(
        board,
        title,
        [board.target(signal, "{{model_name}}", "A", window=window, instant=instant)],
        unit=board.unit(signal),
        thresholds=steps("green", *(thresholds or [])),
        description=board.describe(
            (description or board.help(signal)) + board.engines_note([signal]),
            board.families(signal),
        ),
        instant=instant,
    )


def timeseries(
    board: Board,
    title: str,
    targets: list[Target],
    *,
    unit: str,
    description: str,
    w: int = 8,
    h: int = 8,
    stack: bool = False,
    panel_id: int | None = None,
    thresholds: Steps | None = None,
) -> TimeSeries:
    """Lines over time: a table legend with each series' last and largest value, a tooltip
    with every series (largest first); a ratio's axis runs from 0 to 1; ``thresholds`` are
    drawn as lines."""
    ratio = unit == RATIO
    return TimeSeries(
        title=title,
        id=panel_id,
        unit=unit,
        gridPos=board.place(w, h),
        description=description,
        targets=targets,
        legendDisplayMode="table",
        legendPlacement="bottom",
        legendCalcs=["lastNotNull", "max"],
        tooltipMode="multi",
        tooltipSort="desc",
        valueMin=0 if ratio else None,
        valueMax=1 if ratio else None,
        stacking={"mode": "normal", "group": "A"} if stack else {"mode": "none", "group": "A"},
        fillOpacity=25 if stack else 0,
        thresholds=thresholds or steps("green"),
        thresholdsStyleMode="line" if thresholds else "off",
        extraJson={"options": {"legend": {"showLegend": True}}},
        **_resolution(board),
    )


def series(
    board: Board,
    title: str,
    signals: list[tuple[str, str]],
    *,
    w: int = 8,
    per_instance: bool = False,
    description: str = "",
    stack: bool = False,
) -> TimeSeries:
    refs = "ABCDEFGHIJ"
    first = signals[0][0]
    return timeseries(
        board,
        title,
        [
            board.target(s, legend, refs[i], per_instance=per_instance)
            for i, (s, legend) in enumerate(signals)
        ],
        unit=board.unit(first),
        description=board.describe(
            (description or board.help(first)) + board.engines_note([s for s, _ in signals]),
            board.families(*(s for s, _ in signals)),
        ),
        w=w,
        stack=stack,
    )


def heatmap(
    board: Board,
    title: str,
    families: tuple[str, ...],
    unit: str,
    description: str,
    *,
    w: int = 8,
) -> Heatmap:
    """The distribution of a histogram over time: observations per second in each ``le``
    bucket, as the histogram's own buckets (Grafana calculates nothing). Several families
    are renames of one histogram, read newest first."""
    selector = ", ".join(board.fleet)
    if all(family.startswith("vllm:") for family in families):
        description += " vLLM only: SGLang's histogram of the same has other buckets."
    expr = " or ".join(
        f"sum by (le) (rate({family}_bucket{{{selector}}}[{RATE}]))" for family in families
    )
    target = Target(
        expr=expr,
        format="heatmap",
        legendFormat="{{le}}",
        refId="A",
        datasource=DS,
        intervalFactor=1,
    )
    return Heatmap(
        title=title,
        gridPos=board.place(w, 8),
        description=board.describe(description, families),
        targets=[target],
        options={
            "calculate": False,
            "cellGap": 1,
            "cellValues": {"unit": "short"},
            "color": {
                "mode": "scheme",
                "scheme": "Oranges",
                "scale": "exponential",
                "exponent": 0.5,
                "fill": "dark-orange",
                "reverse": False,
                "steps": 64,
            },
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},  # empty buckets stay blank
            "legend": {"show": True},
            "rowsFrame": {"layout": "le"},
            "showValue": "never",
            "tooltip": {"mode": "single", "yHistogram": True, "showColorScale": False},
            "yAxis": {"axisPlacement": "left", "unit": unit},
        },
        extraJson={
            "fieldConfig": {
                "defaults": {
                    "custom": {
                        "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                        "scaleDistribution": {"type": "linear"},
                    }
                },
                "overrides": [],
            }
        },
        **_resolution(board),
    )


def table(
    board: Board,
    title: str,
    targets: list[Target],
    *,
    description: str,
    transformations: list[dict[str, Any]],
    overrides: list[dict[str, Any]] | None = None,
    sort_by: list[dict[str, Any]] | None = None,
    h: int = 6,
    w: int = 24,
    no_value: str | None = None,
) -> Table:
    """A table of instant queries, full width unless ``w`` says; ``no_value`` is what it
    says when they return nothing."""
    defaults: dict[str, Any] = {"custom": {"cellOptions": {"type": "auto"}, "inspect": False}}
    if no_value is not None:
        defaults["noValue"] = no_value
    return Table(
        title=title,
        gridPos=board.place(w, h),
        description=description,
        targets=targets,
        transformations=transformations,
        overrides=overrides or [],
        thresholds=steps("green"),
        extraJson={
            "options": {
                "frameIndex": 0,
                "showHeader": True,
                "cellHeight": "sm",
                "sortBy": sort_by or [],
            },
            "fieldConfig": {"defaults": defaults},
        },
        **_resolution(board),
    )
