"""A hang in PromQL: engines that hold running requests and made no progress (each engine's
module gives its running gauge and the counters that move when a step computes)."""

from __future__ import annotations

from dataclasses import replace

from diagnoser.metrics.promql import Expr, Scope, agg

# The engine's own identity within a server: vLLM's data-parallel rank (``engine``), SGLang's
# (``dp_rank``); absent labels group as empty.
ENGINE_KEYS = ("job", "instance", "engine", "dp_rank")


# A hang is an engine whose counters stood still this long (or over the rate window, if
# shorter): longer than any step, so one long prefill that outputs nothing is not one, and
# short enough that a hang shows within minutes whatever rate window a diagnosis uses.
STALL_WINDOW = "2m"


def stalled(running: Expr, progress: Expr) -> Expr:
    """Engines that hold running requests and made no progress over the last two minutes
    (the rate window, if shorter), counted by the scope (0 where the model is served and
    none is stalled).

    ``running`` and ``progress`` build unaggregated vectors for a scope (in the engine's
    module): the running gauge, and the rates of the counters that move whenever a step
    computes anything. An engine whose counter has too few samples for a rate is not judged
    (it just started), so only a counter seen flat over the whole window counts."""

    def build(scope: Scope) -> str:
        from diagnoser.plumbing.durations import parse_duration

        keys = ", ".join((*scope.by, *(k for k in ENGINE_KEYS if k not in scope.by)))
        try:
            short = parse_duration(scope.window) < parse_duration(STALL_WINDOW)
        except ValueError:  # a Grafana variable such as $__rate_interval
            short = False
        recent = scope if short else replace(scope, window=STALL_WINDOW)
        busy = f"sum by ({keys}) ({running(scope)}) > 0"
        flat = f"sum by ({keys}) ({progress(recent)}) == 0"
        per_engine = f"({busy}) and on ({keys}) ({flat})"
        served = agg("sum", scope, running(scope))
        return f"{agg('count', scope, per_engine)} or {served} * 0"

    return build
