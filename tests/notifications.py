"""Alertmanager's webhook notifications as the tests post them: a firing alert of one
playbook's rule for one model, and the notification that carries a group of alerts."""

from __future__ import annotations

from typing import Any

PLAYBOOK = "context-length-rejections"


def alert(
    model: str = "m-1", status: str = "firing", *, runbook: str | None = None, **labels: str
) -> dict[str, Any]:
    """``PLAYBOOK``'s alert for ``model``; ``labels`` add to its labels or replace them, and
    ``runbook`` is the annotation a playbook's alert carries."""
    annotations = {"summary": "Requests are refused."}
    if runbook is not None:
        annotations["runbook_url"] = runbook
    return {
        "status": status,
        "labels": {
            "alertname": "VllmRequestsRejected",
            "severity": "warning",
            "playbook": PLAYBOOK,
            "model_name": model,
            **labels,
        },
        "annotations": annotations,
        "startsAt": "2026-11-29T03:00:00Z",
    }


def notification(*alerts: dict[str, Any], group: str = "{}:{alertname=x}") -> dict[str, Any]:
    """A firing notification of ``group`` (Alertmanager's group key) carrying ``alerts``."""
    return {"version": "4", "groupKey": group, "status": "firing", "alerts": list(alerts)}
