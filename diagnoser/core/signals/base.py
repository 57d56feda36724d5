"""A signal: a named PromQL expression with its unit and meaning, rendered for a scope."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from diagnoser.core import families
from diagnoser.core import promql as q
from diagnoser.core.promql import Expr, Scope

# Default SLO thresholds; each must be a bucket boundary of its histogram.
DEFAULT_TTFT_SLO = 1.0
DEFAULT_ITL_SLO = 0.1
ITL_STALL = 0.3  # seconds: a gap a reader notices, many times any healthy decode step

_FAMILY_RE = re.compile(
    r"(?<![\w:])(vllm:[a-z0-9_]+|llm_probe_[a-z0-9_]+|DCGM_FI_[A-Z_]+|"
    r"http_[a-z_]+|process_[a-z_]+|up)(?![\w:])(?!\s*\()"
)
# A model-level signal is aggregated by the site's model grouping (model_name and the site's
# group labels); a target-level one by scrape target.
MODEL = ("model_name",)
TARGET = ("job", "instance")


@dataclass(frozen=True)
class Signal:
    """A named PromQL expression with its unit and meaning."""

    name: str
    unit: str
    help: str
    expr: Expr
    record_as: tuple[str, str]  # (metric part, operation) of the recording rule name
    by: tuple[str, ...] = MODEL
    per_instance: bool = False  # also recorded by (model_name, instance)
    # diagnose derives it from the target-level series and its lookback's map of targets to
    # models, instead of querying it (same meaning, a longer memory of who served what).
    attributed: bool = False

    @property
    def target_level(self) -> bool:
        return self.by == TARGET

    def render(self, scope: Scope | None = None) -> str:
        return self.expr(scope or Scope(by=self.by))

    @cached_property
    def families(self) -> tuple[str, ...]:
        """Metric families the signal reads, newest name first, without suffixes."""
        found: list[str] = []
        for raw in _FAMILY_RE.findall(self.render()):
            name = _strip_suffix(raw)
            if name not in found:
                found.append(name)
        return tuple(found)

    @property
    def uses_rate(self) -> bool:
        return "[5m]" in self.render(Scope(by=self.by, window="5m"))

    def record_name(self, by: tuple[str, ...] | None = None, window: str = "5m") -> str:
        """``level:metric:operations``, e.g. ``model_name:vllm_ttft_seconds:p95_rate5m``."""
        level = "_".join(by or self.by)
        metric, op = self.record_as
        if self.uses_rate:
            ops = f"{op}{window}" if op in ("rate", "changes") else f"{op}_rate{window}"
        else:
            ops = op
        return f"{level}:{metric}:{ops}"

    def provided_by(self) -> list[str]:
        return sorted({families.family(f).provided_by() for f in self.families})


def _strip_suffix(name: str) -> str:
    if name in families.FAMILIES:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in families.FAMILIES:
            return name[: -len(suffix)]
    return name


def latency(prefix: str, family: str | tuple[str, ...], what: str, record: str) -> list[Signal]:
    """p50, p95, p99 and the mean of a latency histogram."""
    names = (family,) if isinstance(family, str) else family
    out = [
        Signal(
            f"{prefix}_p{p}",
            "s",
            f"{what}, {p}th percentile.",
            q.quantile(p / 100, *names),
            (record, f"p{p}"),
        )
        for p in (50, 95, 99)
    ]
    out.append(
        Signal(f"{prefix}_mean", "s", f"{what}, mean.", q.hist_mean(*names), (record, "mean"))
    )
    return out
