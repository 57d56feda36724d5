"""The suite's fast loop (``make test-fast``): a test that needs promtool or a server is
marked ``prometheus``, by the fixtures it asks for or by its own mark, and a run without the
servers puts stand-ins on PATH that fail loudly where a mark is missing."""

from __future__ import annotations

import subprocess

import pytest
from conftest import SERVER_BINARIES, STAND_IN_EXIT, write_stand_ins


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
