"""Every "In production" line and every scenario of the seed maps to exactly one playbook.

The seed's lines come from tests/data/seed-lines.json; test_reference_data checks that file
against the seed itself when the design material is beside the checkout."""

from __future__ import annotations

import re

import pytest
from conftest import data_json

CHAPTER_TITLES = {
    "tokens": "Models read tokens, not words.",
    "prefill-decode": "Prefill fills the KV cache. Decode reads it.",
    "attention": "Why keep the Keys and Values?",
    "latency": "The anatomy of \u201cit feels slow\u201d.",
    "batching": "Static vs continuous batching: a race.",
    "memory": "The GPU memory budget.",
}


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _design_ids() -> set[str]:
    ids = data_json("design-ids.json")
    return {*ids["detectable"], *ids["advisory"]}


@pytest.fixture(scope="module")
def seed() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The seed's lines as extracted into tests/data (scripts/extract-reference)."""
    raw = data_json("seed-lines.json")
    return [tuple(x) for x in raw["symptoms"]], [tuple(x) for x in raw["scenarios"]]


def test_the_seed_parses_into_four_symptoms_per_chapter(seed):
    symptoms, scenarios = seed
    assert len(symptoms) == 24
    assert len(scenarios) == 6
    assert {c for c, _ in symptoms} == set(CHAPTER_TITLES.values())
    assert symptoms[2][1].startswith("Many answers stop at")


def test_every_seed_symptom_maps_to_exactly_one_playbook(seed, catalog):
    symptoms, _ = seed
    owners: dict[str, list[str]] = {}
    for pb in catalog:
        for s in pb.seed_symptoms:
            owners.setdefault(_norm(s), []).append(pb.id)
    unmapped = [s for _, s in symptoms if _norm(s) not in owners]
    assert not unmapped, f"seed symptoms with no playbook: {unmapped}"
    doubled = {s: ids for s, ids in owners.items() if len(ids) > 1}
    assert not doubled, f"seed symptoms claimed by several playbooks: {doubled}"
    unknown = set(owners) - {_norm(s) for _, s in symptoms}
    assert not unknown, f"playbooks cite symptoms the seed does not have: {unknown}"


def test_every_seed_scenario_maps_to_exactly_one_playbook(seed, catalog):
    _, scenarios = seed
    owners = [pb.id for pb in catalog for _, sc in scenarios if pb.seed_scenario == sc]
    assert len(owners) == 6, owners
    cited = {pb.seed_scenario for pb in catalog if pb.seed_scenario}
    assert cited == {sc for _, sc in scenarios}


def test_a_playbook_chapter_is_the_chapter_of_its_main_seed_line(seed, catalog):
    symptoms, _ = seed
    chapter_of = {_norm(s): c for c, s in symptoms}
    for pb in catalog:
        if pb.id not in _design_ids():
            continue  # added after the design: no seed line (see the test below)
        chapters = {chapter_of[_norm(s)] for s in pb.seed_symptoms}
        assert CHAPTER_TITLES[pb.chapter] in chapters, (pb.id, chapters)


def test_only_playbooks_added_after_the_design_cite_no_seed_line(catalog):
    """The design's playbooks each come from seed lines; one added later from a pattern met
    on a real server (not an id of the design) cites none."""
    design = _design_ids()
    for pb in catalog:
        assert bool(pb.seed_symptoms) == (pb.id in design), pb.id
