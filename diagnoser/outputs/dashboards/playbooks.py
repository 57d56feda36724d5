"""LLM serving / Playbooks: a row per chapter, each detectable playbook's evidence side by side.

The panel ids are stable (derived from the playbook ids, see ``ids``), so a runbook or a
diagnosis can link to ``d/servediag-playbooks?viewPanel=<id>``.
"""

from __future__ import annotations

from grafanalib.core import Dashboard, RowPanel

from diagnoser.catalog import CHAPTERS
from diagnoser.outputs.dashboards.frame import dashboard
from diagnoser.outputs.dashboards.ids import PLAYBOOKS_UID, playbook_panels, row_id
from diagnoser.outputs.dashboards.style import Board, timeseries
from diagnoser.site import Site

UID = PLAYBOOKS_UID


def build(site: Site) -> Dashboard:
    catalog = site.catalog
    ids = playbook_panels(catalog)
    g = Board(site)
    panels: list[object] = []
    for chapter, title in CHAPTERS.items():
        playbooks = [p for p in catalog.detectable() if p.chapter == chapter]
        if not playbooks:
            continue
        panels.append(RowPanel(title=title, gridPos=g.place(24, 1), id=row_id(chapter)))
        for pb in playbooks:
            for pid, name in zip(ids[pb.id], pb.evidence, strict=False):
                panels.append(
                    timeseries(
                        g,
                        f"{pb.id}: {name}",
                        [g.target(name, "{{model_name}}", "A")],
                        unit=g.unit(name),
                        description=g.describe(
                            f"{pb.title}. {g.help(name)}" + g.engines_note([name]),
                            g.families(name),
                        ),
                        h=7,
                        panel_id=pid,
                    )
                )
    return dashboard(
        site,
        "Playbooks",
        UID,
        "The evidence each playbook reads, grouped by chapter.",
        panels,
        refresh="1m",
        auto_ids=False,
    )
