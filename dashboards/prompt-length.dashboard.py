"""grafanalib source of dashboards/prompt-length.json (rendered by `make generate`)."""

from diagnoser.outputs.dashboards.prompt_length import build
from diagnoser.site import Site

dashboard = build(Site.default())
