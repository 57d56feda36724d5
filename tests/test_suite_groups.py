"""The suite's own scheduling: a module that shares a module-scoped fixture runs on one
pytest-xdist worker, so that what the fixture builds (a simulated fleet in a Prometheus, say)
is built once per run, not once per worker that happens to get one of its tests."""

import pytest


@pytest.fixture(scope="module")
def shared():
    return object()


@pytest.mark.parametrize("case", ["plain", "with-params"])
def test_a_module_with_a_shared_fixture_is_one_group(request, shared, case):
    if not request.config.getoption("loadgroup", False):
        pytest.skip("runs under `make test` (pytest-xdist with --dist loadgroup)")
    # xdist's worker names the group in the node id when it sees the mark in time.
    # xdist groups a test only where the "@" follows its parameters' closing "]".
    nodeid = request.node.nodeid
    assert nodeid.endswith(f"[{case}]@tests/test_suite_groups.py"), nodeid
