"""What the simulator runs for each registered engine: whose metric bookkeeping a server keeps
(vLLM's or SGLang's), the versions it can be held to, and the names its families are written
under.

An engine names its simulator in the registry (``Engine.simulator``): a built-in one by the
module that writes its metrics, or a :class:`Profile` of its own. A profile may run a built-in
engine's mechanics and write its families under another prefix (an engine whose families are
a renamed vLLM's, say), through :class:`RenamingRecorder`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from diagnoser.metrics import engines
from diagnoser.metrics.exposition import Histogram, Labels, Recorder
from diagnoser.sim import sglang_metrics, vllm_metrics


@dataclass(frozen=True)
class Profile:
    mechanics: str  # the built-in engine whose metrics the server keeps: "vllm" or "sglang"
    versions: Mapping[str, str]  # version profile -> the release it is held to
    # Write the families named with the first prefix under the second instead.
    rename: tuple[str, str] | None = None


BUILT_IN = {
    vllm_metrics.__name__: Profile("vllm", vllm_metrics.PROFILES),
    sglang_metrics.__name__: Profile("sglang", sglang_metrics.PROFILES),
}


def profile(runtime: str) -> Profile:
    """The simulator profile of the engine named ``runtime``."""
    sim = engines.get(runtime).simulator
    return sim if isinstance(sim, Profile) else BUILT_IN[sim]


class Runtimes(Mapping[str, Mapping[str, str]]):
    """Each registered engine's version profiles, by engine name (the registry, read when
    asked, so an engine registered later is there)."""

    def __getitem__(self, runtime: str) -> Mapping[str, str]:
        if runtime not in engines.names():
            raise KeyError(runtime)
        return profile(runtime).versions

    def __iter__(self) -> Iterator[str]:
        return iter(engines.names())

    def __len__(self) -> int:
        return len(engines.names())


class RenamingRecorder(Recorder):
    """Writes into ``inner`` with one prefix of family names replaced by another."""

    def __init__(self, inner: Recorder, rename: tuple[str, str]) -> None:
        super().__init__(inner.history)
        self.inner = inner
        self.old, self.new = rename

    def _name(self, name: str) -> str:
        return self.new + name[len(self.old) :] if name.startswith(self.old) else name

    def sample(
        self, name: str, type_: str, help_: str, labels: Labels, t: float, value: float
    ) -> None:
        self.inner.sample(self._name(name), type_, help_, labels, t, value)

    def sample_histogram(
        self, name: str, help_: str, labels: Labels, t: float, hist: Histogram
    ) -> None:
        self.inner.sample_histogram(self._name(name), help_, labels, t, hist)

    def sample_summary(
        self, name: str, help_: str, labels: Labels, t: float, count: float, total: float
    ) -> None:
        self.inner.sample_summary(self._name(name), help_, labels, t, count, total)
