"""The Overview's SLO row: per SLI, the error budget left over the SLO period, and the burn
rate over each window the alerts read (1 spends the budget exactly over the period; the
pages fire at 14.4 over an hour and 6 over six hours). Reads the SLO recording rules."""

from __future__ import annotations

from grafanalib.core import RowPanel, Stat, Target, Threshold, TimeSeries

from diagnoser.outputs.dashboards.style import DS, Board
from diagnoser.outputs.slo import SLIS, objective_name, record_name, sli_title

BURN_WINDOWS = ("5m", "1h", "6h", "1d", "3d")


def _models(board: Board) -> str:
    return '{model_name=~"$model_name"}'


def budget_left(board: Board, sli: str) -> Stat:
    site = board.site
    days = site.config.slo.period / 86400
    ratio = record_name(site, sli, "1h") + _models(board)
    objective = objective_name(site, sli) + _models(board)
    expr = (
        f"1 - avg_over_time({ratio}[{days:g}d]) / on ({', '.join(site.config.by)}) "
        f"(1 - {objective})"
    )
    return Stat(
        title=f"{sli_title(sli)}: error budget left ({days:g}d)",
        dataSource=DS,
        format="percentunit",
        gridPos=board.place(4, 5),
        reduceCalc="lastNotNull",
        decimals=1,
        description=f"The share of the {sli_title(sli)} SLO's {days:g}-day error budget not yet "
        "spent: 1 minus the mean hourly error ratio over the period, over what the objective "
        "allows (the hours count alike, busy or quiet). Below 0 the SLO is missed.",
        targets=[
            Target(expr=board.legend(expr), legendFormat="{{model_name}}", refId="A", datasource=DS)
        ],
        thresholds=[
            Threshold("red", 0, 0.0),
            Threshold("orange", 1, 0.25),
            Threshold("green", 2, 0.5),
        ],
    )


def burn_rates(board: Board, sli: str) -> TimeSeries:
    site = board.site
    on = ", ".join(site.config.by)
    objective = objective_name(site, sli) + _models(board)
    targets = [
        Target(
            expr=f"{record_name(site, sli, w)}{_models(board)} / on ({on}) (1 - {objective})",
            legendFormat=board.legend(f"{w} {{{{model_name}}}}"),
            refId="ABCDE"[i],
            datasource=DS,
        )
        for i, w in enumerate(BURN_WINDOWS)
    ]
    return TimeSeries(
        title=f"{sli_title(sli)}: burn rate by window",
        dataSource=DS,
        unit="short",
        gridPos=board.place(8, 7),
        description="How fast the error budget burns, over each window the alerts read: 1 spends "
        "it over the SLO period exactly; the pages fire at 14.4 over 1h (and 5m) and 6 over 6h "
        "(and 30m), the tickets at 3 over 1d and 1 over 3d.",
        targets=targets,
    )


def panels(board: Board) -> list[object]:
    out: list[object] = [RowPanel(title="Service-level objectives", gridPos=board.place(24, 1))]
    out += [budget_left(board, sli) for sli in SLIS]
    board.newline()
    out += [burn_rates(board, sli) for sli in SLIS]
    return out
