"""SGLang cases written by hand from SGLang's code (``docs/sglang-semantics.md``), not by the
simulator: each is written into a real Prometheus and diagnosed as a user would."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from lab import sglang_written as W

CASES = W.cases()


@pytest.fixture(scope="module")
def end() -> float:
    return float(int(time.time()) // 60 * 60 - 120)


@pytest.mark.prometheus
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_hand_written_sglang_case_is_diagnosed(case: W.Case, end: float, tmp_path: Path):
    found = W.diagnose(case, tmp_path, end)
    ids = [f["id"] for f in found["findings"]]
    if case.expect is None:
        assert ids == [], ids
        assert [h["verdict"] for h in found["health"]] == ["healthy"]
    else:
        assert ids[:1] == [case.expect], ids


def test_a_variant_tells_the_same_story_on_another_server():
    """Variants change the server, the rates, the lengths, the onset and the draws, from k
    alone; what changes at the onset still changes the same way."""
    by_name = {c.name: c for c in CASES}
    shift = by_name["prompt-length-shift"]
    a, b = W.variant(shift, 9), W.variant(shift, 9)
    assert a == b  # from k alone
    others = [W.variant(shift, k) for k in range(1, 11)]
    assert len({(v.server, v.seed, v.onset_minutes) for v in others}) == 10
    for v in others:
        assert v.after["prompt"] > 3 * v.before["prompt"]
        assert v.after["rate"] == v.before["rate"]
    steady = W.variant(by_name["healthy"], 9)
    assert steady.after == steady.before
    spike = W.variant(by_name["prefill-interference"], 10)
    assert "long_rate" not in spike.before and spike.after["long_prompt"] > 10_000
