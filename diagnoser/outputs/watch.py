"""Rules that read ``servediag watch``'s series (its metric contract: docs/rules-and-alerts.md).

- **The page carries the cause**: annotations for each symptom alert that name the model's
  likely cause as the watch service diagnoses it now (the finding of rank 1 for the alert's
  scope), with its confidence, onset and runbook, through Prometheus' ``query`` template
  function. The alert's ``expr`` is not touched: a symptom pages whether or not the service
  runs, and where it names nothing the annotation says so.
- **A cause alert** (``ServediagLikelyCause``): the rank-1 finding of each scope, labelled with
  its playbook and the playbook's severity, so Alertmanager can route and inhibit by playbook.
- **The service's own health**: ``ServediagStale`` (its cycles fail) and ``ServediagDown`` (it
  was scraped within the day and is not now), tickets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from diagnoser.metrics.servediag import SERIES_LABELS
from diagnoser.plumbing.labels import renamed
from diagnoser.site import Site

GROUP = "servediag.watch"
CAUSE_ALERT = "ServediagLikelyCause"
PAGE = "servediag-watch"
NO_CAUSE = "no cause named by servediag watch"
# How long the service's cycles may fail before its findings are called stale; how far back
# "it was scraped before" looks for ServediagDown.
STALE_FOR = "10m"
SEEN_WITHIN = "1d"


def watch_labels(by: Sequence[str]) -> dict[str, str]:
    """Each of the site's group labels with the name the watch service serves it under (one
    named like the service's own labels is ``label_<name>``, as the service renames it)."""
    return renamed(by, SERIES_LABELS)


def _scope_query(site: Site, metric: str, suffix: str = "") -> str:
    """A template pipeline stage that runs ``metric`` for the alert's scope (the site's group
    labels and model_name, each as the watch service names it) and gives its result. Label
    values are quoted by ``printf %q``, so a value with a quote in it stays one value."""
    by = site.config.by
    names = watch_labels(by)
    sel = ", ".join(f"{names[label]}=%q" for label in by)
    args = " ".join(f"$labels.{label}" for label in by)
    return f'printf "{metric}{{{sel}}}{suffix}" {args} | query'


def _rank1(site: Site, metric: str) -> str:
    return _scope_query(site, metric, " and servediag_finding_rank == 1")


def cause_annotations(site: Site) -> dict[str, str]:
    """The annotations each symptom alert of a model gets: its likely cause now, or a plain
    sentence saying the service names none (it never reads as all clear)."""
    verdict = _scope_query(site, "servediag_health")
    stale = (
        '{{ with query "max(servediag_stale) == 1" }} (stale: the last cycle of servediag '
        "watch failed; this is the last good diagnosis){{ end }}"
    )
    cause = (
        f"{{{{ with {_rank1(site, 'servediag_finding')} }}}}{{{{ with . | first }}}}"
        "{{ .Labels.playbook }} ({{ .Labels.severity }}), confidence "
        "{{ .Value | humanizePercentage }}{{ end }}, since "
        f"{{{{ with {_rank1(site, 'servediag_finding_onset_timestamp_seconds')} }}}}"
        "{{ . | first | value | humanizeTimestamp }}{{ else }}an onset not known{{ end }}"
        f"{stale}{{{{ else }}}}{NO_CAUSE}: "
        f"{{{{ with {verdict} }}}}it finds none for this model (verdict "
        '{{ . | first | label "verdict" }}){{ else }}it is not scraped, or has not '
        "diagnosed this model{{ end }}{{ end }}"
    )
    runbook = site.config.runbook_url.format(id="{{ .Labels.playbook }}")
    link = (
        f"{{{{ with {_rank1(site, 'servediag_finding')} }}}}{{{{ with . | first }}}}"
        f"{runbook}{{{{ end }}}}{{{{ else }}}}none: {NO_CAUSE}{{{{ end }}}}"
    )
    return {"likely_cause": cause, "likely_cause_runbook": link}


def cause_alert(site: Site) -> dict[str, Any]:
    """The likely cause of each scope, as an alert of its own: labelled with the playbook and
    the playbook's severity (the series carry both), for routing by playbook. The scrape's job
    and instance are dropped: they name the service, not the server the finding is about."""
    runbook = site.config.runbook_url.format(id="{{ $labels.playbook }}")
    return {
        "alert": CAUSE_ALERT,
        "expr": (
            "max without (job, instance) (\n  servediag_finding and servediag_finding_rank == 1\n)"
        ),
        # The service already holds a finding for 2 cycles before it shows it.
        "for": "2m",
        "labels": {"source": "servediag-watch"},
        "annotations": {
            "summary": "servediag watch names the likely cause of a model's trouble.",
            "description": (
                "{{ $labels.model_name }}: {{ $labels.playbook }} ({{ $labels.severity }}) is "
                "the likely cause servediag watch finds, confidence "
                "{{ $value | humanizePercentage }}, from the full diagnosis of the model's "
                "series (the per-playbook alert fires from the playbook's signature alone). "
                "Run `servediag diagnose --model {{ $labels.model_name }}` for the evidence."
            ),
            "runbook_url": runbook,
        },
    }


def health_alerts(site: Site) -> list[dict[str, Any]]:
    """The service's own trouble, as tickets: the diagnosis it serves is old, or it is gone."""
    runbook = site.runbook(PAGE)
    return [
        {
            "alert": "ServediagStale",
            "expr": "servediag_stale == 1",
            "for": STALE_FOR,
            "labels": {"severity": "warning", "source": "servediag-watch"},
            "annotations": {
                "summary": "servediag watch's diagnosis cycles fail: what it serves is old.",
                "description": (
                    "{{ $labels.instance }}: the last cycle of servediag watch failed, and "
                    f"every cycle for {STALE_FOR}; the findings it serves (and the causes the "
                    "pages carry) are its last good cycle's. Its log and "
                    "servediag_errors_total{kind} say why (Prometheus unreachable, a "
                    "timeout)."
                ),
                "runbook_url": runbook,
            },
        },
        {
            "alert": "ServediagDown",
            "expr": (
                f"group by (job) (present_over_time(servediag_build_info[{SEEN_WITHIN}]))\n"
                "unless on (job) servediag_build_info"
            ),
            "for": "5m",
            "labels": {"severity": "warning", "source": "servediag-watch"},
            "annotations": {
                "summary": "servediag watch was scraped within the day and is not now.",
                "description": (
                    "{{ $labels.job }}: no servediag watch of this job reports, though one did "
                    f"within {SEEN_WITHIN}: pages carry no cause and ServediagLikelyCause is "
                    "silent until it is back. Check the process and its scrape target."
                ),
                "runbook_url": runbook,
            },
        },
    ]


def alert_group(site: Site) -> dict[str, Any]:
    return {"name": GROUP, "rules": [cause_alert(site), *health_alerts(site)]}
