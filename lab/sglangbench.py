"""Pieces of the SGLang benchmark (``make bench-sglang``, ``lab.bench.bench_sglang``): the
cases written from SGLang's code diagnosed, and the scenarios with SGLang's token-length
histograms on (``--collect-tokens-histogram``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

Score = tuple[int, int, int]  # incidents right at 1, incidents, findings on healthy runs

if TYPE_CHECKING:
    from diagnoser.sim.scenario import Scenario


def bench_written(ks: Sequence[int], histograms: bool = False) -> Score:
    """AC@1 and AC@3 over the SGLang cases written from SGLang's code, without the
    simulator's engine (``lab.sglang_written``), case ``k`` 0 being the case as written;
    ``histograms``: the server started with ``--collect-tokens-histogram``."""
    import tempfile
    from pathlib import Path

    from lab import sglang_written as W

    end = float(int(time.time()) // 60 * 60 - 120)
    at1 = at3 = n = healthy = 0
    for base in W.cases():
        for k in ks:
            case = W.variant(base, k) if k else base
            with tempfile.TemporaryDirectory() as tmp:
                found = W.diagnose(case, Path(tmp), end, histograms)["findings"]
                ids = [f["id"] for f in found]
            if case.expect is None:
                healthy += len(ids)
                verdict = "ok" if not ids else "FALSE POSITIVE"
            else:
                n += 1
                at1 += ids[:1] == [case.expect]
                at3 += case.expect in ids[:3]
                verdict = "ok" if ids[:1] == [case.expect] else "MISSED"
                verdict = "top-3" if verdict == "MISSED" and case.expect in ids[:3] else verdict
            print(f"  {case.name:<32} {verdict:<14} {', '.join(ids[:3]) or '-'}")
    print(
        f"accuracy over {n} written incidents (k = {', '.join(map(str, ks))}): "
        f"AC@1 {at1}/{n} = {at1 / max(1, n):.2f}, AC@3 {at3}/{n} = {at3 / max(1, n):.2f}, "
        f"findings on healthy cases: {healthy}"
    )
    return at1, n, healthy


def with_token_histograms(sc: Scenario) -> Scenario:
    """The scenario with every SGLang server started with ``--collect-tokens-histogram``."""
    import copy

    out = copy.deepcopy(sc)
    for m in out.models:
        if m.runtime == "sglang":
            m.engine.collect_tokens_histogram = True
    return out
