"""A check of alert annotations as Go templates, for when promtool is not there to run them.

Prometheus executes ``summary`` and ``description`` as Go ``text/template`` with its own
functions. This is not that parser; it finds what makes Prometheus reject a rule file: an
action without its ``}}``, an unclosed string or parenthesis, an ``{{ if }}`` without its
``{{ end }}`` (or an ``{{ end }}`` or ``{{ else }}`` without its opening), a function that
neither Go nor Prometheus defines, a variable that is not declared, an empty action or an
empty pipeline stage. ``promtool check rules`` remains the full check.
"""

from __future__ import annotations

import re

# Go text/template's builtins and Prometheus' template functions (template/template.go).
FUNCTIONS = frozenset(
    {
        *("and", "or", "not", "len", "index", "slice", "print", "printf", "println"),
        *("html", "js", "urlquery", "call", "eq", "ne", "lt", "le", "gt", "ge"),
        *("query", "first", "label", "value", "strvalue", "args", "reReplaceAll"),
        *("safeHtml", "match", "title", "toUpper", "toLower", "graphLink", "tableLink"),
        *("sortByLabel", "humanize", "humanize1024", "humanizeDuration"),
        *("humanizePercentage", "humanizeTimestamp", "toTime", "toDuration", "pathPrefix"),
        *("externalURL", "parseDuration", "now", "stripPort", "stripDomain", "urlQueryEscape"),
    }
)
# Variables Prometheus defines for an alert's annotations.
VARIABLES = frozenset({"$", "$labels", "$value", "$externalLabels", "$externalURL"})
_OPENS = frozenset({"if", "range", "with", "define", "block"})
_KEYWORDS = _OPENS | {"else", "end", "template", "break", "continue", "true", "false", "nil"}
_TOKEN = re.compile(
    r"""\s+
    |(?P<string>"(?:[^"\\\n]|\\.)*"|`[^`]*`|'(?:[^'\\\n]|\\.)+')
    |(?P<number>[-+]?(?:0[xX][0-9a-fA-F_]+|[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|\.[0-9]+))
    |(?P<variable>\$[A-Za-z0-9_]*)(?P<vfields>(?:\.[A-Za-z0-9_]+)*)
    |(?P<field>\.(?:[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)?)
    |(?P<word>[A-Za-z_][A-Za-z0-9_]*)
    |(?P<op>:=|=|\||\(|\)|,)
    """,
    re.VERBOSE,
)


def template_problem(text: str) -> str | None:
    """Why Prometheus would reject ``text`` as an annotation template, or None."""
    declared = set(VARIABLES)
    opened: list[tuple[str, int]] = []  # (keyword, line)
    pos = 0
    while (start := text.find("{{", pos)) >= 0:
        line = text.count("\n", 0, start) + 1
        end = _action_end(text, start + 2)
        if end is None:
            return f"line {line}: the action opened with {{{{ is not closed with }}}}"
        body = text[start + 2 : end]
        pos = end + 2
        body = body[2:] if body.startswith("- ") else body
        body = body[:-2] if body.endswith(" -") else body
        if body.strip().startswith("/*"):
            if not body.strip().endswith("*/"):
                return f"line {line}: a comment must end with */ right before }}}}"
            continue
        problem = _action_problem(body, line, declared, opened)
        if problem is not None:
            return problem
    if opened:
        keyword, line = opened[-1]
        return f"line {line}: {{{{ {keyword} }}}} has no {{{{ end }}}}"
    return None


def _action_end(text: str, pos: int) -> int | None:
    """Where the ``}}`` that closes the action starting at ``pos`` is, skipping strings."""
    quote = None
    i = pos
    while i < len(text):
        ch = text[i]
        if quote is not None:
            if ch == "\\" and quote != "`":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'`":
            quote = ch
        elif text.startswith("}}", i):
            return i
        elif text.startswith("{{", i):
            return None
        i += 1
    return None


def _action_problem(
    body: str, line: int, declared: set[str], opened: list[tuple[str, int]]
) -> str | None:
    tokens: list[tuple[str, str, str]] = []  # (kind, text, fields)
    pos = 0
    while pos < len(body):
        m = _TOKEN.match(body, pos)
        if m is None:
            return f"line {line}: unexpected {body[pos]!r} in {{{{{body}}}}}"
        pos = m.end()
        kind = m.lastgroup
        if kind is None:  # whitespace
            continue
        if kind == "vfields":
            kind = "variable"
        tokens.append((kind, m.group(kind), m.group("vfields") or ""))
    if not tokens:
        return f"line {line}: an empty action {{{{}}}}"
    first = tokens[0][1] if tokens[0][0] == "word" else ""
    if first in _OPENS:
        opened.append((first, line))
    elif first == "else":
        if not opened or opened[-1][0] not in ("if", "range", "with"):
            return f"line {line}: {{{{ else }}}} outside an if, range or with"
    elif first == "end":
        if not opened:
            return f"line {line}: {{{{ end }}}} closes nothing"
        opened.pop()
    depth, after_pipe = 0, True
    for i, (kind, value, _) in enumerate(tokens):
        if kind == "op" and value == "(":
            depth, after_pipe = depth + 1, True
            continue
        if kind == "op" and value == ")":
            depth -= 1
            if depth < 0:
                return f"line {line}: unexpected ) in {{{{{body}}}}}"
        elif kind == "op" and value == "|":
            if after_pipe:
                return f"line {line}: a pipeline stage is empty in {{{{{body}}}}}"
            after_pipe = True
            continue
        elif kind == "op" and value in (":=", "="):
            if i == 0 or tokens[i - 1][0] != "variable":
                return f"line {line}: {value} without a variable before it"
        elif kind == "word" and value not in _KEYWORDS and value not in FUNCTIONS:
            return f'line {line}: function "{value}" not defined'
        elif kind == "variable":
            declaring = i + 1 < len(tokens) and tokens[i + 1][1] in (":=", ",")
            if declaring:
                declared.add(value)
            elif value not in declared:
                return f"line {line}: undefined variable {value!r}"
        after_pipe = False
    if depth:
        return f"line {line}: unclosed ( in {{{{{body}}}}}"
    if after_pipe and tokens[-1][1] == "|":
        return f"line {line}: a pipeline stage is empty in {{{{{body}}}}}"
    return None
