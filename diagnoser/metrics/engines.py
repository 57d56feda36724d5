"""The serving engines the toolkit reads, each registered once: its name, its metric families,
its PromQL builders, how its servers are recognised in Prometheus and what writes its
``/metrics`` in the simulator.

vLLM is the reference engine: the signal vocabulary is defined by what vLLM's series mean,
and every other engine gives each signal the same meaning from its own families or a
documented gap (:class:`Gap`). An engine may bring its expressions for existing signals at
registration (``exprs``, by signal name), so a new engine needs no edit of the signal modules;
:func:`registered` adds one for a while and takes it away again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics.family import FAMILIES, PROVIDERS, Family

# A signal's expression for a scope (``promql.Expr``: the PromQL builders read this registry,
# so it names the type's shape rather than importing them).
Expr = Callable[[Any], str]


@dataclass(frozen=True)
class Gap:
    """Why an engine gives a signal no series (the reason a playbook needing it is undecided
    on that engine's models)."""

    reason: str


@dataclass(frozen=True)
class Engine:
    name: str  # as a scenario's ``runtime`` and a site's ``<name>_targets`` say it
    title: str  # as reports and tables write it
    provider: str  # the ``Family.provider`` of its own families
    prefix: str  # the prefix of its families' names
    # The gauge every server of the engine exports per model from start-up: its series tell
    # which scrape targets are this engine's servers and which model each serves.
    running: str
    targets: str  # the default matcher of its scrape targets (a site may set its own)
    port: int  # the port its server listens on by default
    promql: str  # the module of PromQL builders over its families
    # What writes its ``/metrics`` in the simulator: a module of ``diagnoser.sim`` by name (the
    # simulator resolves it; the metric domain does not import the simulator), or an object.
    simulator: Any
    provided_by: str = ""  # what provides its families, as a finding's "provided by" says
    # The reason a signal of the reference engine's that this engine gives no expression for
    # is undecided on its models.
    gap: str = ""
    # Its expressions (or gaps) for existing signals, by signal name.
    exprs: Mapping[str, Expr | Gap] = field(default_factory=dict, hash=False)
    families: tuple[Family, ...] = ()  # its families, entered in the family table with it

    def own_families(self) -> list[Family]:
        return [f for f in FAMILIES.values() if f.provider == self.provider]


_ENGINES: dict[str, Engine] = {}


def register(engine: Engine) -> Engine:
    if engine.name in _ENGINES:
        raise ValueError(f"engine {engine.name!r} is registered already")
    for fam in engine.families:
        FAMILIES[fam.name] = fam
    if engine.provided_by:
        PROVIDERS[engine.provider] = engine.provided_by
    _ENGINES[engine.name] = engine
    return engine


def unregister(name: str) -> None:
    engine = _ENGINES.pop(name)
    for fam in engine.families:
        FAMILIES.pop(fam.name, None)
    if engine.provided_by:
        PROVIDERS.pop(engine.provider, None)


@contextmanager
def registered(engine: Engine) -> Iterator[Engine]:
    """``engine`` registered for the block, and gone again after it."""
    register(engine)
    try:
        yield engine
    finally:
        unregister(engine.name)


def get(name: str) -> Engine:
    try:
        return _ENGINES[name]
    except KeyError:
        raise KeyError(f"unknown engine {name!r}; known: {', '.join(_ENGINES)}") from None


def all_engines() -> list[Engine]:
    """Every engine, the reference first, then in the order they were registered."""
    return list(_ENGINES.values())


def names() -> list[str]:
    return list(_ENGINES)


def reference() -> Engine:
    """The engine the vocabulary is defined by (vLLM)."""
    return next(iter(_ENGINES.values()))


def others() -> list[Engine]:
    """Every engine but the reference."""
    return all_engines()[1:]


def running_gauges() -> tuple[str, ...]:
    """Each engine's running gauge: together, one series per model and server of any."""
    return tuple(e.running for e in _ENGINES.values())


def prefixes() -> tuple[str, ...]:
    return tuple(e.prefix for e in _ENGINES.values())


VLLM = register(
    Engine(
        name="vllm",
        title="vLLM",
        provider="vllm",
        prefix="vllm:",
        running="vllm:num_requests_running",
        targets='job=~".*vllm.*"',
        port=8000,
        promql="diagnoser.metrics.promql",
        simulator="diagnoser.sim.vllm_metrics",
    )
)
SGLANG = register(
    Engine(
        name="sglang",
        title="SGLang",
        provider="sglang",
        prefix="sglang:",
        running=SG.RUNNING.name,
        targets='job=~".*sglang.*"',
        port=30000,
        promql="diagnoser.metrics.promql_sglang",
        simulator="diagnoser.sim.sglang_metrics",
        provided_by=SG.PROVIDED_BY,
    )
)
