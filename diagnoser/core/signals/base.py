"""A signal: a named PromQL expression with its unit and meaning, rendered for a scope."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from diagnoser.core import families
from diagnoser.core import promql as q
from diagnoser.core import promql_sglang as sg
from diagnoser.core.promql import Expr, Scope

# Default SLO thresholds; each must be a bucket boundary of its histogram.
DEFAULT_TTFT_SLO = 1.0
DEFAULT_ITL_SLO = 0.1
ITL_STALL = 0.3  # seconds: a gap a reader notices, many times any healthy decode step
# SGLang's ITL histogram has no 0.3 s bound (0.2, then 0.4): its stalls are gaps over 0.4 s.
SGLANG_ITL_STALL = 0.4

_FAMILY_RE = re.compile(
    r"(?<![\w:])(vllm:[a-z0-9_]+|sglang:[a-zA-Z0-9_]+|llm_probe_[a-z0-9_]+|DCGM_FI_[A-Z_]+|"
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
    # The same meaning from SGLang's families, or None with the reason in ``sglang_gap``. The
    # signal is then ``expr or sglang``: each model's series comes from the engine serving it
    # (vLLM's where one model is served by both at once).
    sglang: Expr | None = None
    sglang_gap: str = ""
    # A target-level signal reads one engine's scrape targets: "vllm" or "sglang".
    engine: str = ""
    # One expression serves both engines (scrape health, DCGM and the probe, joined to the
    # models of either engine's servers).
    any_engine: bool = False
    # Families read where the server has them, with a fallback where it has not: they refine
    # the series but are not needed for it (not in ``provided_by``).
    optional: tuple[str, ...] = ()
    # A quantile's ceiling: the signal giving its histogram's top finite bucket bound on the
    # server. A value at that bound fell in the +Inf bucket, so it is shown as a lower bound
    # ("≥ 2,000"), never as the value.
    ceiling: str = ""
    # A latency quantile's vLLM histograms: their top finite bounds are known without a query
    # of its own (vLLM's defaults, or the bounds ``diagnose`` read from the servers).
    quantile_of: tuple[str, ...] = ()

    @property
    def target_level(self) -> bool:
        return self.by == TARGET

    def render(self, scope: Scope | None = None, engine: str = "") -> str:
        """The PromQL for ``scope``: both engines' expressions, or one (``engine``)."""
        scope = scope or Scope(by=self.by)
        if engine == "sglang" and not self.on_sglang:
            raise ValueError(f"{self.name}: no SGLang expression ({self.sglang_gap})")
        if self.sglang is None or engine == "vllm":
            return self.expr(scope)  # one expression (for both engines, or vLLM's)
        if engine == "sglang":
            return self.sglang(scope)
        return f"({self.expr(scope)}) or ({self.sglang(scope)})"

    @property
    def on_sglang(self) -> bool:
        """Whether SGLang's servers give this signal a series."""
        return self.sglang is not None or self.engine == "sglang" or self.any_engine

    @cached_property
    def families(self) -> tuple[str, ...]:
        """Metric families the signal reads on vLLM, newest name first, without suffixes."""
        return tuple(f for f in _families_in(self.render(engine="vllm")) if f[:7] != "sglang:")

    @cached_property
    def sglang_families(self) -> tuple[str, ...]:
        """Metric families the signal reads on SGLang (none without an SGLang expression)."""
        if not self.on_sglang:
            return ()
        return tuple(f for f in _families_in(self.render(engine="sglang")) if f[:5] != "vllm:")

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
        return sorted(
            {families.family(f).provided_by() for f in self.families if f not in self.optional}
        )

    def provided_by_sglang(self) -> list[str]:
        """What provides the signal's series on SGLang's servers."""
        return sorted({families.family(f).provided_by() for f in self.sglang_families})


def _families_in(text: str) -> tuple[str, ...]:
    found: list[str] = []
    for raw in _FAMILY_RE.findall(text):
        name = _strip_suffix(raw)
        if name not in found:
            found.append(name)
    return tuple(found)


def _strip_suffix(name: str) -> str:
    if name in families.FAMILIES:
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in families.FAMILIES:
            return name[: -len(suffix)]
    return name


def latency(
    prefix: str,
    family: str | tuple[str, ...],
    what: str,
    record: str,
    sglang: families.Family | None = None,
    sglang_gap: str = "",
) -> list[Signal]:
    """p50, p95, p99 and the mean of a latency histogram (and of SGLang's, if it has one)."""
    names = (family,) if isinstance(family, str) else family
    out = [
        Signal(
            f"{prefix}_p{p}",
            "s",
            f"{what}, {p}th percentile.",
            q.quantile(p / 100, *names),
            (record, f"p{p}"),
            sglang=sg.quantile(p / 100, sglang) if sglang else None,
            sglang_gap=sglang_gap,
            quantile_of=names,
        )
        for p in (50, 95, 99)
    ]
    out.append(
        Signal(
            f"{prefix}_mean",
            "s",
            f"{what}, mean.",
            q.hist_mean(*names),
            (record, "mean"),
            sglang=sg.hist_mean(sglang) if sglang else None,
            sglang_gap=sglang_gap,
        )
    )
    return out
