"""Stable panel ids of the Playbooks dashboard, shared by the dashboard and the runbooks."""

from __future__ import annotations

from diagnoser.catalog import CHAPTERS, Catalog

PLAYBOOKS_UID = "servediag-playbooks"


def panel_id(chapter_index: int, playbook_index: int, evidence_index: int) -> int:
    return 1000 + 100 * chapter_index + 10 * playbook_index + evidence_index


def playbook_panels(catalog: Catalog) -> dict[str, list[int]]:
    """Detectable playbook id -> the ids of its evidence panels, in chapter order."""
    out: dict[str, list[int]] = {}
    for c, chapter in enumerate(CHAPTERS):
        playbooks = [p for p in catalog.detectable() if p.chapter == chapter]
        for k, pb in enumerate(playbooks):
            out[pb.id] = [panel_id(c, k, e) for e in range(min(3, len(pb.evidence)))]
    return out


def link(playbook_id: str, catalog: Catalog) -> str | None:
    """Grafana path of the playbook's first evidence panel (relative to Grafana's root)."""
    ids = playbook_panels(catalog).get(playbook_id)
    return f"/d/{PLAYBOOKS_UID}?viewPanel={ids[0]}" if ids else None
