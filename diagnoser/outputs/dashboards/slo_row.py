"""The Overview's SLO row: per SLI, the attainment and the error budget left over the SLO
period, and the burn rate over each window the alerts read (1 spends the budget exactly over
the period; the pages fire at 14.4 over an hour and 6 over six hours). Reads the SLO recording
rules (``outputs/slo.py``)."""

from __future__ import annotations

from grafanalib.core import Stat, TimeSeries

from diagnoser.outputs.dashboards.style import RATIO, Board, query, stat_panel, steps, timeseries
from diagnoser.outputs.slo import SLIS, objective_name, record_name, sli_title

BURN_WINDOWS = ("5m", "1h", "6h", "1d", "3d")
MODELS = '{model_name=~"$model_name"}'


def _rules(board: Board, sli: str) -> list[str]:
    """The recorded series the SLI's panels read."""
    site = board.site
    return [*(record_name(site, sli, w) for w in BURN_WINDOWS), objective_name(site, sli)]


def _mean_error_ratio(board: Board, sli: str) -> str:
    """The SLI's error ratio over the SLO period: the mean of its hourly error ratios (the
    hours count alike, busy or quiet)."""
    days = board.site.config.slo.period / 86400
    return f"avg_over_time({record_name(board.site, sli, '1h')}{MODELS}[{days:g}d])"


def attainment(board: Board, sli: str) -> Stat:
    site = board.site
    days = site.config.slo.period / 86400
    objective = site.config.slo.default.objective(sli)
    budget = 1 - objective
    return stat_panel(
        board,
        f"{sli_title(sli)}: attainment ({days:g}d)",
        [query(f"1 - {_mean_error_ratio(board, sli)}", board.legend("{{model_name}}"))],
        unit=RATIO,
        decimals=3,
        thresholds=steps("red", ("orange", objective - budget), ("green", objective)),
        description=board.describe(
            f"The {sli_title(sli)} SLI over the {days:g}-day SLO period: 1 minus the mean "
            f"hourly error ratio. Below the objective ({objective:.4g} unless a model's "
            "override says otherwise; the colours are the default's) the SLO is missed.",
            _rules(board, sli),
        ),
        w=4,
        h=5,
    )


def budget_left(board: Board, sli: str) -> Stat:
    site = board.site
    days = site.config.slo.period / 86400
    objective = objective_name(site, sli) + MODELS
    expr = (
        f"1 - {_mean_error_ratio(board, sli)} / on ({', '.join(site.config.by)}) (1 - {objective})"
    )
    return stat_panel(
        board,
        f"{sli_title(sli)}: error budget left ({days:g}d)",
        [query(expr, board.legend("{{model_name}}"))],
        unit=RATIO,
        decimals=1,
        thresholds=steps("red", ("orange", 0.25), ("green", 0.5)),
        description=board.describe(
            f"The share of the {sli_title(sli)} SLO's {days:g}-day error budget not yet spent: "
            "1 minus the mean hourly error ratio over the period, over what the objective "
            "allows. Below 0 the SLO is missed; under a quarter, hold risky changes.",
            _rules(board, sli),
        ),
        w=4,
        h=5,
    )


def burn_rates(board: Board, sli: str) -> TimeSeries:
    site = board.site
    on = ", ".join(site.config.by)
    objective = objective_name(site, sli) + MODELS
    targets = [
        query(
            f"{record_name(site, sli, w)}{MODELS} / on ({on}) (1 - {objective})",
            board.legend(f"{w} {{{{model_name}}}}"),
            "ABCDE"[i],
        )
        for i, w in enumerate(BURN_WINDOWS)
    ]
    return timeseries(
        board,
        f"{sli_title(sli)}: burn rate by window",
        targets,
        unit="short",
        description=board.describe(
            "How fast the error budget burns, over each window the alerts read: 1 spends it "
            "over the SLO period exactly; the pages fire at 14.4 over 1h (and 5m) and 6 over 6h "
            "(and 30m), the tickets at 3 over 1d and 1 over 3d (the lines at 1 and 14.4).",
            _rules(board, sli),
        ),
        thresholds=steps("green", ("orange", 1.0), ("red", 14.4)),
        h=7,
    )


def panels(board: Board) -> list[object]:
    out: list[object] = [board.row("Service-level objectives")]
    for sli in SLIS:
        out += [attainment(board, sli), budget_left(board, sli)]
    board.newline()
    out += [burn_rates(board, sli) for sli in SLIS]
    return out
