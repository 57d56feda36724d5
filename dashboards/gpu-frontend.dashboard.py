"""grafanalib source of dashboards/gpu-frontend.json (rendered by `make generate`)."""

from diagnoser.dashboards.gpu_frontend import build

dashboard = build()
