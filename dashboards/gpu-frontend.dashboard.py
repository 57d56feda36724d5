"""grafanalib source of dashboards/gpu-frontend.json (rendered by `make generate`)."""

from diagnoser.outputs.dashboards.gpu_frontend import build
from diagnoser.site import Site

dashboard = build(Site.default())
