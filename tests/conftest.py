from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The shared design material sits beside the project's root (../shared).
SHARED = Path(os.environ.get("SERVEDIAG_SHARED", ROOT.parent / "shared"))


@pytest.fixture(scope="session")
def site():
    from diagnoser.site import Site

    return Site.default()


@pytest.fixture(scope="session")
def catalog(site):
    return site.catalog


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"the shared design material is missing: {SHARED} (set SERVEDIAG_SHARED)")
    return SHARED


@pytest.fixture(scope="session")
def promtool_bin() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: run scripts/install-deps (Debian package prometheus)")
    return exe


@pytest.fixture(scope="session")
def scenario_library(tmp_path_factory):
    """Every library scenario simulated once and backfilled into its own TSDB directory."""
    from diagnoser.lab import harness
    from diagnoser.sim import library

    return harness.prepare(library.names(), tmp_path_factory.mktemp("scenarios"))


@pytest.fixture(scope="session")
def prometheus_for(scenario_library):
    """``prometheus_for(name)``: a real Prometheus serving that scenario (started once)."""
    from diagnoser.lab.promserver import Prometheus

    servers: dict[str, Prometheus] = {}

    def get(name: str) -> Prometheus:
        if name not in servers:
            servers[name] = Prometheus(scenario_library[name].data_dir).start()
        return servers[name]

    yield get
    for server in servers.values():
        server.close()
