"""The generated alerts, evaluated over backfilled history: which alert would have fired, when.

Prometheus evaluates rules only as time passes, so for history the recording rules are
backfilled with ``promtool tsdb create-blocks-from rules`` (blocks added to the TSDB, then the
server restarted), and each alert's expression is then asked as a range query: an alert fires
at the first evaluation at which its expression has held, without a gap, for its ``for``.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from diagnoser.metrics.exposition import labelstr
from diagnoser.plumbing.durations import parse_duration
from lab.promserver import Prometheus, backfill


@dataclass(frozen=True)
class Fired:
    alert: str
    labels: dict[str, str]  # the alert's own (severity, playbook) and the series'
    at: float  # when it started firing


def _rules(path: Path) -> list[dict[str, Any]]:
    """Every rule of a Prometheus rule file, its groups in order."""
    doc: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in doc["groups"] for rule in group["rules"]]


NAME = re.compile(r"(?<![\w:])[A-Za-z_:][\w:]*(?![\w:])")


def needed(rule_file: Path, by: Path) -> set[str]:
    """The recording rules of ``rule_file`` that the expressions of ``by`` read, directly
    or through other recording rules."""
    recorded = {r["record"]: r["expr"] for r in _rules(rule_file) if "record" in r}
    out: set[str] = set()
    todo = [str(r["expr"]) for r in _rules(by)]
    while todo:
        for word in NAME.findall(todo.pop()):
            if word in recorded and word not in out:
                out.add(word)
                todo.append(str(recorded[word]))
    return out


def levels(rule_file: Path, only: set[str] | None = None) -> list[set[str]]:
    """``rule_file``'s recording rules (those named in ``only``, when given) in the order
    their series can be computed: first those that read raw series alone, then those that
    read the rules before them (Prometheus evaluates a rule on the series the rules before it
    recorded; evaluated at once on the raw series, such a rule finds nothing to read)."""
    recorded = {
        r["record"]: set(NAME.findall(str(r["expr"]))) - {r["record"]}
        for r in _rules(rule_file)
        if "record" in r and (only is None or r["record"] in only)
    }
    out: list[set[str]] = []
    done: set[str] = set()
    while len(done) < len(recorded):
        ready = {
            n
            for n, reads in recorded.items()
            if n not in done and not (reads & recorded.keys()) - done
        }
        if not ready:  # a cycle: what is left, at once
            ready = set(recorded) - done
        out.append(ready)
        done |= ready
    return out


def backfill_rules(
    prom: Prometheus,
    rule_file: Path,
    start: float,
    end: float,
    interval: float = 30.0,
    only: set[str] | None = None,
    stale: bool = False,
    keep: Path | None = None,
) -> None:
    """Backfill ``rule_file``'s recording rules (those named in ``only``, when given) into
    ``prom``'s TSDB over ``[start, end]`` (``rule_blocks``); restart ``prom`` to read them.
    Rules that read other rules are backfilled after them (``levels``), one restart each.
    ``keep``: a directory that receives a copy of every block written, to be served later
    beside other data."""
    for level in levels(rule_file, only):
        with tempfile.TemporaryDirectory(prefix="servediag-rules-") as tmp:
            blocks = Path(tmp) / "blocks"
            rule_blocks(prom, rule_file, start, end, blocks, interval, level, stale)
            prom.close()
            for block in blocks.iterdir():
                if block.is_dir():
                    if keep is not None:
                        shutil.copytree(block, keep / block.name)
                    shutil.move(str(block), str(prom.data_dir / block.name))
        prom.start()


def rule_blocks(
    prom: Prometheus,
    rule_file: Path,
    start: float,
    end: float,
    out: Path,
    interval: float = 30.0,
    only: set[str] | None = None,
    stale: bool = False,
) -> None:
    """TSDB blocks in ``out`` holding ``rule_file``'s recording rules (those named in
    ``only``, when given) evaluated on ``prom``'s series over ``[start, end]``.

    What ``promtool tsdb create-blocks-from rules`` does, in one pass: each rule's expression
    is asked of ``prom`` as a range query (evaluated every ``interval`` from ``start``, every
    rule against the raw series, as promtool does), and the answers, named and labelled as
    the rules say, are written as OpenMetrics and backfilled with ``promtool tsdb
    create-blocks-from openmetrics``. promtool's own command writes blocks rule by rule and
    took forty seconds for the 140 rules over three hours that these queries answer in
    three.

    ``stale``: where a series had a value at one evaluation and has none at the next, write
    NaN there, as Prometheus writes a stale marker when a rule's series disappears (OpenMetrics
    cannot carry the marker itself): a query then finds no number there, not the last value
    carried on for the lookback's five minutes."""
    with tempfile.TemporaryDirectory(prefix="servediag-rules-") as tmp:
        om = Path(tmp) / "rules.om"
        with om.open("w", encoding="utf-8") as fh:
            for rule in _rules(rule_file):
                name = rule.get("record")
                if name is None or (only is not None and name not in only):
                    continue
                series = prom.query_range(rule["expr"], start, end, interval)
                if not series:
                    continue
                fh.write(f"# TYPE {name} gauge\n")
                for s in series:
                    labels = {**s["metric"], **rule.get("labels", {})}
                    labels.pop("__name__", None)
                    head = f"{name}{labelstr(tuple(sorted(labels.items())))}"
                    values = [(float(t), _value(v)) for t, v in s["values"]]
                    if stale:
                        values = _with_gaps(values, interval, end)
                    for t, v in values:
                        fh.write(f"{head} {v} {t:.3f}\n")
            fh.write("# EOF\n")
        backfill(om, out)


def _with_gaps(
    values: list[tuple[float, str]], interval: float, end: float
) -> list[tuple[float, str]]:
    """``values`` with NaN at each evaluation after a present one where the series is absent."""
    out: list[tuple[float, str]] = []
    for i, (t, v) in enumerate(values):
        out.append((t, v))
        after = values[i + 1][0] if i + 1 < len(values) else None
        gone = t + interval
        if (after is None and gone <= end + 1e-6) or (after is not None and after > gone + 1e-6):
            out.append((gone, "NaN"))
    return out


def _value(v: str) -> str:
    """Prometheus's JSON value as OpenMetrics writes it (NaN, +Inf and -Inf as they are)."""
    return {"Inf": "+Inf", "+Inf": "+Inf", "-Inf": "-Inf", "NaN": "NaN"}.get(v, v)


@dataclass(frozen=True)
class Episode:
    """One stretch over which an alert fired: its expression held from ``pending`` (the
    first evaluation of the run), the alert fired from ``at`` until ``until`` (the last
    evaluation at which the expression held)."""

    alert: str
    labels: dict[str, str]
    pending: float
    at: float
    until: float


def firing(
    prom: Prometheus, alerts_file: Path, start: float, end: float, step: float = 30.0
) -> list[Fired]:
    """Every alert of ``alerts_file`` that fires within ``[start, end]``, with when (its
    first firing, per series)."""
    first: dict[tuple[str, tuple[tuple[str, str], ...]], Fired] = {}
    for e in episodes(prom, alerts_file, start, end, step):
        key = (e.alert, tuple(sorted(e.labels.items())))
        if key not in first:
            first[key] = Fired(e.alert, e.labels, e.at)
    return sorted(first.values(), key=lambda f: (f.at, f.alert))


def episodes(
    prom: Prometheus, alerts_file: Path, start: float, end: float, step: float = 30.0
) -> list[Episode]:
    """Every stretch over which an alert of ``alerts_file`` fired within ``[start, end]``:
    one per run of the expression that held for the rule's ``for`` without a gap."""
    out: list[Episode] = []
    for rule in _rules(alerts_file):
        if "alert" not in rule:
            continue
        hold = parse_duration(rule.get("for", "0s"))
        for series in prom.query_range(rule["expr"], start, end, step):
            times = [float(t) for t, _ in series["values"]]
            labels = {**series["metric"], **rule.get("labels", {})}
            for pending, until in _runs(times, step):
                if until - pending >= hold:
                    at = pending + math.ceil(hold / step - 1e-9) * step
                    out.append(Episode(rule["alert"], labels, pending, at, until))
    return sorted(out, key=lambda e: (e.at, e.alert))


def _runs(times: list[float], step: float) -> list[tuple[float, float]]:
    """The runs of evaluations without a gap in ``times``: (first, last) of each."""
    runs: list[tuple[float, float]] = []
    for t in times:
        if runs and t - runs[-1][1] <= step * 1.5:
            runs[-1] = (runs[-1][0], t)
        else:
            runs.append((t, t))
    return runs
