"""The generated alerts, evaluated over backfilled history: which alert would have fired, when.

Prometheus evaluates rules only as time passes, so for history the recording rules are
backfilled with ``promtool tsdb create-blocks-from rules`` (blocks added to the TSDB, then the
server restarted), and each alert's expression is then asked as a range query: an alert fires
at the first evaluation at which its expression has held, without a gap, for its ``for``.
"""

from __future__ import annotations

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


def needed(rule_file: Path, by: Path) -> set[str]:
    """The recording rules of ``rule_file`` that the expressions of ``by`` read, directly
    or through other recording rules."""
    recorded = {r["record"]: r["expr"] for r in _rules(rule_file) if "record" in r}
    name = re.compile(r"(?<![\w:])[A-Za-z_:][\w:]*(?![\w:])")
    out: set[str] = set()
    todo = [str(r["expr"]) for r in _rules(by)]
    while todo:
        for word in name.findall(todo.pop()):
            if word in recorded and word not in out:
                out.add(word)
                todo.append(str(recorded[word]))
    return out


def backfill_rules(
    prom: Prometheus,
    rule_file: Path,
    start: float,
    end: float,
    interval: float = 30.0,
    only: set[str] | None = None,
    stale: bool = False,
) -> None:
    """Backfill ``rule_file``'s recording rules (those named in ``only``, when given) into
    ``prom``'s TSDB over ``[start, end]`` (``rule_blocks``); restart ``prom`` to read them."""
    with tempfile.TemporaryDirectory(prefix="servediag-rules-") as tmp:
        blocks = Path(tmp) / "blocks"
        rule_blocks(prom, rule_file, start, end, blocks, interval, only, stale)
        prom.close()
        for block in blocks.iterdir():
            if block.is_dir():
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


def firing(
    prom: Prometheus, alerts_file: Path, start: float, end: float, step: float = 30.0
) -> list[Fired]:
    """Every alert of ``alerts_file`` that fires within ``[start, end]``, with when."""
    out: list[Fired] = []
    for rule in _rules(alerts_file):
        if "alert" not in rule:
            continue
        hold = parse_duration(rule.get("for", "0s"))
        for series in prom.query_range(rule["expr"], start, end, step):
            times = [float(t) for t, _ in series["values"]]
            at = _first_fire(times, hold, step)
            if at is not None:
                labels = {**series["metric"], **rule.get("labels", {})}
                out.append(Fired(rule["alert"], labels, at))
    return sorted(out, key=lambda f: (f.at, f.alert))


def _first_fire(times: list[float], hold: float, step: float) -> float | None:
    """The first time the expression has held for ``hold`` without a gap."""
    run_start = None
    previous = None
    for t in times:
        if previous is None or t - previous > step * 1.5:
            run_start = t
        previous = t
        if run_start is not None and t - run_start >= hold:
            return t
    return None
