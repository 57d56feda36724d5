"""See what a scenario looks like in Prometheus: every signal before and after its changes.

``python -m lab.inspect SCENARIO [SIGNAL ...]`` simulates the scenario, backfills
it into a throwaway Prometheus and prints each signal per model at several points of the
last ``labels.window`` and of the hour before it. For authoring and tuning scenarios.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from diagnoser.metrics.exposition import write_openmetrics
from diagnoser.metrics.signals import SIGNALS
from diagnoser.sim import library
from diagnoser.sim.run import simulate
from lab.promserver import Prometheus, backfill

DEFAULT = [
    "request_rate",
    "prompt_tokens_per_request",
    "prompt_tokens_p50",
    "prompt_tokens_p99",
    "generation_tokens_per_request",
    "finished_length_share",
    "ttft_p95",
    "ttft_p99",
    "itl_p50",
    "itl_p95",
    "itl_p99",
    "e2e_p95",
    "queue_time_mean",
    "prefill_time_mean",
    "frontend_time_mean",
    "prefill_seconds_per_prompt_token",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "preemptions_rate",
    "long_prefills_rate",
    "api_server_cpu",
    "http_4xx_share",
    "http_5xx_share",
    "engine_restarts",
    "gpu_utilization",
    "gpu_memory_used_share",
    "probe_ttft_p95",
    "ttft_outside_engine",
    "probe_error_share",
]


def main(argv: list[str]) -> int:
    if not argv:
        print(
            f"usage: python -m lab.inspect SCENARIO [SIGNAL ...]\n"
            f"scenarios: {', '.join(library.names())}",
            file=sys.stderr,
        )
        return 2
    from diagnoser.plumbing.errors import UserError
    from lab.args import one_of, refuse

    prog = "python -m lab.inspect"
    try:
        sc = library.find(argv[0])
    except (UserError, OSError) as exc:
        refuse(prog, f"scenario {exc}")
    names = argv[1:] or DEFAULT
    one_of(prog, "signal", names, sorted(SIGNALS.names()))
    end = float(int(time.time()) // 60 * 60)
    t0 = time.monotonic()
    rec = simulate(sc, end)
    sim_s = time.monotonic() - t0
    window = sc.labels.window
    offsets = [window + 3600, window + 1800, window, window * 2 / 3, window / 3, 0]
    with tempfile.TemporaryDirectory() as tmp:
        om = Path(tmp) / "s.om"
        with om.open("w") as fh:
            write_openmetrics(rec, fh)
        backfill(om, Path(tmp) / "data")
        with Prometheus(Path(tmp) / "data") as prom:
            print(
                f"{sc.name}: simulated in {sim_s:.1f} s; expect {list(sc.labels.expect)}, "
                f"absent {list(sc.labels.absent)}; window {window / 60:g} min"
            )
            heads = "  ".join(f"{'-' + _ago(o) if o else 'end':>9}" for o in offsets)
            print(f"{'signal':34} {'model':24} {heads}")
            for name in names:
                rows: dict[str, list[str]] = {}
                for k, off in enumerate(offsets):
                    for r in prom.query(SIGNALS[name].render(), at=end - off):
                        key = r["metric"].get("model_name") or r["metric"].get("instance", "")
                        extra = r["metric"].get("prompt_bucket")
                        key = f"{key}/{extra}" if extra else key
                        rows.setdefault(key, ["-"] * len(offsets))[k] = _fmt(r["value"][1])
                if not rows:
                    print(f"{name:34} (no data)")
                for key, vals in sorted(rows.items()):
                    print(f"{name:34} {key[-24:]:24} " + "  ".join(f"{v:>9}" for v in vals))
    return 0


def _ago(seconds: float) -> str:
    return f"{seconds / 3600:g}h" if seconds >= 3600 else f"{seconds / 60:g}m"


def _fmt(raw: str) -> str:
    v = float(raw)
    if v != v:
        return "NaN"
    if abs(v) >= 1000:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
