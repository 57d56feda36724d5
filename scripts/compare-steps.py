#!/usr/bin/env python3
"""diagnose each scenario at the planned query step and at the old fixed 15 s step, from one
simulation each: what fitting the step to the window changes in the findings.

    python scripts/compare-steps.py 0 vllm      # the vLLM library itself
    python scripts/compare-steps.py 9,10 vllm   # variants 9 and 10 (kept out of tuning)
    python scripts/compare-steps.py 0 sglang    # also: stack (the serving-stack playbooks)

Simulations are kept in $SERVEDIAG_STEPS_DIR (default /tmp/servediag-steps) between runs.
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path

from diagnoser.diagnosis import Window, diagnose
from diagnoser.diagnosis import window as planning
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.sim.variants import variant
from diagnoser.site import Site
from lab import harness
from lab.bench import serving_stack, sglang_library, vllm_library
from lab.promserver import Prometheus

PLANS = (("15 s", 10**9), ("fitted", planning.MIN_WINDOW_POINTS))  # (name, points)


def main(argv: list[str]) -> int:
    if not argv or len(argv) > 2:
        print(__doc__, file=sys.stderr)
        return 2
    sets = {"vllm": vllm_library, "sglang": sglang_library, "stack": serving_stack}
    which = argv[1] if len(argv) > 1 else "vllm"
    try:
        ks = [int(x) for x in argv[0].split(",")]
    except ValueError:
        print(f"compare-steps: {argv[0]!r}: variants are whole numbers, as 0,9", file=sys.stderr)
        return 2
    if which not in sets:
        print(
            f"compare-steps: no scenario set {which!r} (one of {', '.join(sets)})", file=sys.stderr
        )
        return 2
    base = sets[which]()
    chosen = [sc if k == 0 else variant(sc, k) for k in ks for sc in base]
    root = Path(os.environ.get("SERVEDIAG_STEPS_DIR", "/tmp/servediag-steps"))
    site = Site.default()
    score = {name: [0, 0, 0] for name, _ in PLANS}  # named first, incidents, healthy findings
    changed = 0
    for sc in chosen:
        kept = root / sc.name / "prepared.pkl"
        if not kept.exists():
            prepared = harness.prepare([sc], root / sc.name, workers=1)[sc.name]
            kept.write_bytes(pickle.dumps(prepared))
        prepared = pickle.loads(kept.read_bytes())
        want = "" if sc.labels.healthy else sc.labels.expect[0]
        tops = []
        with Prometheus(prepared.data_dir) as prom:
            for name, points in PLANS:
                planning.MIN_WINDOW_POINTS = points
                window = Window.plan(sc.labels.window, prepared.end)
                t0 = time.perf_counter()
                ids = [
                    m.playbook.id
                    for m in diagnose(PrometheusSource(prom.url), site, window).findings
                ]
                took = time.perf_counter() - t0
                tops.append(
                    f"{name} ({window.step:.0f} s): {', '.join(ids[:2]) or '-'} {took:.1f} s"
                )
                s = score[name]
                if sc.labels.healthy:
                    s[2] += len(ids)
                else:
                    s[0] += bool(ids) and ids[0] == want
                    s[1] += 1
                first = ids[:1]
                if name == PLANS[0][0]:
                    before = first
        flag = "" if first == before else "  <- first finding changed"
        changed += first != before
        print(f"{sc.name:<40} want {want or '(healthy)':<28} {' | '.join(tops)}{flag}", flush=True)
    for name, (at1, n, healthy) in score.items():
        print(f"{name}: AC@1 {at1}/{n}, findings on healthy scenarios {healthy}")
    print(f"first finding changed in {changed} of {len(chosen)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
