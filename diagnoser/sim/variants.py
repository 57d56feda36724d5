"""Held-out variants of library scenarios: other seeds, onsets, magnitudes and vLLM versions.

The library is what the signatures were tuned on, so accuracy on it overstates. A variant
keeps a scenario's story but changes what tuning could have leaned on: the random seed (noise
and arrivals), when the change happens (shifted by minutes), how big it is (the change of every
numeric workload or server knob from its value before the timeline, scaled: a change that sets
a knob back to that value, a recovery, stays a return to it), and the metric names (the
pre-0.11 profile; an SGLang server keeps its one profile, and so does a KV consumer, whose
feature came later).

Engine limits a change sets (``engine.*``: max_num_seqs, max_num_batched_tokens,
max_model_len, gpu_memory_utilization, ...) are settings, not magnitudes, and are kept: an
operator who sets --max-num-seqs 24 gets 24, and a "scaled" 70 would not bind at the
scenario's load, turning the incident into a healthy run labelled as one.
"""

from __future__ import annotations

import copy

from diagnoser.sim.scenario import LIMITS, Change, Scenario, resolve

SHIFTS = (-360.0, 300.0, -180.0, 480.0, -240.0, 120.0, 60.0, -420.0, -300.0, 240.0)  # s
SCALES = (0.8, 1.25, 1.0, 0.9, 1.1, 0.85, 1.2, 0.8, 1.15, 0.95)


def variant(sc: Scenario, k: int) -> Scenario:
    """The ``k``-th variant (k >= 1) of a scenario."""
    out = copy.deepcopy(sc)
    out.name = f"{sc.name}~{k}"
    out.seed = sc.seed + 7919 * k
    shift, scale = SHIFTS[(k - 1) % len(SHIFTS)], SCALES[(k - 1) % len(SCALES)]
    for m in out.models:
        # A server of a disaggregated pair keeps its profile: NIXL's series (0.12) and the
        # prompt tokens it received (0.16) do not exist before, nor does the feature.
        kv_connector = m.engine.kv_consumer or m.engine.kv_producer
        if k % 2 == 1 and m.runtime == "vllm" and not kv_connector:
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


# Aged variants: the same incident, begun hours before the window that is diagnosed.
AGES = (1.0, 3.0, 2.0, 4.0)  # hours before the window; the first two tuned on, the rest held out
# Incidents whose story is one change that lasts (or a cycle that repeats): aging them keeps
# the incident going through the window. An episode that ends (a traffic peak) or a drift over
# hours is another story when aged, so those are not aged; nor is any scenario whose labels
# say an incident ended (``can_age``): aged, it would end hours before its window.
NOT_AGED = frozenset({"kv-cache-pressure", "slower-every-hour"})


def can_age(sc: Scenario) -> bool:
    """Whether aging keeps the scenario's story (see ``NOT_AGED``)."""
    return sc.name not in NOT_AGED and not sc.labels.resolved and not sc.labels.ended


def aged(sc: Scenario, k: int) -> Scenario:
    """The ``k``-th aged variant (k >= 1): its incident began ``AGES[k-1]`` hours before the
    window, after the same stretch of normal service as in the original, with another seed.

    A change that the timeline undoes later (an evaluation job that takes GPU memory for a
    minute every eight) repeats with its period until the end.
    """
    hours = AGES[(k - 1) % len(AGES)]
    out = copy.deepcopy(sc)
    out.name = f"{sc.name}@{hours:g}h"
    out.seed = sc.seed + 104729 * k
    window = sc.labels.window
    onsets = [c.at for m in out.models for c in m.timeline if c.at > 0]
    if not onsets:  # a healthy run: as long as the aged incidents, the same story
        out.duration = sc.duration + hours * 3600
        return out
    out.duration = min(onsets) + hours * 3600 + window
    for m in out.models:
        m.timeline = _repeat_cycles(m.timeline, out.duration)
    return out


def _repeat_cycles(timeline: list[Change], end: float) -> list[Change]:
    """A knob set and reset by turns (a cycle) goes on with the same period until ``end``."""
    knobs: dict[str, list[Change]] = {}
    for c in timeline:
        for knob in c.set:
            knobs.setdefault(knob, []).append(c)
    out = list(timeline)
    for changes in knobs.values():
        if len(changes) < 4 or any(len(c.set) != 1 for c in changes):
            continue
        period = changes[2].at - changes[0].at
        if period <= 0:
            continue
        first, second = changes[0], changes[1]
        t = changes[-1].at + (period if changes[-1].set == second.set else period / 2)
        last = changes[-1]
        while t < end:
            nxt = first if last.set == second.set else second
            out.append(Change(at=t, set=dict(nxt.set), over=nxt.over))
            last = nxt
            t += second.at - first.at if nxt is first else period - (second.at - first.at)
    return sorted(out, key=lambda c: c.at)


# Crash loops: a server that dies and comes back again and again, with nothing but its own
# metrics to see it by (no synthetic probe: the clients' failures are the gateway's 502s).
# (minutes between crashes, seconds to come back, hours begun before the window, DCGM,
# instances); the first four tuned on, the rest held out.
LOOPS = (
    (10.0, 60.0, 0.0, True, 1),
    (10.0, 60.0, 2.0, True, 1),
    (8.0, 30.0, 3.0, False, 1),
    (6.0, 90.0, 1.0, True, 2),
    (12.0, 20.0, 2.0, False, 1),
    (9.0, 120.0, 4.0, True, 1),
)


def restart_loop(sc: Scenario, k: int) -> Scenario:
    """The ``k``-th crash loop (k >= 1) built on a scenario whose model can be pushed out of
    GPU memory (``gpu-memory-contention``): another process takes the memory for a minute,
    the server crashes out of memory, and this repeats every few minutes. Loops without DCGM
    expect no cause named."""
    every, back, age, dcgm, instances = LOOPS[(k - 1) % len(LOOPS)]
    out = copy.deepcopy(sc)
    out.name = f"restart-loop~{k}"
    out.seed = sc.seed + 15485863 * k
    window = sc.labels.window
    normal = 3600.0  # an hour of normal service first
    out.duration = normal + age * 3600 + window
    for m in out.models:
        m.probe.enabled = False
        m.dcgm = dcgm
        m.instances = instances
        m.fault.restart_seconds = back
        m.timeline = []
        t = normal
        while t < out.duration - 60:
            m.timeline.append(Change(at=t, set={"fault.other_process_gb": 12.0}))
            m.timeline.append(Change(at=t + 60, set={"fault.other_process_gb": 0.0}))
            t += every * 60
    if not dcgm:
        # Nothing reads the GPU's memory: the loop is a restart loop in the health, with no
        # cause named (gpu-memory-contention requires the GPU's memory).
        pid = "gpu-memory-contention"
        out.labels.expect = tuple(p for p in out.labels.expect if p != pid)
        out.labels.absent = (*out.labels.absent, pid)
    return out
