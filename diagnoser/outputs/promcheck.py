"""Alerts checked as Prometheus will load them, with the problems traced to the playbook.

Each playbook's alert is rendered for the site (placeholders resolved, the traffic floor and
the fallback added, the summary and description with their parameters) into a group of its
own, named after the playbook, in a scratch rule file that ``promtool check rules`` reads:
promtool parses every expression with Prometheus' own PromQL parser and every annotation as
the Go template Prometheus will execute. Each problem it reports is mapped back through the
group to the playbook's file and the field (``alert.expr``, ``alert.description``, ...).

Without promtool, the expressions go through the ``promql-parser`` library when it is
installed (``pip install 'servediag[promql]'``) and the annotations through
``outputs.gotemplate``; ``Checked.parser`` says which parser read the expressions (None: no
parser was found, and they were not parsed).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from diagnoser.catalog import CatalogError, Playbook
from diagnoser.outputs.gotemplate import template_problem
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


@dataclass(frozen=True)
class Checked:
    """What the check found, and what read the expressions: ``promtool``, ``promql-parser``
    or None (no parser: only their strings and brackets were checked, and the templates)."""

    problems: list[CatalogError]
    parser: str | None


def check_alerts(site: Site, playbooks: Iterable[Playbook]) -> Checked:
    """The problems Prometheus would find in these playbooks' alerts: with promtool, one per
    line it reports (``PromtoolError`` when it fails in a way no playbook explains); without
    it, what the fallback parsers find."""
    by_id = {pb.id: pb for pb in playbooks if pb.alert is not None}
    exe = shutil.which("promtool")
    if exe is None:
        return _without_promtool(site, list(by_id.values()))
    if not by_id:
        return Checked([], "promtool")
    groups = [{"name": pid, "rules": [alert_rule(pb, site)]} for pid, pb in by_id.items()]
    with tempfile.TemporaryDirectory(prefix="servediag-") as tmp:
        rules = Path(tmp) / "alerts.rules.yaml"
        rules.write_text(dump({"groups": groups}), encoding="utf-8")
        proc = subprocess.run(
            [exe, "check", "rules", str(rules)], capture_output=True, text=True, check=False
        )
    if proc.returncode == 0:
        return Checked([], "promtool")
    output = proc.stdout + proc.stderr
    problems = []
    for line in output.splitlines():
        m = _PROBLEM.search(line)
        if m is None or m.group("group") not in by_id:
            continue
        problems.append(_problem(by_id[m.group("group")], m.group("message")))
    if not problems:
        raise PromtoolError(output.strip())
    return Checked(problems, "promtool")


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


def _without_promtool(site: Site, playbooks: list[Playbook]) -> Checked:
    parse = _promql_parser()
    problems = []
    for pb in playbooks:
        rule = alert_rule(pb, site)
        why = balance_problem(rule["expr"])
        if why is None and parse is not None:
            try:
                parse(rule["expr"])
            except Exception as exc:  # ValueError, or the library's own error on a panic
                why = " ".join(str(exc).split()) or type(exc).__name__
        if why is not None:
            problems.append(
                CatalogError(pb.path, "alert.expr", f"not valid PromQL once rendered: {why}")
            )
        for name, text in rule["annotations"].items():
            wrong = template_problem(text)
            if wrong is not None:
                where = _FIELDS.get(name, f"annotations.{name}")
                problems.append(CatalogError(pb.path, where, f"not a valid template: {wrong}"))
    return Checked(problems, "promql-parser" if parse is not None else None)


_PAIRS = {"(": ")", "[": "]", "{": "}"}


def balance_problem(expr: str) -> str | None:
    """What no PromQL parser accepts, found without one: a string that is not closed (a
    quoted one on its line), or a bracket, parenthesis or brace that is not closed or closes
    nothing."""
    stack: list[str] = []
    quote = None
    i = 0
    while i < len(expr):
        ch = expr[i]
        if quote is not None:
            if ch == "\\" and quote != "`":
                i += 1
            elif ch == quote:
                quote = None
            elif ch == "\n" and quote != "`":
                return f"a string opened with {quote} is not closed on its line"
        elif ch in "\"'`":
            quote = ch
        elif ch == "#":  # a comment, to the end of the line
            end = expr.find("\n", i)
            i = len(expr) if end < 0 else end
        elif ch in _PAIRS:
            stack.append(_PAIRS[ch])
        elif ch in ")]}" and (not stack or stack.pop() != ch):
            return f"unexpected {ch!r} at character {i + 1}"
        i += 1
    if quote is not None:
        return f"a string opened with {quote} is not closed"
    if stack:
        return f"{len(stack)} bracket(s) not closed (expected {''.join(reversed(stack))!r})"
    return None


def _promql_parser() -> Callable[[str], object] | None:
    """``promql_parser.parse`` (a PromQL parser library), or None when it is not installed."""
    try:
        import promql_parser
    except ImportError:
        return None
    parse: Callable[[str], object] = promql_parser.parse
    return parse
