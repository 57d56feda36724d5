"""Grafana dashboards, generated with grafanalib from the signal vocabulary."""

from __future__ import annotations

import importlib
import json
from typing import Any

# file name (dashboards/<name>.json) -> module with build()
DASHBOARDS = {"overview": "diagnoser.dashboards.overview"}


def render(name: str) -> str:
    """The dashboard as Grafana's JSON model (stable key order)."""
    from grafanalib._gen import DashboardEncoder

    dashboard = importlib.import_module(DASHBOARDS[name]).build()
    data: dict[str, Any] = dashboard.to_json_data()
    return json.dumps(data, cls=DashboardEncoder, indent=2, sort_keys=True) + "\n"
