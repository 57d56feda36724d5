"""grafanalib source of dashboards/kv-batching.json (rendered by `make generate`)."""

from diagnoser.dashboards.kv_batching import build

dashboard = build()
