"""Speculative decoding in the simulated engine: per sequence and step, the drafter proposes
``k`` tokens and the target model accepts the run of them before the first miss, each with
the sequence's acceptance (its traffic's ``draft_acceptance``), and adds its own token. The
counters follow ``SpecDecodingStats.observe_draft`` (vllm/v1/spec_decode/metrics.py): one
draft per request and step with a draft, ``k`` draft tokens, the accepted ones, and the
accepted ones by position (position i when the first i + 1 were)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from diagnoser.sim.batch import Batch
    from diagnoser.sim.engine_stats import EngineStats


def speculate(
    rng: np.random.Generator, run: Batch, k: int, steps: int, st: EngineStats
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``steps`` speculative steps of the running sequences ``run``, counted into ``st``.
    Returns each sequence's tokens, the steps it took part in (to its last token), and the
    tokens output at each step."""
    n = len(run)
    left = run.target - run.generated
    # Accepted draft tokens: leading successes of k Bernoulli trials, per sequence and step.
    hits = rng.random((n, steps, k)) < run.accept[:, None, None]
    # A position counts while every draft token up to it was accepted (k passes over the
    # sequences and steps, cheaper than a cumulative product over the whole array).
    leading = hits[..., 0].copy()
    accepted = leading.astype(np.int64)
    for pos in range(1, k):
        leading &= hits[..., pos]
        accepted += leading
    made = np.cumsum(accepted + 1, axis=1)
    # The step in which each sequence reaches its last token (steps if it does not).
    active = np.ones((n, steps), dtype=bool)
    active[:, 1:] = made[:, :-1] < left[:, None]
    taken = active.sum(axis=1)
    got = np.minimum(made[:, -1], left)
    out = np.where(active, accepted + 1, 0)
    last = np.arange(n), taken - 1
    out[last] -= made[last] - np.minimum(made[last], left)  # past the answer's end: discarded
    drafted = accepted[active]
    drafts = int(active.sum())
    st.drafts += drafts
    st.draft_tokens += drafts * k
    st.accepted += int(drafted.sum())
    if st.accepted_per_pos.size != k:
        st.accepted_per_pos = np.zeros(k)
    # Drafts that accepted more than i tokens, for each position i: all but those that
    # accepted i or fewer.
    st.accepted_per_pos += drafted.size - np.cumsum(np.bincount(drafted, minlength=k + 1))[:k]
    return got, taken, out.sum(axis=0).astype(np.float64)
