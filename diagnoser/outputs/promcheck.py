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
from diagnoser.metrics import engines
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


def rule_files_problem(files: dict[str, str]) -> str | None:
    """What Prometheus would refuse in these rule files (name -> text, the plain Prometheus
    format), as one line: the first problem and how many more; None when they load. This is
    the whole output, recording rules and the symptom and SLO alerts included, which the
    site config alone shapes (an SLO override's regex that Go's engine cannot compile, say):
    the per-playbook check of ``check_alerts`` does not see them. promtool when it is on the
    PATH; otherwise each expression through the promql-parser library, or its brackets."""
    exe = shutil.which("promtool")
    if exe is not None:
        with tempfile.TemporaryDirectory(prefix="servediag-") as tmp:
            paths = []
            for name, text in files.items():
                path = Path(tmp) / name
                path.write_text(text, encoding="utf-8")
                paths.append(str(path))
            proc = subprocess.run(
                [exe, "check", "rules", *paths], capture_output=True, text=True, check=False
            )
            if proc.returncode == 0:
                return None
            output = (proc.stdout + proc.stderr).replace(f"{tmp}/", "rules/")
        found = [line.strip() for line in output.splitlines() if _PROBLEM.search(line)]
        found = found or [line.strip() for line in output.splitlines() if line.strip()][-1:]
    else:
        found = _parse_rule_files(files)
        if not found:
            return None
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return f"{found[0]}{more}"


def _parse_rule_files(files: dict[str, str]) -> list[str]:
    import yaml

    parse = _promql_parser()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found = []
    for name, text in files.items():
        doc = yaml.load(text, Loader=loader)  # a safe loader: ours, or libyaml's
        for group in doc.get("groups", []):
            for i, rule in enumerate(group.get("rules", []), 1):
                expr = str(rule.get("expr", ""))
                why = balance_problem(expr)
                if why is None and parse is not None:
                    try:
                        parse(expr)
                    except Exception as exc:  # ValueError, or the library's own on a panic
                        why = " ".join(str(exc).split()) or type(exc).__name__
                if why is not None:
                    what = rule.get("record") or rule.get("alert")
                    found.append(
                        f'rules/{name}: group "{group.get("name")}", rule {i}, "{what}": '
                        f"could not parse expression: {why}"
                    )
    return found


def config_matchers_problem(site: Site) -> str | None:
    """The first of the site config's label matchers (``selector``, each engine's
    ``<engine>_targets``, each ``slo.overrides[i].match``) that Prometheus would refuse, as
    ``FIELD: why``, or None. Python's ``re`` accepts regexes Go's engine does not (``a++``,
    ``(?=...)``); found here, the problem names the config's field instead of surfacing in
    every rule that carries the matcher."""
    cfg = site.config
    fields = [(f"selector[{i}]", m) for i, m in enumerate(cfg.selector)]
    fields += [(f"{e}_targets", cfg.targets(e)) for e in engines.names()]
    for i, ov in enumerate(cfg.slo.overrides):
        fields += [(f"slo.overrides[{i}].match[{j}]", str(m)) for j, m in enumerate(ov.match)]
    exprs = {field: f"up{{{matcher}}}" for field, matcher in fields}
    exe = shutil.which("promtool")
    if exe is None:
        parse = _promql_parser()
        for field, expr in exprs.items():
            why = balance_problem(expr)
            if why is None and parse is not None:
                try:
                    parse(expr)
                except Exception as exc:  # ValueError, or the library's own on a panic
                    why = " ".join(str(exc).split()) or type(exc).__name__
            if why is not None:
                return f"{field}: not a matcher Prometheus accepts: {why}"
        return None
    groups = [
        {"name": field, "rules": [{"record": "servediag:config_check", "expr": expr}]}
        for field, expr in exprs.items()
    ]
    with tempfile.TemporaryDirectory(prefix="servediag-") as tmp:
        rules = Path(tmp) / "config.rules.yaml"
        rules.write_text(dump({"groups": groups}), encoding="utf-8")
        proc = subprocess.run(
            [exe, "check", "rules", str(rules)], capture_output=True, text=True, check=False
        )
    for line in (proc.stdout + proc.stderr).splitlines():
        m = _PROBLEM.search(line)
        if m is not None and m.group("group") in exprs:
            why = m.group("message").removeprefix("could not parse expression: ")
            why = re.sub(r"^\d+:\d+: parse error: ", "", why)  # a place in up{...}, not theirs
            return f"{m.group('group')}: not a matcher Prometheus accepts: {why}"
    return None
