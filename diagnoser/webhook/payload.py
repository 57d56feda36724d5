"""Alertmanager's webhook payload (version 4): what a notification must look like."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_DIGITS = 4300  # Python's own limit for reading an integer (sys.get_int_max_str_digits)


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


def _int(text: str) -> int:
    """An integer of the body. Python refuses to read one of over ``MAX_DIGITS`` digits with
    a ValueError of its own, which no JSON error handler expects: refuse it first."""
    digits = len(text) - text.startswith("-")
    if digits > MAX_DIGITS:
        raise PayloadError(f"a number of {digits} digits (at most {MAX_DIGITS})")
    return int(text)


def _parse(body: bytes) -> Notification:
    try:
        raw = json.loads(body, parse_int=_int)
    except PayloadError:
        raise
    except ValueError as exc:  # not UTF-8, not JSON
        raise PayloadError(f"not JSON: {exc}") from None
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
