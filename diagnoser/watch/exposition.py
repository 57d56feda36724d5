"""``servediag watch``'s ``/metrics``: the Prometheus text exposition (0.0.4) of what the
service found and how its cycles went. The names and labels are a contract that alert rules
and dashboards are written against (``docs/commands/watch.md``): change none of them.

A scope's labels are ``model_name``, the site's group labels and, for a finding about a
scrape target, its ``job`` and ``instance``. One named like a label these series carry
themselves (``playbook``, ``severity``, ``verdict``, ...) is exposed as ``label_<name>``
(prefixed again while that is taken), the rule the CSV and the frames follow
(``diagnosis.rows.scope_labels``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from diagnoser.metrics.exposition import labelstr, number
from diagnoser.metrics.servediag import SERIES_LABELS
from diagnoser.plumbing.labels import renamed

if TYPE_CHECKING:
    from diagnoser.site import Site
    from diagnoser.watch.state import Findings

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
ERROR_KINDS = ("source", "timeout", "internal")
OUTCOMES = ("ok", "error")
RANGE_READS = ("full", "partial")


@dataclass
class Status:
    """How the cycles went, as served beside the findings."""

    version: str
    cycles: dict[str, int]
    errors: dict[str, int]
    queries: int
    samples: int
    range_reads: dict[str, int]  # range queries read whole ("full") or from their last steps
    reused_points: int  # points taken from the last cycle's answers instead of the store
    cycle_seconds: float | None
    last_success: float | None
    stale: bool


def scope_label_names(scopes: Iterable[dict[str, str]], by: Sequence[str]) -> dict[str, str]:
    """Each scope label with the label name it is exposed as: the site's group labels first,
    then any other a scope carries, in order of appearance."""
    return renamed([*by, *(k for scope in scopes for k in scope)], SERIES_LABELS)


class _Text:
    """Families written one after the other, each with its HELP and TYPE once."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, labels: Iterable[tuple[str, str]], value: float) -> None:
        self.lines.append(f"{name}{labelstr(tuple(labels))} {number(value)}")


def render(site: Site, findings: Findings, status: Status, now: float) -> str:
    """The whole ``/metrics`` text; ``now`` (Unix seconds) for the age of the last success."""
    served = findings.served()
    scopes = [
        *(v.scope for v in findings.health),
        *(h.scope for h, _ in served),
        *(u.scope for u in findings.undecided),
    ]
    names = scope_label_names(scopes, site.config.by)

    def scope(s: dict[str, str]) -> list[tuple[str, str]]:
        return [(names[k], s[k]) for k in names if k in s]

    out = _Text()
    rows = [
        (h, rank, [*scope(h.scope), ("playbook", h.playbook), ("severity", h.severity)])
        for h, rank in served
    ]
    out.family(
        "servediag_finding",
        "gauge",
        "A finding served (held on 2 consecutive cycles, until absent for --clear-after): "
        "its confidence, 0 to 1.",
    )
    for h, _, labels in rows:
        out.sample("servediag_finding", labels, h.confidence)
    out.family(
        "servediag_finding_onset_timestamp_seconds",
        "gauge",
        "When the finding began (Unix seconds), where the diagnosis dates it.",
    )
    for h, _, labels in rows:
        if h.onset is not None and h.onset == h.onset:
            out.sample("servediag_finding_onset_timestamp_seconds", labels, h.onset)
    out.family(
        "servediag_finding_rank",
        "gauge",
        "The finding's rank within its model: 1 for the likely cause.",
    )
    for _, rank, labels in rows:
        out.sample("servediag_finding_rank", labels, rank)
    out.family(
        "servediag_playbook_info",
        "gauge",
        "Every playbook of the catalog, with its title, severity and runbook.",
    )
    catalog = site.catalog
    for pid in sorted(catalog.ids()):
        pb = catalog[pid]
        labels = [
            ("playbook", pid),
            ("title", pb.title),
            ("severity", pb.severity),
            ("runbook", site.runbook(pid)),
        ]
        out.sample("servediag_playbook_info", labels, 1)
    out.family(
        "servediag_health",
        "gauge",
        "Each scope's verdict (healthy, unhealthy, idle or unknown) at the last good cycle.",
    )
    for v in findings.health:
        out.sample("servediag_health", [*scope(v.scope), ("verdict", v.verdict)], 1)
    out.family(
        "servediag_undecided",
        "gauge",
        "A playbook the last good cycle could not decide on a scope, and why.",
    )
    for u in findings.undecided:
        labels = [*scope(u.scope), ("playbook", u.playbook), ("reason", u.reason)]
        out.sample("servediag_undecided", labels, 1)
    _status(out, status, now)
    return "\n".join(out.lines) + "\n"


def _status(out: _Text, status: Status, now: float) -> None:
    out.family("servediag_cycle_duration_seconds", "gauge", "The wall time of the last cycle.")
    if status.cycle_seconds is not None:
        out.sample("servediag_cycle_duration_seconds", (), status.cycle_seconds)
    out.family("servediag_cycles_total", "counter", "Cycles run, by outcome.")
    for outcome in OUTCOMES:
        out.sample("servediag_cycles_total", [("outcome", outcome)], status.cycles.get(outcome, 0))
    out.family("servediag_queries_total", "counter", "Queries the cycles sent.")
    out.sample("servediag_queries_total", (), status.queries)
    out.family("servediag_samples_read_total", "counter", "Samples the cycles' answers held.")
    out.sample("servediag_samples_read_total", (), status.samples)
    out.family(
        "servediag_range_queries_total",
        "counter",
        "Range queries by how they were read: full (the whole window), partial (the steps "
        "new since the last cycle, the rest taken from its answer).",
    )
    for read in RANGE_READS:
        n = status.range_reads.get(read, 0)
        out.sample("servediag_range_queries_total", [("read", read)], n)
    out.family(
        "servediag_points_reused_total",
        "counter",
        "Points taken from the last cycle's answers instead of read again.",
    )
    out.sample("servediag_points_reused_total", (), status.reused_points)
    out.family(
        "servediag_errors_total",
        "counter",
        "Failed cycles by kind: source (unreachable, or answering garbage), timeout, internal.",
    )
    for kind in ERROR_KINDS:
        out.sample("servediag_errors_total", [("kind", kind)], status.errors.get(kind, 0))
    out.family(
        "servediag_last_success_timestamp_seconds",
        "gauge",
        "The start of the last good cycle (Unix seconds).",
    )
    if status.last_success is not None:
        out.sample("servediag_last_success_timestamp_seconds", (), status.last_success)
    out.family(
        "servediag_last_success_age_seconds",
        "gauge",
        "Seconds since the start of the last good cycle, at this scrape.",
    )
    if status.last_success is not None:
        out.sample("servediag_last_success_age_seconds", (), max(now - status.last_success, 0.0))
    out.family(
        "servediag_stale",
        "gauge",
        "1 when the last cycle failed: the findings and verdicts are the last good cycle's.",
    )
    out.sample("servediag_stale", (), 1 if status.stale else 0)
    out.family("servediag_build_info", "gauge", "The servediag version serving these metrics.")
    out.sample("servediag_build_info", [("version", status.version)], 1)
