"""Stable panel ids of the Playbooks dashboard, shared by the dashboard and the runbooks.

An id is derived from the playbook's id (and a row's from its chapter), never from positions:
adding, removing or reordering playbooks leaves every other panel's link as it was.
"""

from __future__ import annotations

import zlib

from diagnoser.catalog import CHAPTERS, Catalog

PLAYBOOKS_UID = "servediag-playbooks"
EVIDENCE_PANELS = 3  # evidence signals shown per playbook
_SLOTS = 100_000  # playbook panel ids: 100000 + 10 * slot + evidence index
_ROW_SLOTS = 1_000  # row ids: 10 + 10 * slot


def _slot(name: str, slots: int) -> int:
    return zlib.crc32(name.encode()) % slots


def row_id(chapter: str) -> int:
    return 10 + 10 * _slot(f"chapter:{chapter}", _ROW_SLOTS)


def playbook_panels(catalog: Catalog) -> dict[str, list[int]]:
    """Detectable playbook id -> the ids of its evidence panels.

    Two playbook ids that hash to the same slot are told apart by taking the next free slot
    in id order, so only the later of the two (alphabetically) moves.
    """
    taken: set[int] = set()
    out: dict[str, list[int]] = {}
    for pb in sorted(catalog.detectable(), key=lambda p: p.id):
        slot = _slot(pb.id, _SLOTS)
        while slot in taken:
            slot = (slot + 1) % _SLOTS
        taken.add(slot)
        base = 100_000 + 10 * slot
        out[pb.id] = [base + e for e in range(min(EVIDENCE_PANELS, len(pb.evidence)))]
    return out


def link(playbook_id: str, catalog: Catalog) -> str | None:
    """Grafana path of the playbook's first evidence panel (relative to Grafana's root)."""
    ids = playbook_panels(catalog).get(playbook_id)
    return f"/d/{PLAYBOOKS_UID}?viewPanel={ids[0]}" if ids else None


assert len({row_id(c) for c in CHAPTERS}) == len(CHAPTERS), "chapter row ids collide"
