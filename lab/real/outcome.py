"""What a diagnosis of a real incident found, held against what the incident should give:
the first finding of each window and the health verdict (``summary``), from a live
Prometheus (``diagnosed``, recording its answers) or from the answers replayed later."""

from __future__ import annotations

from dataclasses import dataclass, field

from diagnoser.diagnosis import Diagnosis, Window, diagnose
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.site import Site
from lab.replay import Recording


@dataclass
class Outcome:
    """What one run found: the first finding of each window, and the times it took."""

    incident: str
    expect: str | None
    baseline_expect: str | None = None
    first: str | None = None
    confidence: float | None = None
    health: str = "unknown"
    baseline_first: str | None = None
    baseline_health: str = "unknown"
    startup_seconds: list[float] = field(default_factory=list)
    wall_seconds: float = 0.0
    reasons: list[str] = field(default_factory=list)
    expect_baseline_health: str = "healthy"  # the incident's baseline_health

    @property
    def named(self) -> bool:
        return self.first == self.expect

    @property
    def clean_baseline(self) -> bool:
        """The baseline gave nothing (or what its traffic is built to give), and the verdict
        its incident expects of it."""
        health = self.expect_baseline_health in ("any", self.baseline_health)
        return self.baseline_first == self.baseline_expect and health

    def ok(self, health: str) -> bool:
        """Named first, the baseline as expected, and the verdict ``health`` asks for."""
        return self.named and self.clean_baseline and health in ("any", self.health)


def summary(result: Diagnosis) -> tuple[str | None, float | None, str, list[str]]:
    """(first finding, its confidence, the first scope's verdict, its reasons)."""
    first = result.findings[0] if result.findings else None
    h = result.health[0] if result.health else None
    return (
        first.playbook.id if first else None,
        round(first.confidence, 3) if first else None,
        h.verdict if h else "unknown",
        list(h.reasons) if h else [],
    )


def diagnosed(url: str, site: Site, since: float, end: float) -> tuple[Diagnosis, Recording]:
    source = Recording(PrometheusSource(url))
    result = diagnose(source, site, Window.plan(since, end))
    return result, source
