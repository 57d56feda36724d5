"""Alertmanager's webhook payload (version 4): what a notification must look like."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


class PayloadError(ValueError):
    """A request body that is not an Alertmanager webhook notification; one line."""


@dataclass(frozen=True)
class FiringAlert:
    name: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str = ""


@dataclass
class Notification:
    group_key: str
    alerts: list[FiringAlert]


def _strings(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise PayloadError(f"{where}: must map names to strings")
    return dict(raw)


def parse_notification(body: bytes) -> Notification:
    """Alertmanager's webhook JSON (version 4) -> ``Notification``; ``PayloadError`` if not."""
    try:
        return _parse(body)
    except RecursionError:
        raise PayloadError("JSON nested too deeply to be a notification") from None


def _parse(body: bytes) -> Notification:
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"not JSON: {exc}") from None
    except ValueError:  # Python refuses to read an integer of thousands of digits
        raise PayloadError("holds a number of thousands of digits: not a notification") from None
    if not isinstance(raw, dict):
        raise PayloadError("must be a JSON object")
    alerts = raw.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: must be a list")
    out = []
    for i, a in enumerate(alerts):
        if not isinstance(a, dict):
            raise PayloadError(f"alerts[{i}]: must be an object")
        labels = _strings(a.get("labels"), f"alerts[{i}].labels")
        if a.get("status") not in ("firing", "resolved"):
            raise PayloadError(f"alerts[{i}].status: must be firing or resolved")
        out.append(
            FiringAlert(
                name=labels.get("alertname", ""),
                status=str(a["status"]),
                labels=labels,
                annotations=_strings(a.get("annotations", {}), f"alerts[{i}].annotations"),
                starts_at=str(a.get("startsAt", "")),
            )
        )
    group = raw.get("groupKey")
    if group is None:
        group = json.dumps(raw.get("groupLabels") or {}, sort_keys=True)
    if not isinstance(group, str):
        raise PayloadError("groupKey: must be a string")
    return Notification(group, out)
