"""A third engine needs no edit of the toolkit: registered from this module alone, with its
families, its expressions for the signals it gives, its scrape targets and a simulator profile,
its servers are simulated, read from a real Prometheus and diagnosed. The finding comes out for
its model, and the signals it gives no expression for are undecided with its reason.

"toyllm" is vLLM under another name, less its finished_reason counter: its families are a
renamed subset of vLLM's, its expressions vLLM's with the names changed, and its simulator
runs vLLM's mechanics and writes the families under the toy's prefix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.metrics import engines
from diagnoser.metrics.engines import Engine, Gap
from diagnoser.metrics.family import FAMILIES
from diagnoser.metrics.promql import Expr, Scope
from diagnoser.metrics.signals import SIGNALS, Signal
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.sim import library
from diagnoser.sim.profiles import Profile
from diagnoser.sim.vllm_metrics import PROFILES
from diagnoser.site import Site
from lab import harness
from lab.promserver import Prometheus

NAME, PREFIX = "toyllm", "toyllm:"
GAP = "ToyLLM exports no finished_reason"
JUDGED = "only vLLM's targets are judged"
SCENARIO = "kv-cache-pressure"


def _renamed(text: str) -> str:
    return text.replace("vllm:", PREFIX)


def _gives(sig: Signal) -> bool:
    """The toy gives every signal vLLM does, but those read from finished_reason."""
    own = sig.exprs.get("vllm")
    return callable(own) and not sig.target_level and not sig.name.startswith("finished_")


def _expr(name: str) -> Expr:
    def build(scope: Scope) -> str:
        return _renamed(SIGNALS[name].render(scope, engine="vllm"))

    return build


def toy_engine() -> Engine:
    given = [sig for sig in SIGNALS if _gives(sig)]
    read = {f for sig in given for f in sig.families_on("vllm") if f.startswith("vllm:")}
    families = tuple(
        dataclasses.replace(FAMILIES[f], name=_renamed(f), provider=NAME) for f in sorted(read)
    )
    return Engine(
        name=NAME,
        title="ToyLLM",
        provider=NAME,
        prefix=PREFIX,
        running=f"{PREFIX}num_requests_running",
        targets='job=~".*toyllm.*"',
        port=9000,
        promql=__name__,
        simulator=Profile("vllm", PROFILES, rename=("vllm:", PREFIX)),
        provided_by="ToyLLM 1.0",
        gap=GAP,
        exprs={
            **{sig.name: _expr(sig.name) for sig in given},
            **{sig.name: Gap(JUDGED) for sig in SIGNALS if sig.target_level and sig.on("vllm")},
        },
        families=families,
    )


@pytest.fixture(scope="module")
def toy() -> Iterator[Engine]:
    with engines.registered(toy_engine()) as engine:
        yield engine


@pytest.fixture(scope="module")
def diagnosed(toy, tmp_path_factory) -> tuple[dict, str]:
    sc = library.find(SCENARIO)
    sc = dataclasses.replace(
        sc,
        name=f"{NAME}-{SCENARIO}",
        models=[dataclasses.replace(m, runtime=NAME) for m in sc.models],
    )
    # One scenario is simulated in this process, where the toy engine is registered.
    prepared = harness.prepare([sc], tmp_path_factory.mktemp("toyllm"))[sc.name]
    site = Site.load()  # its vocabulary has the toy's servers and targets
    with Prometheus(prepared.data_dir) as prom:
        source = PrometheusSource(prom.url)
        window = Window.plan(sc.labels.window, prepared.end)
        report = to_json(diagnose(source, site, window))
    return report, sc.models[0].name


def test_registration_is_undone():
    with engines.registered(toy_engine()):
        assert NAME in engines.names()
        assert f"{PREFIX}num_requests_running" in FAMILIES
        assert {f.name for f in engines.get(NAME).own_families()} >= {
            f"{PREFIX}kv_cache_usage_perc",
            f"{PREFIX}num_preemptions_total",
        }
        assert PREFIX + "num_requests_running" in SIGNALS["requests_running"].render()
    assert NAME not in engines.names()
    assert not any(f.startswith(PREFIX) for f in FAMILIES)
    assert PREFIX not in SIGNALS["requests_running"].render()


def test_the_engine_gives_signals_their_expressions_or_its_gap(toy):
    sig = SIGNALS["kv_cache_usage"]
    assert sig.on(NAME)
    assert sig.render(engine=NAME) == _renamed(sig.render(engine="vllm"))
    theirs = [sig.render(engine=e) for e in ("vllm", "sglang", NAME)]
    assert sig.render() == " or ".join(f"({e})" for e in theirs)  # the reference's first
    assert set(sig.provided_by_on(NAME)) == {"ToyLLM 1.0"}
    lacking = SIGNALS["finished_length_share"]
    assert not lacking.on(NAME) and lacking.gap(NAME) == GAP
    # another engine's own signals are not the toy's to give, nor its to lack
    assert SIGNALS["sglang_servers"].expression(NAME) is None
    assert SIGNALS["target_up"].gap(NAME) == JUDGED


@pytest.mark.prometheus
def test_the_finding_comes_out_for_the_toy_engines_model(diagnosed):
    report, model = diagnosed
    found = {(f["id"], f["scope"].get("model_name")) for f in report["findings"]}
    assert ("kv-cache-pressure", model) in found, found


@pytest.mark.prometheus
def test_what_the_toy_engine_lacks_is_undecided_with_its_reason(diagnosed):
    report, model = diagnosed
    undecided = {u["id"]: u for u in report["undecided"] if u["scope"].get("model_name") == model}
    lacking = undecided["stop-token-mismatch"]
    assert GAP in lacking["reason"]
    assert lacking["provided_by"] == []
