"""Held-out variants of library scenarios: other seeds, onsets, magnitudes and vLLM versions.

The library is what the signatures were tuned on, so accuracy on it overstates. A variant
keeps a scenario's story but changes what tuning could have leaned on: the random seed (noise
and arrivals), when the change happens (shifted by minutes), how big it is (the change of every
numeric knob scaled), and the metric names (the pre-0.11 profile).
"""

from __future__ import annotations

import copy

from diagnoser.sim.scenario import LIMITS, Scenario, resolve

SHIFTS = (-360.0, 300.0, -180.0)  # seconds
SCALES = (0.8, 1.25, 1.0)


def variant(sc: Scenario, k: int) -> Scenario:
    """The ``k``-th variant (k >= 1) of a scenario."""
    out = copy.deepcopy(sc)
    out.name = f"{sc.name}~{k}"
    out.seed = sc.seed + 7919 * k
    shift, scale = SHIFTS[(k - 1) % 3], SCALES[(k - 1) % 3]
    for m in out.models:
        if k % 2 == 1:
            m.version = "0.8"
        probe = copy.deepcopy(m)  # to learn each knob's value before each change
        for change in m.timeline:
            if change.at > 0:
                change.at = max(60.0, change.at + shift)
            for knob, new in list(change.set.items()):
                obj, attr = resolve(probe, knob)
                old = getattr(obj, attr)
                numeric = isinstance(new, (int, float)) and not isinstance(new, bool)
                if numeric and isinstance(old, (int, float)) and not isinstance(old, bool):
                    lo, hi = LIMITS.get(attr, (float("-inf"), float("inf")))
                    scaled = min(hi, max(lo, old + (new - old) * scale))
                    change.set[knob] = round(scaled) if isinstance(new, int) else scaled
                setattr(obj, attr, new)
    return out
