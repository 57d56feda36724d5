"""Alerts checked as Prometheus will load them, with the problems traced to the playbook.

Each playbook's alert is rendered for the site (placeholders resolved, the traffic floor and
the fallback added, the summary and description with their parameters) into a group of its
own, named after the playbook, in a scratch rule file that ``promtool check rules`` reads:
promtool parses every expression with Prometheus' own PromQL parser and every annotation as
the Go template Prometheus will execute. Each problem it reports is mapped back through the
group to the playbook's file and the field (``alert.expr``, ``alert.description``, ...).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path

from diagnoser.catalog import CatalogError, Playbook
from diagnoser.outputs.rules import PromtoolError, alert_rule, dump
from diagnoser.site import Site

# promtool's lines: `FILE: 5:11: group "ID", rule 1, "ALERT": could not parse expression: ...`
# and `FILE: group "ID", rule 1, "ALERT": annotation "description": template: ...`.
_PROBLEM = re.compile(r'group "(?P<group>[^"]*)", rule \d+, "[^"]*": (?P<message>.+)$')
_EXPR = re.compile(r"could not parse expression: (?P<why>.+)$")
_TEMPLATE = re.compile(
    r'annotation "(?P<name>[^"]+)": template: [^:]*:(?P<line>\d+):\s*(?P<why>.+)$'
)
_FIELDS = {"summary": "alert.summary", "description": "alert.description"}


class PromtoolMissing(PromtoolError):
    """promtool is not on PATH, so nothing could be parsed."""


def check_alerts(site: Site, playbooks: Iterable[Playbook]) -> list[CatalogError]:
    """The problems Prometheus would find in these playbooks' alerts, one per line promtool
    reports. Raises ``PromtoolMissing`` without promtool, and ``PromtoolError`` when it
    fails in a way no playbook explains."""
    by_id = {pb.id: pb for pb in playbooks if pb.alert is not None}
    if not by_id:
        return []
    exe = shutil.which("promtool")
    if exe is None:
        raise PromtoolMissing("promtool not found on PATH (Debian package 'prometheus')")
    groups = [{"name": pid, "rules": [alert_rule(pb, site)]} for pid, pb in by_id.items()]
    with tempfile.TemporaryDirectory(prefix="servediag-") as tmp:
        rules = Path(tmp) / "alerts.rules.yaml"
        rules.write_text(dump({"groups": groups}), encoding="utf-8")
        proc = subprocess.run(
            [exe, "check", "rules", str(rules)], capture_output=True, text=True, check=False
        )
    if proc.returncode == 0:
        return []
    output = proc.stdout + proc.stderr
    problems = []
    for line in output.splitlines():
        m = _PROBLEM.search(line)
        if m is None or m.group("group") not in by_id:
            continue
        problems.append(_problem(by_id[m.group("group")], m.group("message")))
    if not problems:
        raise PromtoolError(output.strip())
    return problems


def _problem(pb: Playbook, message: str) -> CatalogError:
    expr = _EXPR.match(message)
    if expr is not None:
        return CatalogError(
            pb.path, "alert.expr", f"not valid PromQL once rendered: {expr.group('why')}"
        )
    template = _TEMPLATE.match(message)
    if template is not None:
        where = _FIELDS.get(template.group("name"), f"annotations.{template.group('name')}")
        why = f"not a valid template: line {template.group('line')}: {template.group('why')}"
        return CatalogError(pb.path, where, why)
    return CatalogError(pb.path, "alert", f"Prometheus would reject it: {message}")
