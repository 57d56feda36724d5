"""Held-out variants of library scenarios: other seeds, onsets, magnitudes and vLLM versions.

The library is what the signatures were tuned on, so accuracy on it overstates. A variant
keeps a scenario's story but changes what tuning could have leaned on: the random seed (noise
and arrivals), when the change happens (shifted by minutes), how big it is (the change of every
numeric workload or server knob from its value before the timeline, scaled), and the metric
names (the pre-0.11 profile).

Engine limits a change sets (``engine.*``: max_num_seqs, max_num_batched_tokens,
max_model_len, gpu_memory_utilization, ...) are settings, not magnitudes, and are kept: an
operator who sets --max-num-seqs 24 gets 24, and a "scaled" 70 would not bind at the
scenario's load, turning the incident into a healthy run labelled as one.
"""

from __future__ import annotations

import copy

from diagnoser.sim.scenario import LIMITS, Scenario, resolve

SHIFTS = (-360.0, 300.0, -180.0, 480.0, -240.0, 120.0, 60.0, -420.0, -300.0, 240.0)  # s
SCALES = (0.8, 1.25, 1.0, 0.9, 1.1, 0.85, 1.2, 0.8, 1.15, 0.95)


def variant(sc: Scenario, k: int) -> Scenario:
    """The ``k``-th variant (k >= 1) of a scenario."""
    out = copy.deepcopy(sc)
    out.name = f"{sc.name}~{k}"
    out.seed = sc.seed + 7919 * k
    shift, scale = SHIFTS[(k - 1) % len(SHIFTS)], SCALES[(k - 1) % len(SCALES)]
    for m in out.models:
        if k % 2 == 1:
            m.version = "0.8"
        before = copy.deepcopy(m)  # each knob's value before the timeline
        for change in m.timeline:
            if change.at > 0:
                change.at = max(60.0, change.at + shift)
            for knob, new in list(change.set.items()):
                if knob.startswith("engine."):
                    continue
                obj, attr = resolve(before, knob)
                old = getattr(obj, attr)
                numeric = isinstance(new, (int, float)) and not isinstance(new, bool)
                if numeric and isinstance(old, (int, float)) and not isinstance(old, bool):
                    lo, hi = LIMITS.get(attr, (float("-inf"), float("inf")))
                    scaled = min(hi, max(lo, old + (new - old) * scale))
                    change.set[knob] = round(scaled) if isinstance(new, int) else scaled
    return out
