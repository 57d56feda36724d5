"""The suite's fast loop (``make test-fast``): a test that needs promtool or a server is
marked ``prometheus``, by the fixtures it asks for or by its own mark, and a run without the
servers puts stand-ins on PATH that fail loudly where a mark is missing."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from conftest import SERVER_BINARIES, STAND_IN_EXIT, write_stand_ins

import diagnoser
from lab import promserver


@pytest.fixture
def through_another_fixture(promtool_bin):
    return promtool_bin


def test_a_test_asking_for_a_server_fixture_through_another_is_marked(
    request, through_another_fixture
):
    assert request.node.get_closest_marker("prometheus") is not None


@pytest.mark.promtool
def test_the_promtool_mark_makes_a_prometheus_test(request):
    assert request.node.get_closest_marker("prometheus") is not None


def test_a_test_that_asks_for_no_server_is_not_marked(request, site):
    assert request.node.get_closest_marker("prometheus") is None


@pytest.mark.parametrize("name", SERVER_BINARIES)
def test_a_stand_in_fails_and_says_the_mark_is_missing(tmp_path, name):
    write_stand_ins(tmp_path)
    proc = subprocess.run([tmp_path / name, "--version"], capture_output=True, text=True)
    assert proc.returncode == STAND_IN_EXIT
    assert proc.stdout == ""
    assert proc.stderr.startswith(f"{name} is stood in for") and "prometheus mark" in proc.stderr


def _strings(nodes: list[ast.expr]) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _named(node: ast.AST) -> set[str]:
    """What ``binary(...)`` or ``shutil.which(...)`` is asked to find, or what a server class
    lists in ``NAMES = (...)``."""
    if isinstance(node, ast.Call):
        f = node.func
        callee = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        return _strings(node.args) if callee in ("binary", "which") else set()
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
        names = any(isinstance(t, ast.Name) and t.id == "NAMES" for t in node.targets)
        return _strings(node.value.elts) if names else set()
    return set()


def _binaries_named_in(package: Path) -> set[str]:
    """The binaries a package's code finds on PATH."""
    found: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            found |= _named(node)
    return found


def test_every_binary_the_package_and_the_lab_run_is_stood_in_for():
    found = set()
    for module in (diagnoser, promserver):
        found |= _binaries_named_in(Path(module.__file__).parent)
    assert {"prometheus", "promtool", "alertmanager", "victoria-metrics"} <= found
    assert found <= set(SERVER_BINARIES), found - set(SERVER_BINARIES)
