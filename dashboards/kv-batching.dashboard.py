"""grafanalib source of dashboards/kv-batching.json (rendered by `make generate`)."""

from diagnoser.outputs.dashboards.kv_batching import build
from diagnoser.site import Site

dashboard = build(Site.default())
