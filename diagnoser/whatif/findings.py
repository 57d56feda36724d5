"""What-if on a diagnosis (``diagnose --what-if``): each finding whose fix has levers gets
what-if's predictions for its model over the diagnosed window.

One what-if per model scope (the model and its group labels): the window is fitted and the
replay calibrated once, and the levers of every finding about that model are replayed
together; each finding then carries its own levers' predictions. A what-if that cannot be
made (too little traffic to fit, a model shape nobody knows, SGLang, a calibration that
refuses, the source failing) is said on each finding it concerns, with the reason, and the
diagnosis stands as it is: its exit status does not change.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from diagnoser.diagnosis.model import Diagnosis, ScopeKey, covers, scope_key
from diagnoser.plumbing.printable import printable

MAX_REASON = 500  # characters of a reason a what-if was not made

if TYPE_CHECKING:
    from diagnoser.catalog.levers import Lever
    from diagnoser.diagnosis.match import Match
    from diagnoser.plumbing.source import MetricSource
    from diagnoser.site import Site
    from diagnoser.whatif.setup import SetupOptions


def attach(d: Diagnosis, source: MetricSource, site: Site, setup: SetupOptions) -> None:
    """Fill ``d.what_if``: each finding's what-if object (None where its fix has no levers)."""
    from diagnoser.catalog.levers import parse_lever

    d.what_if = {}
    by_model: dict[ScopeKey, list[Match]] = {}
    for m in d.findings:
        if not m.playbook.levers:
            d.what_if[(m.playbook.id, scope_key(m.scope))] = None
            continue
        by_model.setdefault(scope_key(_model_scope(d, m)), []).append(m)
    for key, found in by_model.items():
        levers: dict[str, Lever] = {}
        for m in found:
            for text in m.playbook.levers:
                lever = parse_lever(text)  # the catalog's loader checked them
                levers.setdefault(lever.text, lever)
        doc, error = _one(d, source, site, setup, dict(key), list(levers.values()))
        for m in found:
            mine = [parse_lever(t) for t in m.playbook.levers]
            d.what_if[(m.playbook.id, scope_key(m.scope))] = _for_finding(
                doc, error, dict(key), mine
            )


def _model_scope(d: Diagnosis, m: Match) -> dict[str, str]:
    """The model scope a finding is about (a target's finding: its model's)."""
    within = [s for s in d.scopes if covers(s, m.scope)]
    return max(within, key=len) if within else dict(m.scope)


def _one(
    d: Diagnosis,
    source: MetricSource,
    site: Site,
    setup: SetupOptions,
    scope: dict[str, str],
    levers: list[Lever],
) -> tuple[dict[str, Any] | None, str | None]:
    """The what-if's JSON object for one model scope, or why there is none: whatever goes
    wrong in it (an answer it cannot use included) is that reason, one line, and never the
    diagnosis's concern."""
    from diagnoser.metrics.promql import matcher
    from diagnoser.plumbing.errors import UserError
    from diagnoser.plumbing.source import SourceError, deadline_of, sharing_deadline
    from diagnoser.whatif.predict import LATE
    from diagnoser.whatif.replay import ReplayError
    from diagnoser.whatif.report import to_json
    from diagnoser.whatif.setup import predict

    if "model_name" not in scope:
        return None, "the finding's scope names no model (model_name)"
    deadline = deadline_of(source)
    if deadline is not None and time.monotonic() >= deadline:
        return None, LATE
    group = tuple(matcher(k, v) for k, v in sorted(scope.items()) if k != "model_name")
    window = (d.window.start, d.window.end)
    try:
        w = predict(
            sharing_deadline(source),
            site,
            scope,
            window,
            (*site.config.selector, *group),
            setup,
            levers,
        )
        doc = to_json(w)
    except (UserError, SourceError, ReplayError) as exc:
        return None, _one_line(str(exc))
    except Exception as exc:  # a what-if never takes the diagnosis down
        return None, _one_line(f"the what-if failed: {type(exc).__name__}: {exc}")
    cal = w.calibration
    if cal.ok:
        return doc, None
    return doc, cal.reason if cal.late else f"the calibration refused: {cal.reason}"


def _one_line(text: str) -> str:
    """A reason as one printable line of at most ``MAX_REASON`` characters."""
    return printable(" ".join(text.split()))[:MAX_REASON]


def _for_finding(
    doc: dict[str, Any] | None, error: str | None, scope: dict[str, str], levers: list[Lever]
) -> dict[str, Any]:
    """The model's what-if with only the finding's levers, and ``error``: why nothing is
    predicted (null when the levers were replayed)."""
    texts = [lever.text for lever in levers]
    if doc is None:
        return {
            "model": scope.get("model_name"),
            "error": error,
            "levers": [
                {
                    "lever": lever.text,
                    "restart": lever.restart,
                    "change": None,
                    "predicted": None,
                    "band": None,
                    "knee": None,
                    "error": error,
                }
                for lever in levers
            ],
        }
    mine = [lever for lever in doc["levers"] if lever["lever"] in texts]
    return {**doc, "levers": mine, "error": error}
