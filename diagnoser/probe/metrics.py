"""The probe's metric families, shared by ``servediag probe`` and the simulator.

Both write the same names, label names, label values and bucket bounds (the probe's rows of
``diagnoser.metrics.families``), so the signals, recording rules and dashboards read a real probe
and a simulated one alike:

- ``llm_probe_ttft_seconds``, ``llm_probe_itl_seconds``, ``llm_probe_e2e_seconds``:
  histograms labelled ``model_name``, ``target``, ``prompt_bucket``;
- ``llm_probe_requests_total{model_name, target, prompt_bucket, outcome}``.

The real probe adds two families of its own (not read by any signal):
``llm_probe_prompt_tokens{..., source}``, the length of the class's latest prompt as the
probe counted it (``source="tokenizer"`` or ``"approximation"``) and as the server did
(``source="server"``, from ``usage.prompt_tokens``); and ``llm_probe_skipped_total{...,
reason}``, requests not sent because of the budget or the in-flight limit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from diagnoser.metrics import exporters
from diagnoser.metrics.exposition import Histogram, Recorder, labels_of
from diagnoser.probe.stream import OUTCOMES

SKIPPED_HELP = "Probe requests not sent, by reason (budget, in_flight)."
PROMPT_HELP = "Prompt length of the class's latest request, by who counted it."


@dataclass
class ProbeMetrics:
    """Histograms and counters per prompt bucket label."""

    ttft: dict[str, Histogram] = field(default_factory=dict)
    itl: dict[str, Histogram] = field(default_factory=dict)
    e2e: dict[str, Histogram] = field(default_factory=dict)
    outcomes: dict[tuple[str, str], float] = field(default_factory=dict)
    skipped: dict[tuple[str, str], float] = field(default_factory=dict)
    prompt_tokens: dict[tuple[str, str], float] = field(default_factory=dict)

    def bucket(self, label: str) -> None:
        """Create the bucket's series at zero, so a first failure is already a rate."""
        if label not in self.ttft:
            self.ttft[label] = Histogram(exporters.PROBE_TTFT.bucket_bounds(0))
            self.itl[label] = Histogram(exporters.PROBE_ITL.bucket_bounds(0))
            self.e2e[label] = Histogram(exporters.PROBE_E2E.bucket_bounds(0))
            for outcome in OUTCOMES:
                self.outcomes.setdefault((label, outcome), 0.0)

    def count(self, label: str, outcome: str) -> None:
        self.bucket(label)
        self.outcomes[(label, outcome)] = self.outcomes.get((label, outcome), 0.0) + 1

    def skip(self, label: str, reason: str) -> None:
        self.skipped[(label, reason)] = self.skipped.get((label, reason), 0.0) + 1

    def observe_ok(
        self,
        label: str,
        ttft: float | None,
        e2e: float,
        gaps: Iterable[float],
        gap_weights: Iterable[float] | None = None,
    ) -> None:
        """A request that ended ok: its latencies, and one count of ``ok``."""
        self.count(label, "ok")
        if ttft is not None:
            self.ttft[label].observe([ttft])
        self.e2e[label].observe([e2e])
        values = list(gaps)
        if values:
            weights = None if gap_weights is None else np.array(list(gap_weights), dtype=float)
            self.itl[label].observe(values, weights)

    def record(self, rec: Recorder, t: float, model_name: str, target: str, **extra: str) -> None:
        """Write every family at ``t``; ``extra`` labels (a target's job, instance) added."""

        def lb(**kw: str) -> tuple[tuple[str, str], ...]:
            return labels_of(model_name=model_name, target=target, **kw, **extra)

        histograms = (
            (exporters.PROBE_TTFT.name, exporters.PROBE_TTFT.help, self.ttft),
            (exporters.PROBE_ITL.name, exporters.PROBE_ITL.help, self.itl),
            (exporters.PROBE_E2E.name, exporters.PROBE_E2E.help, self.e2e),
        )
        for label in self.ttft:
            for name, help_, hists in histograms:
                rec.sample_histogram(name, help_, lb(prompt_bucket=label), t, hists[label])
        series = (
            (
                exporters.PROBE_REQUESTS.name,
                "counter",
                exporters.PROBE_REQUESTS.help,
                "outcome",
                self.outcomes,
            ),
            ("llm_probe_skipped_total", "counter", SKIPPED_HELP, "reason", self.skipped),
            ("llm_probe_prompt_tokens", "gauge", PROMPT_HELP, "source", self.prompt_tokens),
        )
        for name, type_, help_, key, values in series:
            for (label, value_label), value in values.items():
                labels = lb(prompt_bucket=label, **{key: value_label})
                rec.sample(name, type_, help_, labels, t, value)
