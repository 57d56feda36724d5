"""The front door and the documentation site: the README stays short and its links land, its
table of supported versions names what the reference data and the recordings hold, and no page
types a count of playbooks the catalog does not have."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from diagnoser.site import Site

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
DATA = ROOT / "tests" / "data"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _headings(page: Path) -> list[str]:
    lines, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            lines.append(line.lstrip("#").strip())
    return lines


def _anchor(heading: str) -> str:
    """The id MkDocs (Python-Markdown's toc) gives a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_the_readme_is_a_front_door_of_at_most_300_lines():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


def test_the_readmes_links_land_on_a_file_and_its_heading():
    """The site's own build checks its pages' links (mkdocs build --strict); this, the README's."""
    for target in LINK.findall(README.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), target
        if anchor:
            assert anchor in {_anchor(h) for h in _headings(ROOT / path)}, target


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def _reference(engine: str) -> list[str]:
    """The releases whose metric families were read into tests/data (``vllm-0.33.0.json``)."""
    found = [p.stem.split("-", 1)[1] for p in DATA.glob(f"{engine}-*.json")]
    return sorted(found, key=_version)


def _row(page: Path, engine: str) -> str:
    rows = [ln for ln in page.read_text(encoding="utf-8").splitlines() if ln.startswith("|")]
    return next(ln for ln in rows if ln.startswith(f"| {engine} "))


@pytest.mark.parametrize("page", [README, DOCS / "engines" / "index.md"], ids=_name)
def test_the_versions_table_names_the_releases_the_reference_data_holds(page):
    vllm, sglang = _reference("vllm"), _reference("sglang")
    assert vllm and sglang
    row = _row(page, "vLLM")
    assert f"{vllm[0]} to {vllm[-1]}" in row, row
    assert all(v in row for v in vllm), row
    recorded = {
        json.loads(p.read_text(encoding="utf-8"))["vllm"]
        for p in (DATA / "real").glob("*/provenance.json")
    }
    assert recorded and all(f"vLLM {v}" in row for v in recorded), (recorded, row)
    row = _row(page, "SGLang")
    assert all(v in row for v in sglang), row
    assert all(".".join(v.split(".")[:2]) in row for v in sglang), row


def _counts() -> dict[str, int]:
    catalog = Site.default().catalog
    return {
        "playbooks": len(catalog),
        "detectable": len(catalog.detectable()),
        "advisory": len(catalog.advisory()),
        "with alerts": sum(1 for pb in catalog if pb.alert is not None),
    }


# "27 playbooks", "23 detectable", "4 advisory", "23 with alerts": as catalog list and the
# demo print them, and as a page would type them.
COUNT = re.compile(r"\b(\d+) (playbooks|detectable|advisory|with alerts)\b")


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_a_count_of_playbooks_on_a_page_is_the_catalogs(page):
    counts = _counts()
    for number, what in COUNT.findall(page.read_text(encoding="utf-8")):
        assert int(number) == counts[what], f"{_name(page)}: {number} {what}, not {counts[what]}"


def test_every_page_is_in_the_sites_navigation():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, page
