"""The layout keeps its promises: every import follows ARCHITECTURE.md's table of which part
may import which, no module imports another that imports it back (however indirectly), no
module grows past 500 lines or squeezes its code to stay under, and every threshold has one
source."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from diagnoser.catalog import PLACEHOLDER

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("diagnoser", "lab")
MAX_LINES = 500
# The table's heading in ARCHITECTURE.md, and a row: | `part` | `a`, `b` ... |
TABLE = "## Which part may import which"
ROW = re.compile(r"^\|\s*`([\w./]+)`\s*\|([^|]*)\|")


def _modules() -> dict[str, Path]:
    """Every module of the shipped package and of the lab, by dotted name."""
    out = {}
    for top in PACKAGES:
        for path in sorted((ROOT / top).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


MODULES = _modules()


def part(module: str) -> str:
    """The part of the layout a module belongs to: ``lab``, a package of ``diagnoser``
    (``diagnosis``), one of its top-level modules (``api``), or ``diagnoser`` itself."""
    pieces = module.split(".")
    if pieces[0] == "lab":
        return "lab"
    return pieces[1] if len(pieces) > 1 else "diagnoser"


def _resolve(name: str) -> str | None:
    """The module an imported name lives in (``diagnoser.diagnosis.model.Diagnosis`` ->
    ``diagnoser.diagnosis.model``), or None outside the project."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(module: str) -> set[str]:
    """The project's modules ``module`` imports anywhere in it: at the top, inside functions,
    under ``TYPE_CHECKING``."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [f"{node.module}.{a.name}" for a in node.names]
    found = {_resolve(n) for n in names}
    return {m for m in found if m is not None and m != module}


def table() -> dict[str, set[str]]:
    """ARCHITECTURE.md's table: each part and the parts it may import."""
    text = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert TABLE in text, f"ARCHITECTURE.md has no section {TABLE!r}"
    rows: dict[str, set[str]] = {}
    for line in text.split(TABLE, 1)[1].splitlines()[1:]:
        if line.startswith("## "):
            break
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = set(re.findall(r"`([\w./]+)`", m.group(2)))
    return rows


ALLOWED = table()


def test_the_table_names_every_part_and_only_parts_that_exist():
    parts = {part(m) for m in MODULES}
    assert set(ALLOWED) == parts, (
        f"parts not in ARCHITECTURE.md's table: {sorted(parts - set(ALLOWED))}; "
        f"rows for parts that do not exist: {sorted(set(ALLOWED) - parts)}"
    )
    named = set().union(*ALLOWED.values())
    assert named <= parts, f"the table allows parts that do not exist: {sorted(named - parts)}"


def _edges() -> Iterator[tuple[str, str]]:
    for module in MODULES:
        for target in imports(module):
            yield module, target


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_import_is_one_the_table_allows(module):
    mine = part(module)
    wrong = sorted(
        t for t in imports(module) if part(t) != mine and part(t) not in ALLOWED.get(mine, ())
    )
    assert not wrong, f"{module} ({mine}) imports {wrong}, which ARCHITECTURE.md does not allow"


def test_the_table_itself_has_no_cycle_between_parts():
    seen: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(p: str, path: list[str]) -> None:
        seen[p] = 1
        for q in sorted(ALLOWED.get(p, ())):
            assert seen.get(q) != 1, f"the table allows a cycle: {' -> '.join([*path, q])}"
            if q not in seen:
                visit(q, [*path, q])
        seen[p] = 2

    for p in sorted(ALLOWED):
        if p not in seen:
            visit(p, [p])


def cycles() -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (Tarjan's
    strongly connected components of more than one module)."""
    graph = {m: sorted(imports(m)) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            connect(v)
    return found


def test_no_module_imports_one_that_imports_it_back():
    assert cycles() == []


def test_the_cycle_finder_finds_a_cycle(monkeypatch):
    """The check above can fail: two modules made to import each other are found."""
    a, b = "diagnoser.request", "diagnoser.api"
    real = imports

    def fake(module: str) -> set[str]:
        extra = {b: {a}, a: {b}}.get(module, set())
        return real(module) | extra

    monkeypatch.setitem(globals(), "imports", fake)
    assert any({a, b} <= set(group) for group in cycles())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_500_lines_or_squeezed(module):
    path = MODULES[module]
    text = path.read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines; split it by concept"
    tree = ast.parse(text)
    starred = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names)
    ]
    assert not starred, f"{path.relative_to(ROOT)}:{starred[0]}: import *"
    bodies = [
        getattr(n, field)
        for n in ast.walk(tree)
        for field in ("body", "orelse", "finalbody")
        if isinstance(getattr(n, field, None), list)
    ]
    for body in bodies:
        starts = [s.lineno for s in body if isinstance(s, ast.stmt)]
        joined = sorted({ln for ln in starts if starts.count(ln) > 1})
        assert not joined, f"{path.relative_to(ROOT)}:{joined[0]}: statements joined on a line"


def test_the_probe_and_the_simulator_do_not_import_each_other_both_ways():
    probe = {m for m in MODULES if part(m) == "probe"}
    assert not any(part(t) == "sim" for m in probe for t in imports(m))


def test_every_alert_parameter_is_a_signature_threshold_or_says_why_it_is_not(catalog):
    for pb in catalog.detectable():
        assert pb.alert is not None and pb.signature is not None
        bound = pb.signature.bound()
        for name in pb.alert.params:
            assert name in bound or name in pb.alert.why, (
                f"{pb.id}: alert parameter {name!r} is neither bound to a signature condition "
                "(param:) nor explained (params: {name: {value, why}})"
            )


def test_a_bound_parameter_is_the_conditions_threshold_on_the_same_signal(catalog):
    for pb in catalog.detectable():
        assert pb.alert is not None and pb.signature is not None
        used = {m.group(1) for m in PLACEHOLDER.finditer(pb.alert.expr)}
        for name, cond in pb.signature.bound().items():
            assert pb.alert.params[name] == float(cond.value), (pb.id, name)
            assert cond.signal in used, f"{pb.id}: {name} is bound to {cond.signal}, not alerted"
