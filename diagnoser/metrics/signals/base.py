"""A signal: a named PromQL expression with its unit and meaning, rendered for a scope."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from diagnoser.metrics import engines, families
from diagnoser.metrics import promql as q
from diagnoser.metrics import promql_sglang as sg
from diagnoser.metrics.engines import Gap
from diagnoser.metrics.promql import Expr, Scope

# Default SLO thresholds; each must be a bucket boundary of its histogram.
DEFAULT_TTFT_SLO = 1.0
DEFAULT_ITL_SLO = 0.1
ITL_STALL = 0.3  # seconds: a gap a reader notices, many times any healthy decode step
# SGLang's ITL histogram has no 0.3 s bound (0.2, then 0.4): its stalls are gaps over 0.4 s.
SGLANG_ITL_STALL = 0.4

# Families outside the engines': the API server's, DCGM's, the probe's, scrape health, and the
# platform's (kube-state-metrics, cAdvisor, node-exporter).
_OTHER_FAMILIES = (
    r"llm_probe_[a-z0-9_]+|DCGM_FI_[A-Z_]+|http_[a-z_]+|process_[a-z_]+|up"
    r"|kube_[a-z_]+|container_[a-z_]+|node_[a-zA-Z_]+"
)
# A model-level signal is aggregated by the site's model grouping (model_name and the site's
# group labels); a target-level one by scrape target.
MODEL = ("model_name",)
TARGET = ("job", "instance")


# A signal's expression for each engine, by engine name: an expression, or a gap with its
# reason. ``ANY`` is one expression serving every engine (scrape health, DCGM and the probe,
# joined to the models of every engine's servers).
ANY = "*"
Exprs = Mapping[str, Expr | Gap]


def on(**by_engine: Expr | Gap) -> dict[str, Expr | Gap]:
    """A signal's expressions by engine: ``on(vllm=..., sglang=... or Gap("why"))``."""
    return dict(by_engine)


def everywhere(expr: Expr) -> dict[str, Expr | Gap]:
    """One expression for every engine."""
    return {ANY: expr}


# The label a signal's recording rule puts on the series it records from a stand-in
# (``StandIn``), whose value names the stand-in: an alert on the record says what it read, and
# ``diagnose --recorded-rules`` reads the stand-in apart, as it reads it without the rules.
STAND_IN_LABEL = "stand_in"


@dataclass(frozen=True)
class StandIn:
    """A signal read in another's place, and what it is (for the evidence)."""

    signal: str
    what: str


@dataclass(frozen=True)
class Signal:
    """A named PromQL expression with its unit and meaning."""

    name: str
    unit: str
    help: str
    # Its expression (or gap) per engine. Rendered for every engine, it is the engines'
    # expressions joined by ``or``, the reference engine's first: each model's series comes
    # from the engine serving it (vLLM's where one model is served by both at once). An engine
    # may also give its expression at registration (``Engine.exprs``).
    exprs: Exprs = field(hash=False)
    record_as: tuple[str, str]  # (metric part, operation) of the recording rule name
    by: tuple[str, ...] = MODEL
    per_instance: bool = False  # also recorded by (model_name, instance)
    # diagnose derives it from the target-level series and its lookback's map of targets to
    # models, instead of querying it (same meaning, a longer memory of who served what).
    attributed: bool = False
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
    # A count of events over its window, not a rate (restarts): read over at least this many
    # seconds, however short the window's rates, so that an event stays counted as long as
    # the alerts count it and a recurrence is seen as one.
    least_window: float = 0.0
    # By engine: the signal read in this one's place on a scope that has no series of its
    # own (the server does not export an optional histogram), and what it is, as the report
    # says it (SGLang without --collect-tokens-histogram: the mean prompt per admitted
    # request for the median). Model scopes of that engine only.
    stand_in: Mapping[str, StandIn] = field(default_factory=dict, hash=False)

    @property
    def target_level(self) -> bool:
        return self.by == TARGET

    def expression(self, engine: str) -> Expr | Gap | None:
        """Its expression on ``engine``, or the gap and why; None where the signal is not the
        engine's to give (another engine's own, e.g. its servers)."""
        own = self.exprs.get(engine)
        if own is not None:
            return own
        eng = engines.get(engine)
        given = eng.exprs.get(self.name)
        if given is not None:
            return given
        if ANY in self.exprs:
            return self.exprs[ANY]
        reference = engines.reference().name
        if eng.gap and engine != reference and self.expression(reference) is not None:
            return Gap(eng.gap)
        return None

    def on(self, engine: str) -> bool:
        """Whether ``engine``'s servers give this signal a series."""
        return callable(self.expression(engine))

    def gap(self, engine: str) -> str:
        """Why ``engine`` gives no series ("" where it does, or the signal is not its)."""
        found = self.expression(engine)
        return found.reason if isinstance(found, Gap) else ""

    @property
    def engine(self) -> str:
        """The engine whose scrape targets a target-level signal reads (the first that gives
        the signal an expression of its own)."""
        for name in engines.names():
            if callable(self.exprs.get(name)):
                return name
        return engines.reference().name

    def render(self, scope: Scope | None = None, engine: str = "") -> str:
        """The PromQL for ``scope``: every engine's expressions, or one (``engine``)."""
        scope = scope or Scope(by=self.by)
        if engine:
            found = self.expression(engine)
            if not callable(found):
                why = found.reason if isinstance(found, Gap) else "not the engine's"
                raise ValueError(f"{self.name}: no {engines.get(engine).title} expression ({why})")
            return found(scope)
        every = self.exprs.get(ANY)
        if callable(every):
            return every(scope)
        parts = [e(scope) for e in map(self.expression, engines.names()) if callable(e)]
        if len(parts) == 1:
            return parts[0]
        return " or ".join(f"({p})" for p in parts)

    @cached_property
    def families(self) -> tuple[str, ...]:
        """Metric families the signal reads, without suffixes and without other engines'
        (the reference engine's where it has an expression), newest name first."""
        return _without_others(_families_in(self.render()), engines.reference().name)

    def families_on(self, engine: str) -> tuple[str, ...]:
        """Metric families the signal reads on ``engine`` (none without its expression)."""
        if not self.on(engine):
            return ()
        return _without_others(_families_in(self.render(engine=engine)), engine)

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

    def provided_by_on(self, engine: str) -> list[str]:
        """What provides the signal's series on ``engine``'s servers."""
        return sorted({families.family(f).provided_by() for f in self.families_on(engine)})


def _without_others(found: tuple[str, ...], engine: str) -> tuple[str, ...]:
    others = tuple(e.prefix for e in engines.all_engines() if e.name != engine)
    return tuple(f for f in found if not f.startswith(others))


def _family_re() -> re.Pattern[str]:
    names = "|".join(re.escape(p) + "[a-zA-Z0-9_]+" for p in engines.prefixes())
    return re.compile(rf"(?<![\w:])({names}|{_OTHER_FAMILIES})(?![\w:])(?!\s*\()")


def _families_in(text: str) -> tuple[str, ...]:
    found: list[str] = []
    for raw in _family_re().findall(text):
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
    sglang: families.Family | Gap,
) -> list[Signal]:
    """p50, p95, p99 and the mean of a latency histogram (and of SGLang's, or its gap)."""
    names = (family,) if isinstance(family, str) else family

    def quantile(p: int) -> Expr | Gap:
        return sglang if isinstance(sglang, Gap) else sg.quantile(p / 100, sglang)

    theirs_mean = sglang if isinstance(sglang, Gap) else sg.hist_mean(sglang)

    out = [
        Signal(
            f"{prefix}_p{p}",
            "s",
            f"{what}, {p}th percentile.",
            on(
                vllm=q.quantile(p / 100, *names),
                sglang=quantile(p),
            ),
            (record, f"p{p}"),
            quantile_of=names,
        )
        for p in (50, 95, 99)
    ]
    out.append(
        Signal(
            f"{prefix}_mean",
            "s",
            f"{what}, mean.",
            on(vllm=q.hist_mean(*names), sglang=theirs_mean),
            (record, "mean"),
        )
    )
    return out
