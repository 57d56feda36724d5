"""grafanalib source of dashboards/prompt-length.json (rendered by `make generate`)."""

from diagnoser.dashboards.prompt_length import build

dashboard = build()
