"""A diagnosis as tables, for the postmortem: the series it read (long format) and its
findings with the numbers behind them.

The rows are plain dicts built without pandas (``report.csv`` writes the findings' rows as
CSV with nothing beyond the standard library); ``Diagnosis.to_frame()`` and
``Diagnosis.findings_frame()`` wrap the same rows in a pandas DataFrame (the ``notebook``
extra) and import pandas only then.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from diagnoser.diagnosis.match import ConditionResult, Match, ScopeData
from diagnoser.diagnosis.window import Window
from diagnoser.plumbing.durations import iso
from diagnoser.plumbing.labels import renamed
from diagnoser.site import Site

if TYPE_CHECKING:
    import pandas as pd


class Tabled(Protocol):
    """What the tables read of a diagnosis (``diagnosis.model.Diagnosis`` is one; the model
    wraps these rows in its ``to_frame`` and ``findings_frame``, so the rows name no model)."""

    window: Window
    site: Site
    findings: list[Match]
    resolved: list[Match]
    scopes: list[dict[str, str]]
    data: dict[tuple[tuple[str, str], ...], ScopeData]

    def data_for(self, m: Match) -> ScopeData | None: ...

    def unit(self, signal: str) -> str: ...

    def evidence_text(self, r: ConditionResult) -> str: ...

    def runbook(self, m: Match) -> str: ...


# The long table of series: one row per signal, scope, class and time.
SERIES_COLUMNS = ("signal", "unit", "class", "period", "time", "value", "evidence_for")
# The numbers a condition's verdict reports, by shape: a change's ``baseline`` and ``now``
# with their ``ratio`` or ``delta``; a level's ``now``; a share of time (``share``, at a
# ``max``); a drift's ``start`` and ``end``; a growth's ``exponent`` and its fit's ``r2``; a
# correlation ``corr``; ``events`` counted; and the rest the shapes name.
NUMBER_COLUMNS = (
    "baseline",
    "now",
    "ratio",
    "delta",
    "share",
    "max",
    "start",
    "end",
    "exponent",
    "r2",
    "median",
    "corr",
    "events",
    "rises_by",
    "above",
    "peak",
    "line_vs_step",
)
# The findings table: one row per finding and condition shown as its evidence; the scope's
# labels come between FINDING_HEAD and FINDING_TAIL. ``resolved_at`` is when a finding's
# pattern stopped holding in the window (empty while it holds): the last column, so that the
# columns a reader took by position before it came are where they were.
FINDING_HEAD = ("rank", "id", "title", "confidence", "severity", "basis", "onset")
FINDING_TAIL = (
    "signal",
    "over",
    "condition",
    "group",
    "holds",
    "evidence",
    *NUMBER_COLUMNS,
    "explained_by",
    "runbook",
    "resolved_at",
)


# Every column either table names itself. A scope label of one of these names (a site's group
# label ``class``, ``time`` or ``group``) is the column ``label_<name>`` in both tables and the
# CSV, prefixed again while that is taken, so that no label shadows a column or is shadowed.
FIXED_COLUMNS = frozenset((*SERIES_COLUMNS, *FINDING_HEAD, *FINDING_TAIL))


def scope_labels(d: Tabled) -> dict[str, str]:
    """The scope's labels, each with its column: in the site's order (the group labels, then
    model_name), then any other label a finding's scope carries (a target's job and
    instance). A label is its own column but where it is named like a fixed one
    (``FIXED_COLUMNS``)."""
    scopes = [*d.scopes, *(m.scope for m in (*d.findings, *d.resolved))]
    return renamed([*d.site.config.by, *(k for scope in scopes for k in scope)], FIXED_COLUMNS)


def scope_columns(d: Tabled) -> list[str]:
    """The columns of the scope's labels (``scope_labels``), in their order."""
    return list(scope_labels(d).values())


def finding_columns(d: Tabled) -> list[str]:
    return [*FINDING_HEAD, *scope_columns(d), *FINDING_TAIL]


def period_of(d: Tabled, t: float) -> str:
    """Which part of the diagnosis a time belongs to: the window asked about, its baseline,
    or before both (read to date an onset)."""
    w = d.window
    if w.start <= t <= w.end:
        return "window"
    if w.baseline_start <= t <= w.baseline_end:
        return "baseline"
    return "before"


def _evidence_signals(d: Tabled) -> dict[tuple[tuple[str, str], ...], dict[str, list[str]]]:
    """Per scope, the findings each signal is evidence for (in the diagnosis's order: the
    current ones, then those that ended in the window)."""
    out: dict[tuple[tuple[str, str], ...], dict[str, list[str]]] = {}
    for m in (*d.findings, *d.resolved):
        data = d.data_for(m)
        key = data.key if data is not None else tuple(sorted(m.scope.items()))
        per = out.setdefault(key, {})
        for r in m.shown():
            ids = per.setdefault(r.condition.signal, [])
            if m.playbook.id not in ids:
                ids.append(m.playbook.id)
    return out


def series_rows(d: Tabled) -> Iterator[dict[str, Any]]:
    """The series the diagnosis read, one row per point: scope labels, ``signal``, its
    ``unit``, ``class``
    (the prompt-length class of a by-class signal, else empty), ``period`` (window, baseline
    or before), ``time`` (Unix seconds), ``value`` and ``evidence_for`` (the findings, comma
    separated, whose evidence this signal is on this scope; empty when none)."""
    labels = scope_labels(d)
    evidence = _evidence_signals(d)
    for key, data in sorted(d.data.items()):
        scope = {col: data.scope.get(k, "") for k, col in labels.items()}
        used = evidence.get(key, {})
        parts = [(name, "", s) for name, s in sorted(data.series.items())]
        parts += [
            (name, cls, s)
            for name, by_class in sorted(data.classes.items())
            for cls, s in sorted(by_class.items())
        ]
        for name, cls, s in parts:
            why, unit = ",".join(used.get(name, ())), d.unit(name)
            for t, v in zip(s.t.tolist(), s.v.tolist(), strict=True):
                yield {
                    **scope,
                    "signal": name,
                    "unit": unit,
                    "class": cls,
                    "period": period_of(d, t),
                    "time": t,
                    "value": v,
                    "evidence_for": why,
                }


def _condition_row(d: Tabled, rank: int, m: Match, r: ConditionResult) -> dict[str, Any]:
    numbers = r.numbers()
    pb = m.playbook
    return {
        "rank": rank,
        "id": pb.id,
        "title": pb.title,
        "confidence": m.confidence,
        "severity": pb.severity,
        "basis": m.basis,
        "onset": iso(m.onset),
        "resolved_at": iso(m.end) or "",
        "signal": r.condition.signal,
        "over": r.condition.over,
        "condition": r.condition.describe(),
        "group": r.group,
        "holds": r.verdict.holds,
        "evidence": d.evidence_text(r),
        **{k: numbers.get(k) for k in NUMBER_COLUMNS},  # finite or None (numbers())
        "explained_by": m.explained_by or "",
        "runbook": d.runbook(m),
    }


def finding_rows(d: Tabled) -> Iterator[dict[str, Any]]:
    """One row per finding and per condition its report shows, in the diagnosis's order, the
    current findings first and then those that ended in the window (their rank continues):
    the finding (``rank`` from 1, id, title, confidence, severity, basis, onset and
    ``resolved_at`` as RFC 3339, ``resolved_at`` empty while it holds), its scope labels, and
    the condition with the numbers the text report prints (``baseline`` and ``now`` for a
    change, ``ratio``, ``share`` of time, a drift's ``start`` and ``end``, a growth
    ``exponent``; empty where the shape has none)."""
    labels = scope_labels(d)
    for rank, m in enumerate((*d.findings, *d.resolved), 1):
        scope = {col: m.scope.get(k, "") for k, col in labels.items()}
        for r in m.shown():
            row = _condition_row(d, rank, m, r)
            yield {**{k: row[k] for k in FINDING_HEAD}, **scope, **row}


def _pandas() -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise ImportError(
            "Diagnosis tables as DataFrames need pandas: pip install 'servediag[notebook]'"
        ) from None
    return pd


def series_frame(d: Tabled) -> pd.DataFrame:
    """``series_rows`` as a DataFrame; ``time`` as UTC timestamps. A diagnosis that read no
    data gives an empty frame with the same columns."""
    pd = _pandas()
    cols = [*scope_columns(d), *SERIES_COLUMNS]
    frame = pd.DataFrame(list(series_rows(d)), columns=cols)
    frame["time"] = pd.to_datetime(frame["time"].astype("float64"), unit="s", utc=True)
    return frame


def findings_frame(d: Tabled) -> pd.DataFrame:
    """``finding_rows`` as a DataFrame; ``onset`` and ``resolved_at`` as UTC timestamps (NaT
    while a finding holds). No finding gives an empty frame with the same columns."""
    pd = _pandas()
    frame = pd.DataFrame(list(finding_rows(d)), columns=finding_columns(d))
    frame["onset"] = pd.to_datetime(frame["onset"], utc=True)
    frame["resolved_at"] = pd.to_datetime(frame["resolved_at"], utc=True)
    return frame
