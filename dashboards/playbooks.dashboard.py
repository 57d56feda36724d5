"""grafanalib source of dashboards/playbooks.json (rendered by `make generate`)."""

from diagnoser.dashboards.playbooks import build

dashboard = build()
