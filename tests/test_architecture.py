"""The layout keeps its promises: the product never imports the simulator or the lab, no
module grows past 500 lines, and every threshold has one source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from diagnoser.catalog import PLACEHOLDER

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "diagnoser"
# The simulator, the lab that runs it in a real Prometheus (tests, demo, bench), the
# simulator's own command, and what-if (which replays a live workload through it) may import
# the simulator; nothing else may.
SIMULATION = ("diagnoser.sim", "diagnoser.lab")
ALLOWED = ("sim/", "lab/", "cli/simulate.py", "whatif/")
MAX_LINES = 500


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names}
    return out


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_product_module_imports_the_simulator(path):
    rel = str(path.relative_to(PACKAGE))
    if rel.startswith(ALLOWED):
        return
    bad = sorted(m for m in _imports(path) if m.startswith(SIMULATION))
    assert not bad, f"{rel} imports {bad}"


def test_the_probe_and_the_simulator_do_not_import_each_other_both_ways():
    probe_imports = set().union(*(_imports(p) for p in (PACKAGE / "probe").glob("*.py")))
    assert not any(m.startswith("diagnoser.sim") for m in probe_imports)


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or in a function. ``from
    diagnoser.x import y`` imports the module ``diagnoser.x.y`` where there is one (not the
    package ``diagnoser.x`` it is reached through), else ``diagnoser.x``."""
    names = {_name(p) for p in _modules()}

    def module(name: str) -> str:
        while name and name not in names:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for path in _modules():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {module(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found |= {module(f"{node.module}.{a.name}") for a in node.names}
        graph[_name(path)] = found - {"", _name(path)}
    return graph


def test_no_module_imports_one_that_imports_it_back():
    graph = _graph()
    cycles = []
    for start in sorted(graph):
        # Depth-first from each module: a path that comes back to it is a cycle.
        stack = [(start, (start,))]
        seen = set()
        while stack:
            name, path = stack.pop()
            for dep in sorted(graph[name]):
                if dep == start:
                    cycles.append(" -> ".join((*path, start)))
                elif dep not in seen and dep > start:
                    seen.add(dep)
                    stack.append((dep, (*path, dep)))
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("diagnoser.probe", "diagnoser.catalog"),  # the probe measures; it knows no playbook
        ("diagnoser.whatif", "diagnoser.report"),  # what-if prints itself (whatif.figures)
        ("diagnoser.diagnosis", "diagnoser.report"),  # the renderers read the diagnosis
    ],
)
def test_a_package_does_not_import_one_it_may_not_read(package, forbidden):
    bad = sorted(
        f"{name} imports {dep}"
        for name, deps in _graph().items()
        if name.startswith(package)
        for dep in deps
        if dep.startswith(forbidden)
    )
    assert not bad, bad


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_over_500_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines; split it by concept"


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
