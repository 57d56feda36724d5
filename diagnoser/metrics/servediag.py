"""The series ``servediag watch`` serves on ``/metrics``, as far as what reads them needs to
know: the labels they name themselves. The service writes them (``diagnoser.watch``); the
symptom alerts' annotations, the cause alert and the dashboards' "Diagnosis now" row read
them (``diagnoser.outputs``). A scope label named like one of these is served, and read, as
``label_<name>`` (``plumbing.labels.renamed``)."""

from __future__ import annotations

SERIES_LABELS = frozenset(
    ("playbook", "severity", "verdict", "reason", "title", "runbook", "version", "outcome", "kind")
)
