"""vLLM / Playbooks: a row per chapter, each detectable playbook's evidence side by side.

The panel ids are stable (derived from the catalog order), so a runbook or a diagnosis can
link to ``d/servediag-playbooks?viewPanel=<id>``.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, RowPanel, TimeSeries

from diagnoser.catalog import CHAPTERS, load_catalog
from diagnoser.config import RulesConfig
from diagnoser.dashboards.ids import PLAYBOOKS_UID, panel_id, playbook_panels
from diagnoser.dashboards.style import DS, UNITS, Grid, dashboard, target
from diagnoser.signals import SIGNALS

UID = PLAYBOOKS_UID


def build(cfg: RulesConfig | None = None) -> Dashboard:
    catalog = load_catalog()
    ids = playbook_panels(catalog)
    g = Grid()
    panels: list[object] = []
    for c, (chapter, title) in enumerate(CHAPTERS.items()):
        playbooks = [p for p in catalog.detectable() if p.chapter == chapter]
        if not playbooks:
            continue
        panels.append(RowPanel(title=title, gridPos=g.place(24, 1), id=panel_id(c, 0, 0) - 1))
        for pb in playbooks:
            for pid, name in zip(ids[pb.id], pb.evidence, strict=False):
                sig = SIGNALS[name]
                panels.append(
                    TimeSeries(
                        id=pid,
                        title=f"{pb.id}: {name}",
                        dataSource=DS,
                        unit=UNITS.get(sig.unit, "short"),
                        gridPos=g.place(8, 7),
                        description=f"{pb.title}. {sig.help}",
                        targets=[target(name, "{{model_name}}", "A")],
                    )
                )
    return dashboard(
        "Playbooks",
        UID,
        "The evidence each playbook reads, grouped by chapter.",
        panels,
        refresh="1m",
        auto_ids=False,
    )
