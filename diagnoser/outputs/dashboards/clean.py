"""grafanalib's JSON, made what Grafana's published dashboard schema (``@grafana/schema``) says.

grafanalib 0.7.1 writes the JSON model of an older Grafana: every attribute it has, ``null``
where nothing was set, keys Grafana dropped long ago (``rows``, ``span``, the Angular heatmap's
``cards`` and ``xAxis``), a threshold base of the string ``"null"``, and everything a panel has
on row panels too. Grafana 13 still imports that, migrating or ignoring what it does not know;
a strict importer, or a later Grafana, need not. What our builders can say right (datasource
references, plugin options, threshold steps) they say at the source; this pass removes what
only grafanalib puts there. Nothing it drops changes what Grafana shows:

- ``null`` values are dropped (Grafana merges its defaults over absent keys alike), except a
  threshold step's ``value``, where ``null`` is the base step (minus infinity);
- pre-Grafana-5 dashboard keys (``rows``, ``sharedCrosshair``, ``hideControls``, ``style``,
  ``__inputs``) and the time picker's ``time_options`` (Grafana's own migration deletes it);
- panel keys of the old grid (``span``, ``height``, ``minSpan``, ``editable``, ``error``), the
  old table's and the Angular heatmap's keys, and on rows every key a row does not have;
- threshold steps' graph-panel fields (``index``, ``line``, ``op``, ``yaxis``);
- variables' tag fields (gone since Grafana 8) and interval-only fields on other variables;
- query keys of other datasources (``target``, ``metric``) and the legacy ``step`` and
  ``query``, which Prometheus queries do not read (``expr`` and ``interval`` are the query).
"""

from __future__ import annotations

import copy
from typing import Any

DASHBOARD_LEGACY = ("__inputs", "hideControls", "rows", "sharedCrosshair", "style")
PANEL_LEGACY = ("editable", "error", "height", "minSpan", "span")
ROW_KEYS = ("collapsed", "datasource", "gridPos", "id", "panels", "repeat", "title", "type")
LEGACY_BY_TYPE = {
    "table": ("color", "columns", "fontSize", "mappings"),
    "heatmap": (
        "cards",
        "color",
        "dataFormat",
        "heatmap",
        "hideZeroBuckets",
        "highlightCards",
        "legend",
        "reverseYBuckets",
        "tooltip",
        "xAxis",
        "xBucketNumber",
        "xBucketSize",
        "yAxis",
        "yBucketBound",
        "yBucketNumber",
        "yBucketSize",
    ),
}
VARIABLE_LEGACY = ("useTags", "tagsQuery", "tagValuesQuery")
INTERVAL_ONLY = ("auto", "auto_count", "auto_min")
TARGET_LEGACY = ("metric", "query", "step", "target")


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x


def _steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``{color, value}`` per step; the first step's value is null (from minus infinity)."""
    out = []
    for i, step in enumerate(steps):
        value = step.get("value")
        out.append({"color": step["color"], "value": None if i == 0 or value == "null" else value})
    return out


def _panel(p: dict[str, Any]) -> dict[str, Any]:
    if p.get("type") == "row":
        row = _drop_none({k: v for k, v in p.items() if k in ROW_KEYS})
        row["panels"] = [_panel(child) for child in p.get("panels", [])]
        return dict(row)
    for key in PANEL_LEGACY + LEGACY_BY_TYPE.get(p.get("type", ""), ()):
        p.pop(key, None)
    for target in p.get("targets", []):
        for key in TARGET_LEGACY:
            target.pop(key, None)
    fc = p.setdefault("fieldConfig", {})
    fc.setdefault("defaults", {})
    fc.setdefault("overrides", [])
    thresholds = fc["defaults"].get("thresholds")
    steps = _steps(thresholds.get("steps") or []) if isinstance(thresholds, dict) else None
    p = dict(_drop_none(p))
    if steps is not None:  # after _drop_none: the base step's null value stays
        p["fieldConfig"]["defaults"]["thresholds"]["steps"] = steps
    return p


def schema_clean(board: dict[str, Any]) -> dict[str, Any]:
    """grafanalib's dashboard JSON (after a JSON round trip), schema clean; the input is not
    changed."""
    d = copy.deepcopy(board)
    for key in DASHBOARD_LEGACY:
        d.pop(key, None)
    if isinstance(d.get("timepicker"), dict):
        d["timepicker"].pop("time_options", None)
    for var in (d.get("templating") or {}).get("list", []):
        drop = VARIABLE_LEGACY + (INTERVAL_ONLY if var.get("type") != "interval" else ())
        for key in drop:
            var.pop(key, None)
        current = var.get("current")
        if isinstance(current, dict):
            current.pop("tags", None)
            if current.get("text") is None and current.get("value") is None:
                del var["current"]  # no default: Grafana picks the first option on load
    panels = [_panel(p) for p in d.pop("panels", [])]
    out: dict[str, Any] = _drop_none(d)
    out["panels"] = panels
    return out
