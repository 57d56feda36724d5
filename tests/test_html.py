"""The HTML report: rendered through jinja2 with autoescape, byte-identical to its golden
page where nothing needed escaping, and inert whatever a label value holds."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import diagnoser
from diagnoser.report import render
from lab.replay import Replay

ROOT = Path(__file__).resolve().parent.parent
ANSWERS = ROOT / "tests" / "data" / "answers"
GOLDEN = ROOT / "tests" / "golden"
END = 1793534400.0  # the recordings' end (tests/test_replay.py)
PAGES = ["retrieval-launch", "healthy-steady", "kv-cannot-fit-max-model-len", "batch-slot-limit"]


def _diagnosis(name: str):
    return diagnoser.diagnose(Replay(ANSWERS / f"{name}.json.gz"), since="1h", until=END)


@pytest.mark.parametrize("name", PAGES)
def test_the_html_page_matches_its_golden_file(name):
    page = render(_diagnosis(name), "html")
    path = GOLDEN / f"{name}.html"
    if os.environ.get("UPDATE_GOLDENS"):
        path.write_text(page)
    assert path.exists(), f"{path} missing: run make goldens"
    assert page == path.read_text(), f"{name}: HTML changed; run make goldens and review"


EVIL = "<script>alert(1)</script>\"'</svg>&amp;\x1b]0;x\x07\n</td>"


def test_hostile_values_reach_every_field_of_the_page_inert():
    """A label value, a playbook's words, a warning, a health reason, a caveat: whatever
    holds markup or control characters is shown as text, in every place the page puts it."""
    import dataclasses

    d = _diagnosis("retrieval-launch")
    d.warnings = [EVIL]
    for h in d.health:
        h.scope = {**h.scope, "model_name": EVIL}
        h.reasons = [EVIL]
        h.verdict = "unhealthy"
    m = d.findings[0]
    m.scope = {**m.scope, "model_name": EVIL}
    m.caveats = [EVIL]
    m.explained_by = EVIL
    m.playbook = dataclasses.replace(
        m.playbook, title=EVIL, cause=EVIL, fix=(EVIL,), guardrail=(EVIL,), severity=EVIL
    )
    page = render(d, "html")
    for bad in ("<script>", "</svg>&", "\x1b", "\x07", "'</svg>", "\"'"):
        assert bad not in page, bad
    assert page.count("&lt;script&gt;") >= 8
    assert page.count("<svg") == page.count("</svg>")
    assert len(re.findall(r"<td[ >]", page)) == page.count("</td>")


def test_a_runbook_url_that_is_not_http_is_text_not_a_link():
    d = _diagnosis("retrieval-launch")
    site = d.site
    config = dataclasses_replace(site.config, runbook_url="javascript:alert(document.cookie)//{id}")
    d.site = type(site).build(config, site.catalog)
    page = render(d, "html")
    assert 'href="javascript' not in page and "Runbook: javascript:alert(document.cookie)" in page


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)
