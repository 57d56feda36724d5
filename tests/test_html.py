"""The HTML report: rendered through jinja2 with autoescape, byte-identical to its golden
page where nothing needed escaping, and inert whatever a label value holds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import diagnoser
from diagnoser.lab.replay import Replay
from diagnoser.report import render

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
