"""Service-level objectives: per model, a default plus overrides by label matchers.

Three SLIs, each with an objective over ``period`` (30 days by default):

- **availability**: the share of inference requests that neither fail with an HTTP 5xx nor end
  with ``finished_reason="error"``, times the share of the time some target of the model was
  up (time with every target down is unavailable: a dead server counts no failed request);
- **ttft**: the share of requests whose time to first token is at most ``ttft_seconds``;
- **itl**: the share of output tokens that come at most ``itl_seconds`` after the previous one.

A threshold is read off a bucket, never interpolated: at the threshold where it is a bucket
bound of its histogram, else at the largest bound below it (a stricter threshold, which
``generate`` and ``diagnose`` say). The first override whose matchers all match a model's
labels applies to it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, replace
from typing import Any

from diagnoser.metrics import buckets
from diagnoser.metrics.promql import quote
from diagnoser.plumbing.durations import parse_duration

MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\\n]|\\.)*)"\s*')
OBJECTIVES = ("availability", "ttft", "itl")
THRESHOLDS = {"ttft_seconds": buckets.TTFT_BUCKETS, "itl_seconds": buckets.ITL_BUCKETS}


class SloError(ValueError):
    """An SLO setting that cannot be used; the message names the field."""


@dataclass(frozen=True)
class Objectives:
    availability: float = 0.999
    ttft: float = 0.99
    itl: float = 0.99
    ttft_seconds: float = 1.0
    itl_seconds: float = 0.1

    def objective(self, sli: str) -> float:
        value: float = getattr(self, sli)
        return value


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> Matcher:
        m = MATCHER.fullmatch(text)
        if not m:
            raise SloError(f'{text!r} is not a label matcher like model_name=~"llama.*"')
        value = re.sub(r"\\(.)", lambda x: {"n": "\n"}.get(x.group(1), x.group(1)), m.group(3))
        if m.group(2) in ("=~", "!~"):
            try:
                re.compile(value)
            except re.error as exc:
                raise SloError(f"{text!r}: not a regular expression: {exc}") from None
        return cls(m.group(1), m.group(2), value)

    def matches(self, labels: dict[str, str]) -> bool:
        have = labels.get(self.label, "")
        if self.op == "=":
            return have == self.value
        if self.op == "!=":
            return have != self.value
        found = re.fullmatch(self.value, have) is not None  # PromQL anchors regexes
        return found if self.op == "=~" else not found

    def __str__(self) -> str:
        return f"{self.label}{self.op}{quote(self.value)}"


@dataclass(frozen=True)
class Override:
    match: tuple[Matcher, ...]
    objectives: Objectives


@dataclass(frozen=True)
class SloConfig:
    default: Objectives = field(default_factory=Objectives)
    overrides: tuple[Override, ...] = ()
    period: float = 30 * 86400.0

    def for_labels(self, labels: dict[str, str]) -> Objectives:
        for ov in self.overrides:
            if all(m.matches(labels) for m in ov.match):
                return ov.objectives
        return self.default

    def thresholds(self) -> list[tuple[float, float]]:
        """Every (ttft_seconds, itl_seconds) pair in use, the default's first."""
        out = [(self.default.ttft_seconds, self.default.itl_seconds)]
        for ov in self.overrides:
            pair = (ov.objectives.ttft_seconds, ov.objectives.itl_seconds)
            if pair not in out:
                out.append(pair)
        return out


def _objectives(raw: dict[str, Any], base: Objectives, where: str) -> Objectives:
    known = {f.name for f in fields(Objectives)}
    values: dict[str, float] = {}
    for key, value in raw.items():
        if key not in known:
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
        ):
            raise SloError(f"{where}.{key}: must be a number")
        if key in OBJECTIVES and not 0 < value < 1:
            raise SloError(f"{where}.{key}: an objective is a share between 0 and 1, like 0.999")
        if key in THRESHOLDS and value <= 0:
            raise SloError(f"{where}.{key}: a latency threshold is a number of seconds above 0")
        values[key] = float(value)
    return replace(base, **values)


def parse(raw: Any, ttft_seconds: float, itl_seconds: float) -> SloConfig:
    """The ``slo:`` section of a site config (``None`` for the defaults)."""
    base = Objectives(ttft_seconds=ttft_seconds, itl_seconds=itl_seconds)
    if raw is None:
        return SloConfig(default=base)
    if not isinstance(raw, dict):
        raise SloError("slo: must be a mapping")
    allowed = {f.name for f in fields(Objectives)} - set(THRESHOLDS) | {"period", "overrides"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise SloError(f"slo: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})")
    default = _objectives(raw, base, "slo")
    period = 30 * 86400.0
    if "period" in raw:
        try:
            period = parse_duration(raw["period"])
        except ValueError as exc:
            raise SloError(f"slo.period: {exc}") from None
        if not 86400 <= period <= 366 * 86400:
            raise SloError("slo.period: must be from 1d to 366d")
    listed = raw.get("overrides") or []
    if not isinstance(listed, list):
        raise SloError("slo.overrides: must be a list of overrides, each {match: ..., objectives}")
    overrides = []
    for i, ov in enumerate(listed):
        where = f"slo.overrides[{i}]"
        if not isinstance(ov, dict) or "match" not in ov:
            raise SloError(f"{where}: needs match (label matchers) and objectives")
        extra = sorted(set(ov) - {f.name for f in fields(Objectives)} - {"match"})
        if extra:
            raise SloError(f"{where}: unknown key {extra[0]!r}")
        texts = [ov["match"]] if isinstance(ov["match"], str) else ov["match"]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise SloError(f"{where}.match: a label matcher or a list of them")
        try:
            match = tuple(Matcher.parse(t) for t in texts)
        except SloError as exc:
            raise SloError(f"{where}.match: {exc}") from None
        overrides.append(Override(match, _objectives(ov, default, where)))
    return SloConfig(default, tuple(overrides), period)
