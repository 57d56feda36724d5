"""grafanalib source of dashboards/overview.json (rendered by `make generate`)."""

from diagnoser.outputs.dashboards.overview import build
from diagnoser.site import Site

dashboard = build(Site.default())
