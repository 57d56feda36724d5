"""grafanalib source of dashboards/overview.json (rendered by `make generate`)."""

from diagnoser.dashboards.overview import build

dashboard = build()
