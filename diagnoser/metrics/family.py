"""A metric family as the toolkit knows it, and the registry every family is entered in.

The table itself is :mod:`diagnoser.metrics.families`.
"""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.metrics.buckets import REQUEST_TOKENS, request_token_buckets, version_key


@dataclass(frozen=True)
class Family:
    name: str
    type: str  # counter | gauge | histogram | summary | untyped
    # an engine's (vllm, sglang), vllm-api-server, dcgm-exporter, servediag-probe, prometheus,
    # kube-state-metrics, cadvisor, node-exporter
    provider: str
    help: str = ""
    since: str = ""  # first version that exposes it
    until: str = ""  # last version that exposes it by default
    hidden_until: str = ""  # last version that has it behind --show-hidden-metrics-for-version
    buckets: tuple[float, ...] | str = ()  # or REQUEST_TOKENS
    labels: tuple[str, ...] = ()  # beyond ``base``
    base: tuple[str, ...] = ()
    values: tuple[str, ...] = ()  # values of labels[0] created at start-up
    requires: str = ""  # the server option without which the engine does not export it

    def exposed_in(self, version: str) -> bool:
        """Whether a server of ``version`` exposes it by default."""
        v = version_key(version)
        if self.since and v < version_key(self.since):
            return False
        return not (self.until and v[: len(version_key(self.until))] > version_key(self.until))

    def bucket_bounds(self, max_model_len: int) -> tuple[float, ...]:
        if self.buckets == REQUEST_TOKENS:
            return request_token_buckets(max_model_len)
        assert isinstance(self.buckets, tuple)
        return self.buckets

    def provided_by(self) -> str:
        if self.provider == "vllm":
            span = f">= {self.since}" if self.since else "(all V1 versions)"
            if self.until:
                span = f"<= {self.until}"
                if self.hidden_until:
                    span += f" (to {self.hidden_until} with --show-hidden-metrics-for-version)"
            need = f", with {self.requires}" if self.requires else ""
            return f"vLLM {span}{need}"
        need = f", with {self.requires}" if self.requires else ""
        return PROVIDERS[self.provider] + need


FAMILIES: dict[str, Family] = {}
# What provides the families of each provider but vLLM (whose depend on its version); each
# engine's is entered with it (``diagnoser.metrics.engines``).
PROVIDERS: dict[str, str] = {
    "vllm-api-server": "the vLLM API server's HTTP/process metrics "
    "(process_* only with --api-server-count 1)",
    "dcgm-exporter": "NVIDIA dcgm-exporter (pod labels, or joined by host)",
    "servediag-probe": "the synthetic probe (servediag probe)",
    "prometheus": "Prometheus itself (scrape health)",
}


def register(fam: Family) -> Family:
    FAMILIES[fam.name] = fam
    return fam


def family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise KeyError(
            f"unknown metric family {name!r}; add it to diagnoser.metrics.families"
        ) from None


def vllm_families(version: str) -> list[Family]:
    """The vLLM families a server of ``version`` exposes with no optional feature on."""
    return [
        f
        for f in FAMILIES.values()
        if f.provider == "vllm" and not f.requires and f.exposed_in(version)
    ]
