"""grafanalib source of dashboards/playbooks.json (rendered by `make generate`)."""

from diagnoser.outputs.dashboards.playbooks import build
from diagnoser.site import Site

dashboard = build(Site.default())
