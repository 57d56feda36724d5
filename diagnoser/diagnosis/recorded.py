"""Reading the site's recording rules in place of the servers' own series (``--recorded-rules``).

``servediag generate`` writes a recording rule for every model-level signal
(``model_name:vllm_time_to_first_token_seconds:p95_rate5m``: the signal's expression at
5-minute rates, evaluated by Prometheus every interval). Where a site deploys them, they
hold one series per model (and group) where the expression reads every instance's buckets:
on a fleet of hundreds of instances, a day of the recorded p95 is a few thousand points per
model, not the buckets of every instance, each read again for every step whose rate covers
it.

A signal is read from its rule only where that gives what the expression would:

- the rule's expression is the one this site renders for the signal (an SLO attainment read
  at bounds the servers were found to have, or at a model's overridden threshold, is not);
- the window's rates are at least the rules' five minutes (a window of minutes, read at
  shorter rates, is not: the rule's five minutes would blur it); a longer window's rates (a
  day: 8 minutes) are read at the rules' five, sampled at the window's step, which is shorter
  than five minutes, so no stretch goes unseen;
- every matcher is on a label the recorded series keep (the model grouping's): a
  ``cluster="east"`` or ``instance=`` matcher selects raw series only;
- the rules' series begin no later than the servers' within what is read (the baseline and
  the window): rules deployed since the baseline began would leave it empty. The request rate's
  record stands for all of them (one file, deployed at once), against the request rate itself
  (a counter's few series per server, not the histograms' buckets).

The rest is read as it always is. Whether the deployed rules are the ones this site's
``servediag generate`` writes is the site's to keep so; the names say which signal and window
each holds.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ParamSpec

from diagnoser.diagnosis.window import Window
from diagnoser.metrics.promql import matcher_label, selector
from diagnoser.metrics.signals import Signal
from diagnoser.plumbing.durations import iso, parse_seconds
from diagnoser.plumbing.source import MetricSource, OverLimit
from diagnoser.site import Site

RULE_WINDOW = "5m"
# The signal whose recorded series says since when the rules have been evaluated.
COVERAGE = "request_rate"
P = ParamSpec("P")


@dataclass
class Plan:
    """The record each signal is read from (by signal name), and why none is, when none."""

    records: dict[str, str] = field(default_factory=dict)
    reason: str | None = None
    queries: int = 0  # the queries asking which records the store holds, and since when
    seconds: float = 0.0  # their time


def level_of(site: Site) -> str:
    return "_".join(site.config.by)


def probe(site: Site) -> str:
    """One instant query for the names of the model-level records the store holds."""
    return f'group by (__name__) ({{__name__=~"{level_of(site)}:.+"}})'


def _timed(fn: Callable[P, Plan]) -> Callable[P, Plan]:
    """``fn``'s plan with the seconds its queries took; a sample limit they meet names them."""

    @functools.wraps(fn)
    def timed(*args: P.args, **kwargs: P.kwargs) -> Plan:
        t0 = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
        except OverLimit as exc:  # which query, so that on-call knows what to narrow
            raise exc.about("the recording rules' series (--recorded-rules)") from None
        out.seconds = time.perf_counter() - t0
        return out

    return timed


@_timed
def plan(
    source: MetricSource,
    site: Site,
    rules_site: Site,
    signals: Sequence[Signal],
    window: Window,
    matchers: Sequence[str] = (),
) -> Plan:
    """Which of ``signals`` to read from their recording rules (see the module's docstring).
    ``rules_site``: the site as ``servediag generate`` renders it (``site`` may read some
    thresholds at the bounds the servers were found to have)."""
    if parse_seconds(window.rate_window) < parse_seconds(RULE_WINDOW):
        return Plan(reason=f"the window's rates ({window.rate_window}) are under the rules' 5m")
    outside = {matcher_label(m) for m in matchers} - set(site.config.by)
    if outside:
        return Plan(reason=f"the recorded series have no {', '.join(sorted(outside))} label")
    held = {s.labels.get("__name__", "") for s in source.query(probe(site), window.end)}
    queries = 1
    sig = site.vocabulary[COVERAGE]
    name = sig.record_name(site.config.by, RULE_WINDOW)
    if name in held:
        queries += 2
        began = _first(source, f"count({selector(name, tuple(matchers))})", window)
        served = _first(
            source,
            f"count({sig.render(site.scope(sig, window=window.rate_window, matchers=matchers))})",
            window,
        )
        if served is not None and (began is None or began > served + 2 * window.step):
            reason = (
                f"the recording rules' series begin at {iso(began)}, after the servers' at "
                f"{iso(served)}"
                if began is not None
                else f"the recording rules' series are not in the window, the servers' are "
                f"from {iso(served)}"
            )
            return Plan(reason=reason, queries=queries)
    records: dict[str, str] = {}
    for sig in signals:
        if sig.target_level or sig.attributed:
            continue
        name = sig.record_name(site.config.by, RULE_WINDOW)
        if name not in held:
            continue
        ours = sig.render(site.scope(sig, window=RULE_WINDOW))
        if ours != sig.render(rules_site.scope(sig, window=RULE_WINDOW)):
            continue
        records[sig.name] = name
    if not records:
        return Plan(reason="no recording rule of this site's signals is held", queries=queries)
    return Plan(records, queries=queries)


def _first(source: MetricSource, expr: str, window: Window) -> float | None:
    """The first step of the window's span at which ``expr`` has a value. A time the source
    answered outside the span asked for (a point at 1e18 s) is none of its steps."""
    times = [
        float(t.min())
        for s in source.query_range(expr, window.first, window.end, window.step)
        if (t := s.t[(s.t >= window.first) & (s.t <= window.end)]).size
    ]
    return min(times) if times else None
