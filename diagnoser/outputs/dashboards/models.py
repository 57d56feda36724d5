"""The Overview's per-model summary: one row per model (and group labels) over the
dashboard's time range, the columns an on-call compares models by."""

from __future__ import annotations

from typing import Any

from grafanalib.core import Table

from diagnoser.outputs.dashboards.style import RANGE, RATE, RATIO, Board, table, table_target

# header, signal, window, Grafana unit: each a signal over the whole time range (engines: now)
COLUMNS = (
    ("Engines", "engines", RATE, "short"),
    ("Requests / s", "request_rate", RANGE, "reqps"),
    ("Input tokens / s", "prompt_tokens_rate", RANGE, "short"),
    ("Output tokens / s", "generation_tokens_rate", RANGE, "short"),
    ("TTFT p95", "ttft_p95", RANGE, "s"),
    ("ITL p95", "itl_p95", RANGE, "s"),
    ("E2E p95", "e2e_p95", RANGE, "s"),
    ("5xx share", "http_5xx_share", RANGE, RATIO),
    ("Engine errors", "finished_error_share", RANGE, RATIO),
)
REFS = "ABCDEFGHIJKLMNOP"


def _column(ref: str, header: str, unit: str) -> dict[str, Any]:
    """Each query's value column, named and with its unit."""
    return {
        "matcher": {"id": "byName", "options": f"Value #{ref}"},
        "properties": [{"id": "displayName", "value": header}, {"id": "unit", "value": unit}],
    }


def summary(g: Board) -> Table:
    exprs = [(h, g.expr(s, window=w), u) for h, s, w, u in COLUMNS]
    peak_kv = f"max_over_time(({g.expr('kv_cache_usage')})[{RANGE}:])"
    preemptions = f"({g.expr('preemptions_rate', window=RANGE)}) * {RANGE}_s"
    exprs += [("Peak KV cache", peak_kv, RATIO), ("Preemptions", preemptions, "short")]
    signals = [s for _, s, _, _ in COLUMNS] + ["kv_cache_usage", "preemptions_rate"]
    return table(
        g,
        "Models",
        [table_target(e, REFS[i]) for i, (_, e, _) in enumerate(exprs)],
        description=g.describe(
            "One row per model over the dashboard's time range: its engines now; requests, "
            "input and output tokens per second; TTFT, ITL and end-to-end p95; the shares of "
            "requests answered 5xx or finished with an engine error; the fullest KV cache; the "
            "preemptions counted. A model far from its peers on a column is where to look: "
            "errors above 0.1%, a KV cache near 1 with preemptions, a p95 beyond the SLO.",
            g.families(*signals),
        ),
        transformations=[
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {"Time": True}}},
        ],
        overrides=[_column(REFS[i], h, u) for i, (h, _, u) in enumerate(exprs)],
        sort_by=[{"displayName": "Requests / s", "desc": True}],
    )
