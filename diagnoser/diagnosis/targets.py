"""Targets belong to models: each vLLM scrape target is attributed to the model it served last
within the lookback, so a target that is down (or restarting) is reported for its model even
when the dead process exports nothing, and the model's scrape health becomes model-level
series (``targets_down``, ``targets_total``) that playbooks and the health summary read."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from diagnoser.metrics import promql as q
from diagnoser.plumbing.source import MetricSource, Series
from diagnoser.site import Site

Target = tuple[str, str]  # (job, instance)
MAX_POINTS = 1000


@dataclass(frozen=True)
class Served:
    """The model (with the site's group labels) a target served last, and when."""

    model: tuple[str, ...]
    last_seen: float


def map_query(site: Site, matchers: Sequence[str] = ()) -> str:
    scope = site.scope(matchers=matchers)
    keys = ", ".join(("job", "instance", *scope.group_labels(), "model_name"))
    return f"group by ({keys}) ({q.serving(scope.matchers)})"


def served(
    source: MetricSource, site: Site, start: float, end: float, matchers: Sequence[str] = ()
) -> tuple[dict[Target, Served], float | None]:
    """Each target's last model over ``[start, end]``, and the first time any was seen. The
    steps are on the grid of whole multiples of the step, wherever the span begins, so a span
    that slid by less than a step (``servediag watch``'s next cycle) asks the same steps and
    reads only its new ones."""
    step = max(15.0, float(np.ceil((end - start) / MAX_POINTS / 15.0) * 15.0))
    start = math.floor(start / step) * step
    out: dict[Target, Served] = {}
    first: float | None = None
    by = site.config.by
    for s in source.query_range(map_query(site, matchers), start, end, step):
        if s.t.size == 0 or "model_name" not in s.labels:
            continue
        first = float(s.t[0]) if first is None else min(first, float(s.t[0]))
        target = (s.labels.get("job", ""), s.labels.get("instance", ""))
        model = tuple(s.labels.get(k, "") for k in by)
        seen = float(s.t[-1])
        if target not in out or seen > out[target].last_seen:
            out[target] = Served(model, seen)
    return out, first


def by_model(
    up: dict[Target, Series], owners: dict[Target, Served]
) -> dict[tuple[str, ...], tuple[Series, Series]]:
    """Per model: (targets down, targets total) at each time of the ``up`` series."""
    grouped: dict[tuple[str, ...], list[Series]] = {}
    for target, s in up.items():
        if target in owners:
            grouped.setdefault(owners[target].model, []).append(s)
    out = {}
    for model, series in grouped.items():
        t = np.unique(np.concatenate([s.t for s in series]))
        down = np.zeros(t.size)
        total = np.zeros(t.size)
        for s in series:
            idx = np.searchsorted(t, s.t)
            ok = np.isfinite(s.v)
            total[idx[ok]] += 1
            down[idx[ok]] += s.v[ok] < 0.5
        labels = {"model_name": model[-1]}
        out[model] = (Series(labels, t, down), Series(labels, t, total))
    return out
