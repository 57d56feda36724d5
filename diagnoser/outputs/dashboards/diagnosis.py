"""The Overview's "Diagnosis now" row: what ``servediag watch`` finds for each model now (its
verdict, the likely causes with their confidence, onset and runbook), how old that is, and
whether its last cycle failed (stale: the row shows the last good diagnosis).
Reads the service's series (docs/rules-and-alerts.md); without the service the row says it
is not scraped, and every other panel works as before."""

from __future__ import annotations

from typing import Any

from grafanalib.core import Stat, Table

from diagnoser.outputs.dashboards.style import Board, stat_panel, steps, table, table_target

NOT_SCRAPED = "servediag watch is not scraped: run it to see the diagnosis here"
MODELS = 'model_name=~"$model_name"'
# Each playbook's title and runbook, once (several replicas of the service serve the same).
INFO = "group by (playbook, title, runbook) (servediag_playbook_info)"


def _with_info(metric: str) -> str:
    """A finding series of the chosen models with its playbook's title and runbook."""
    return f"{metric}{{{MODELS}}} * on (playbook) group_left (title, runbook) {INFO}"


def _hidden(*names: str) -> dict[str, bool]:
    return dict.fromkeys(("Time", "__name__", "job", "instance", *names), True)


def _override(name: str, *props: dict[str, Any]) -> dict[str, Any]:
    return {"matcher": {"id": "byName", "options": name}, "properties": list(props)}


def verdicts(board: Board) -> Table:
    return table(
        board,
        "Verdict by model (servediag watch)",
        [table_target(f"servediag_health{{{MODELS}}}")],
        description="Each model's verdict in servediag watch's last diagnosis: healthy, "
        "unhealthy (a finding holds: see the causes below), idle (too little traffic to "
        "judge) or unknown (its series are missing). Metrics: servediag_health.",
        transformations=[{"id": "organize", "options": {"excludeByName": _hidden("Value")}}],
        no_value=NOT_SCRAPED,
        w=14,
        h=6,
    )


def age(board: Board) -> Stat:
    return stat_panel(
        board,
        "Diagnosis age",
        [table_target("max(servediag_last_success_age_seconds)")],
        unit="s",
        thresholds=steps("green", ("orange", 180.0), ("red", 600.0)),
        description="How long ago servediag watch's last good cycle ended. It diagnoses every "
        "minute; older than a few minutes, its cycles fail (servediag_stale is 1, "
        "ServediagStale fires after 10 minutes) and the row shows the last good diagnosis. "
        "Metrics: servediag_last_success_age_seconds.",
        instant=True,
        w=5,
        h=6,
    )


def stale(board: Board) -> Stat:
    """servediag_stale as words: fresh (0, green) or stale (1, red)."""
    panel = stat_panel(
        board,
        "Diagnosis fresh or stale",
        [table_target("max(servediag_stale)")],
        unit="none",
        thresholds=steps("green", ("red", 1.0)),
        description="Whether servediag watch's last cycle failed: stale means Prometheus was "
        "down, answered garbage or too slowly, and the row (and the causes the pages carry) "
        "is the last good cycle's; its log and servediag_errors_total say why. "
        "Metrics: servediag_stale.",
        instant=True,
        w=5,
        h=6,
    )
    words = {"0": ("fresh", "green"), "1": ("stale", "red")}
    panel.extraJson["fieldConfig"]["defaults"] |= {
        "mappings": [
            {
                "type": "value",
                "options": {
                    value: {"text": text, "color": colour, "index": i}
                    for i, (value, (text, colour)) in enumerate(words.items())
                },
            }
        ],
        "noValue": "not scraped",
    }
    return panel


def causes(board: Board) -> Table:
    """One row per finding: its model, playbook, title, severity, rank, confidence, onset and
    runbook link; the three queries share their labels and are merged into one row."""
    targets = [
        table_target(_with_info("servediag_finding_rank"), "A"),
        table_target(_with_info("servediag_finding"), "B"),
        table_target(f"{_with_info('servediag_finding_onset_timestamp_seconds')} * 1000", "C"),
    ]
    link = {
        "id": "links",
        "value": [
            {"title": "Runbook: ${__value.text}", "url": "${__value.raw}", "targetBlank": True}
        ],
    }
    return table(
        board,
        "Likely causes now (servediag watch)",
        targets,
        description="The findings servediag watch holds now for each model, the likely cause "
        "first (rank 1: the one its alert and the pages name), with the confidence, the onset "
        "(when the pattern began) and the runbook. Empty while it finds nothing, or is not "
        "scraped (see the verdicts). Metrics: servediag_finding, servediag_finding_rank, "
        "servediag_finding_onset_timestamp_seconds, servediag_playbook_info.",
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": _hidden(),
                    "renameByName": {
                        "Value #A": "rank",
                        "Value #B": "confidence",
                        "Value #C": "onset",
                    },
                },
            },
        ],
        overrides=[
            _override("confidence", {"id": "unit", "value": "percentunit"}),
            _override("onset", {"id": "unit", "value": "dateTimeAsIso"}),
            _override("runbook", link),
        ],
        sort_by=[{"displayName": "rank", "desc": False}],
        no_value="No finding: servediag watch names no cause now, or is not scraped",
        h=7,
    )


def panels(board: Board) -> list[object]:
    return [board.row("Diagnosis now"), verdicts(board), age(board), stale(board), causes(board)]
