"""SGLang cases written by hand from SGLang's code (``docs/sglang-semantics.md``), not by the
simulator: each is written into a real Prometheus and diagnosed as a user would."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from diagnoser.lab import sglang_written as W

CASES = W.cases()


@pytest.fixture(scope="module")
def end() -> float:
    return float(int(time.time()) // 60 * 60 - 120)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hand_written_sglang_case_is_diagnosed(case: W.Case, end: float, tmp_path: Path):
    found = W.diagnose(case, tmp_path, end)
    ids = [f["id"] for f in found["findings"]]
    if case.expect is None:
        assert ids == [], ids
        assert [h["verdict"] for h in found["health"]] == ["healthy"]
    else:
        assert ids[:1] == [case.expect], ids
