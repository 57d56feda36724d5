"""What each engine supports: the documentation's table is the one the signals give, and the
signals say why SGLang lacks what it lacks."""

from __future__ import annotations

from pathlib import Path

from diagnoser.catalog import load_catalog
from diagnoser.metrics.signals import SIGNALS
from diagnoser.outputs.engines import BEGIN, END, SUPPORT_PAGE, playbook_rows, support_table
from diagnoser.site import Site

PAGE = Path(__file__).resolve().parent.parent / SUPPORT_PAGE


def test_the_support_page_table_is_the_generated_one():
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index(BEGIN) : text.index(END) + len(END)] + "\n"
    stale = f"{SUPPORT_PAGE}'s engine table is stale: make generate"
    assert section == support_table(Site.default()), stale


def test_every_signal_sglang_lacks_says_why():
    for sig in SIGNALS:
        assert sig.on("sglang") or sig.gap("sglang"), sig.name


def test_playbooks_needing_finished_reason_are_undecided_on_sglang_and_the_rest_decided():
    rows = {pid: diag for pid, diag, _ in playbook_rows(Site.default(), "sglang")}
    for pid in ("stop-token-mismatch", "max-tokens-truncation"):
        assert rows[pid].startswith("undecided: SGLang exports no finished_reason"), pid
    detectable = [pb.id for pb in load_catalog().detectable()]
    undecided = {p for p in detectable if not rows[p].startswith("yes")}
    assert undecided == {
        "stop-token-mismatch",
        "max-tokens-truncation",
        "kv-cannot-fit-max-model-len",
        "speculative-decoding-misfire",  # SGLang's own speculative families are not mapped
        "kv-transfer-failures",  # SGLang's disaggregation families are not mapped
    }
