"""Findings that ended: every renderer shows a finding whose pattern stopped holding inside
the window after the current ones, with when it held, how long and the word resolved, and
never as the likely cause; an incident that ended before the window gets one line.

The diagnoses are the recorded batch-slot-limit answers (tests/data/answers) with their
findings' ends set by hand: 11:43-11:50 UTC in a window of 11:00-12:00 UTC.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pytest

import diagnoser
from diagnoser.diagnosis.match import Match
from diagnoser.diagnosis.model import Diagnosis
from diagnoser.report import render
from diagnoser.report.chat import message
from diagnoser.report.explain import explain
from lab.replay import Replay

ANSWERS = Path(__file__).resolve().parent / "data" / "answers"
END = 1793534400.0  # the recordings' end, 2026-11-01T12:00:00Z
ONSET, ENDED = END - 1020, END - 600  # 11:43 and 11:50 UTC
NO_CAUSE = "No current cause: the incidents below ended in the window."
EVIL = "<script>x</script> <!channel> @all\x1b[2J"


def _ended(m: Match, onset: float, end: float) -> Match:
    assert m.periods is not None
    return dataclasses.replace(m, periods=dataclasses.replace(m.periods, onset=onset, end=end))


@pytest.fixture(scope="module")
def recorded() -> Diagnosis:
    d = diagnoser.diagnose(Replay(ANSWERS / "batch-slot-limit.json.gz"), since="1h", until=END)
    assert [m.playbook.id for m in d.findings] == ["batch-slot-limit", "queue-saturation"]
    return d


def _diagnosis(recorded: Diagnosis, resolved: int, before: bool = False) -> Diagnosis:
    """The recorded diagnosis with its last ``resolved`` findings ended at 11:50 UTC, and with
    ``before``, a batch-slot-limit that ended at 10:40 UTC, before the window."""
    keep = len(recorded.findings) - resolved
    d = dataclasses.replace(
        recorded,
        findings=list(recorded.findings[:keep]),
        resolved=[_ended(m, ONSET, ENDED) for m in recorded.findings[keep:]],
        ended_before=[_ended(recorded.findings[0], END - 5340, END - 4800)] if before else [],
        _indexes={},
    )
    return d


def test_text_shows_a_resolved_finding_after_the_likely_cause(recorded):
    out = render(_diagnosis(recorded, 1), "text")
    assert "1. LIKELY CAUSE: " in out and "ALSO POSSIBLE" not in out
    assert out.index("LIKELY CAUSE") < out.index(
        "\n2. queue-saturation: 11:43-11:50 UTC, 7 min, resolved\n"
    )
    block = out.split("2. queue-saturation:")[1].split("\n\n")[0]
    assert "evidence: requests_waiting at 6" in block
    assert "runbook: https://" in block and "runbooks/queue-saturation.md" in block
    assert "fix:" not in block and "guardrail:" not in block and "cause:" not in block
    assert "Ended just before" not in out


def test_text_of_a_window_whose_findings_all_ended_has_no_likely_cause(recorded):
    out = render(_diagnosis(recorded, 2, before=True), "text")
    assert "LIKELY CAUSE" not in out and "ALSO POSSIBLE" not in out
    assert NO_CAUSE in out
    assert "no known problem pattern explains it" not in out and "nearest" not in out
    assert "1. batch-slot-limit: 11:43-11:50 UTC, 7 min, resolved" in out
    assert "2. queue-saturation: 11:43-11:50 UTC, 7 min, resolved" in out
    assert "Ended just before the window: batch-slot-limit (10:31-10:40 UTC)." in out


def test_a_current_window_reads_as_before(recorded):
    """A diagnosis with nothing ended renders byte for byte as it did (the goldens hold the
    rest)."""
    d = _diagnosis(recorded, 0)
    for fmt in ("text", "markdown", "html"):
        assert render(d, fmt) == render(recorded, fmt)


def test_markdown_shows_resolved_findings_and_no_cause(recorded):
    out = render(_diagnosis(recorded, 2, before=True), "markdown")
    assert f"**{NO_CAUSE}**" in out
    assert "### 1. Resolved: " in out and "(`batch-slot-limit`)" in out
    assert "### 2. Resolved: " in out
    assert "- **Resolved:** 11:43-11:50 UTC, 7 min (2026-11-01T11:43:00Z to" in out
    assert "**Fix.**" not in out and "**Guardrail.**" not in out
    assert "Runbook: https://" in out
    assert "Ended just before the window: batch-slot-limit (10:31-10:40 UTC)." in out
    assert "No known problem pattern" not in out
    mixed = render(_diagnosis(recorded, 1), "markdown")
    assert mixed.count("**Fix.**") == 1 and "### 2. Resolved: " in mixed


def test_html_shows_resolved_findings_marked_where_they_ended(recorded):
    page = render(_diagnosis(recorded, 2, before=True), "html")
    assert 'class="finding top"' not in page
    assert page.count('class="finding resolved"') == 2
    assert "11:43-11:50 UTC, 7 min, resolved" in page and NO_CAUSE in page
    assert ">ended</text>" in page and "<b>Fix.</b>" not in page
    assert "Ended just before the window: batch-slot-limit (10:31-10:40 UTC)." in page
    mixed = render(_diagnosis(recorded, 1), "html")
    assert mixed.count('class="finding top"') == 1 and "2. Resolved: " in mixed


def test_json_keeps_findings_current_and_lists_what_ended(recorded):
    doc = json.loads(render(_diagnosis(recorded, 1, before=True), "json"))
    (current,) = doc["findings"]
    assert current["id"] == "batch-slot-limit"
    assert current["resolved_at"] is None and current["duration_seconds"] is None
    (ended,) = doc["resolved"]
    assert ended["id"] == "queue-saturation"
    assert ended["resolved_at"] == "2026-11-01T11:50:00Z" and ended["duration_seconds"] == 420.0
    assert set(ended) == set(current)
    assert doc["ended_before_window"] == [
        {
            "id": "batch-slot-limit",
            "scope": {"model_name": "llama-3.1-8b-instruct"},
            "onset": "2026-11-01T10:31:00Z",
            "resolved_at": "2026-11-01T10:40:00Z",
        }
    ]
    assert "cause" not in doc["health"][0]


def test_json_of_a_window_whose_findings_all_ended(recorded):
    doc = json.loads(render(_diagnosis(recorded, 2), "json"))
    assert doc["findings"] == [] and len(doc["resolved"]) == 2
    # Unhealthy at its end with every finding ended: nothing found explains the state now.
    assert doc["health"][0]["verdict"] == "unhealthy"
    assert doc["health"][0]["cause"] == "unknown" and "nearest" in doc["health"][0]
    assert doc["health"][0]["resolved"] == ["batch-slot-limit", "queue-saturation"]


def test_csv_and_the_frame_give_resolved_at_after_the_current_findings(recorded):
    d = _diagnosis(recorded, 1)
    rows = list(csv.DictReader(io.StringIO(render(d, "csv"))))
    header = list(rows[0])
    assert header[-1] == "resolved_at"  # last: the columns before it keep their places
    ids = [(r["rank"], r["id"], r["resolved_at"]) for r in rows]
    assert ids == sorted(ids, key=lambda x: int(x[0]))
    assert {x for x in ids if x[1] == "batch-slot-limit"} == {("1", "batch-slot-limit", "")}
    assert {x for x in ids if x[1] == "queue-saturation"} == {
        ("2", "queue-saturation", "2026-11-01T11:50:00Z")
    }
    pd = pytest.importorskip("pandas")
    frame = d.findings_frame()
    assert str(frame["resolved_at"].dtype).startswith("datetime64")
    assert frame.loc[frame["id"] == "batch-slot-limit", "resolved_at"].isna().all()
    assert (
        frame.loc[frame["id"] == "queue-saturation", "resolved_at"]
        == pd.Timestamp("2026-11-01T11:50:00Z")
    ).all()
    assert recorded.findings_frame()["resolved_at"].isna().all()


def _record(playbook: str) -> dict:
    return {
        "alert": "VllmRequestQueueSaturated",
        "severity": "warning",
        "summary": "Requests are queueing.",
        "playbook": playbook,
        "runbook_url": f"https://rb/{playbook}",
        "scope": {"model_name": "llama-3.1-8b-instruct"},
        "since_seconds": 3600.0,
        "playbook_rank": None,
        "explained_by": None,
        "error": None,
    }


def test_the_chat_message_says_the_alerts_pattern_ended(recorded):
    d = _diagnosis(recorded, 2, before=True)
    assert d.for_alert("batch-slot-limit") == []  # nothing that ended ranks as a cause
    assert d.resolved_of("batch-slot-limit") is d.resolved[0]
    text = message(_record("batch-slot-limit"), d, d.site)
    assert f"*Diagnosis:* {NO_CAUSE}" in text
    assert "*Fix:*" not in text and "no known problem pattern" not in text
    assert "*Resolved in the window:*" in text
    assert "batch-slot-limit: 11:43-11:50 UTC, 7 min, resolved (requests_waiting" in text
    assert "|runbook>" in text
    assert "`batch-slot-limit` (its pattern ended at 11:50 UTC: resolved):" in text
    assert "Ended just before the window: batch-slot-limit (10:31-10:40 UTC)." in text


def test_the_chat_message_ranks_the_current_cause_over_a_resolved_symptom(recorded):
    d = _diagnosis(recorded, 1)
    assert [m.playbook.id for m in d.for_alert("queue-saturation")] == ["batch-slot-limit"]
    text = message(_record("queue-saturation"), d, d.site)
    assert "*Diagnosis:* The running batch" in text and "`batch-slot-limit`" in text
    assert "`queue-saturation` (its pattern ended at 11:50 UTC: resolved):" in text
    assert d.resolved_of("batch-slot-limit") is None  # current, not resolved


def test_what_ended_is_shown_inert_wherever_a_label_value_goes(recorded):
    d = _diagnosis(recorded, 2, before=True)
    d.scopes = [*d.scopes, {"model_name": EVIL}]
    m = d.ended_before[0]
    d.ended_before = [dataclasses.replace(m, scope={"model_name": EVIL})]
    d.resolved[1] = dataclasses.replace(d.resolved[1], scope={"model_name": EVIL})
    d._indexes.clear()
    assert "\x1b" not in render(d, "text") and "\\x1b[2J" in render(d, "text")
    for fmt in ("markdown", "html"):
        out = render(d, fmt)
        assert "<script>" not in out and "\x1b" not in out, fmt
    chat = message(_record("batch-slot-limit"), d, d.site)
    assert "<!channel>" not in chat and "<script>" not in chat and "\x1b" not in chat


def test_explain_says_when_a_finding_ended(recorded):
    out = explain(_diagnosis(recorded, 2, before=True), "batch-slot-limit")
    assert "MATCHED, confidence 76%, ended in the window at 11:50 UTC (resolved)" in out
    assert "ended before the window at 10:40 UTC (resolved)" in out


NO_SERIES = "No vLLM series in the window: nothing to diagnose"


def test_every_report_says_a_window_without_series_has_nothing_to_diagnose(recorded):
    """Missing data is not health: where no scope had a series, no report says that no
    pattern matched, and each says what the text report says."""
    empty = dataclasses.replace(
        recorded, findings=[], scopes=[], health=[], data={}, undecided=[], _indexes={}
    )
    for fmt in ("text", "markdown", "html"):
        out = render(empty, fmt)
        assert NO_SERIES in out and "No known problem pattern" not in out, fmt
    text = message(_record("batch-slot-limit"), empty, empty.site)
    assert f"*Diagnosis:* {NO_SERIES}" in text and "no playbook matched" not in text
    # Where every scope was idle, each says so, as in the text report.
    idle = dataclasses.replace(recorded, findings=[], idle=list(recorded.scopes), _indexes={})
    idle.health = [dataclasses.replace(h, verdict="idle") for h in recorded.health]
    text = message(_record("batch-slot-limit"), idle, idle.site)
    assert "no traffic in the window" in text and "no playbook matched" not in text
    assert "No known problem pattern" not in render(idle, "markdown")
