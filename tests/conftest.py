from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
# The design material may sit beside the project's root (../shared); the tests read only
# what scripts/extract-reference took from it into tests/data, and check that when it is there.
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
    if not (SHARED / "DESIGN.md").is_file():
        pytest.skip(
            f"the design material is not beside the checkout ({SHARED}): the tests use the "
            "extract committed in tests/data, whose freshness cannot be checked here"
        )
    return SHARED


def data_json(name: str) -> Any:
    """A committed reference file from tests/data."""
    return json.loads((DATA / name).read_text(encoding="utf-8"))


# Values for the dashboards' variables, as Grafana would put them in a query.
GRAFANA_VARIABLES = {
    "$job": ".*",
    "$model_name": ".*",
    "$instance": ".*",
    "$engine": ".*",
    "$__rate_interval": "5m",
    "$__range_s": "3600",
    "$__range": "1h",
    "$ttft_slo": "1.0",
    "$itl_slo": "0.1",
    "$step_budget": "8192",
}


def grafana_substitute(expr: str) -> str:
    """A dashboard query with its variables filled in (longest names first)."""
    for var, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    return expr


@pytest.fixture(scope="session")
def promtool_bin() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool not found: run scripts/install-deps (Debian package prometheus)")
    return exe


def _run_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this run shared by its pytest-xdist workers (each worker's base
    temporary directory lies within it), else the run's own."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def scenario_library(tmp_path_factory):
    """Every library scenario, simulated and backfilled into its own TSDB directory when a
    test first asks for it, once per run whichever worker asks first (SERVEDIAG_TEST_CACHE
    names a directory to keep them between runs: the key holds the simulator's code). The
    directories are shared: start servers on copies."""
    from lab.harness import ScenarioCache

    kept = os.environ.get("SERVEDIAG_TEST_CACHE")
    return ScenarioCache(Path(kept) if kept else _run_root(tmp_path_factory) / "scenarios")


@pytest.fixture(scope="session")
def prometheus_with_rules(scenario_library, tmp_path_factory):
    """``prometheus_with_rules(name)``: a Prometheus serving a copy of that scenario with the
    generated recording rules backfilled over it (what dashboards read from the rules)."""
    from lab.alerts import backfill_rules
    from lab.promserver import Prometheus

    servers: dict[str, Prometheus] = {}

    def get(name: str) -> Prometheus:
        if name not in servers:
            prepared = scenario_library[name]
            data = tmp_path_factory.mktemp(f"rules-{name}") / "tsdb"
            shutil.copytree(prepared.data_dir, data)
            prom = Prometheus(data).start()
            start = prepared.end - 4 * 3600
            backfill_rules(prom, ROOT / "rules" / "recording.rules.yaml", start, prepared.end)
            servers[name] = prom
        return servers[name]

    yield get
    for server in servers.values():
        server.close()


@pytest.fixture(scope="session")
def prometheus_for(scenario_library, tmp_path_factory):
    """``prometheus_for(name)``: a real Prometheus serving that scenario (started once)."""
    from lab.promserver import Prometheus

    servers: dict[str, Prometheus] = {}

    def get(name: str) -> Prometheus:
        if name not in servers:
            data = tmp_path_factory.mktemp(f"serve-{name}") / "tsdb"
            shutil.copytree(scenario_library[name].data_dir, data)
            servers[name] = Prometheus(data).start()
        return servers[name]

    yield get
    for server in servers.values():
        server.close()


# --- where the suite's time goes --------------------------------------------------------------
# Every phase of every test, slowest first, in .pytest-durations.json after a run (pytest's
# --durations prints only the head): what to read before making the suite faster.
_DURATIONS: list[tuple[float, str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _DURATIONS.append((report.duration, report.when, report.nodeid))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _DURATIONS or hasattr(session.config, "workerinput"):  # xdist's controller writes
        return
    total = sum(d for d, _, _ in _DURATIONS)
    ranked = [f"{d:.2f} {when} {node}" for d, when, node in sorted(_DURATIONS, reverse=True)]
    doc = {"total_seconds": round(total, 1), "phases": ranked}
    with contextlib.suppress(OSError):  # a read-only checkout runs the tests all the same
        (ROOT / ".pytest-durations.json").write_text(json.dumps(doc, indent=0) + "\n")


# --- the fast loop: what needs a server is marked (make test-fast leaves it out) -------------
# A test that runs promtool or starts a Prometheus, an Alertmanager or VictoriaMetrics is
# marked ``prometheus``. Asking for one of these fixtures, however indirectly, marks a test
# here; a test that starts a server itself, or through a fixture of its own module, carries
# the mark in its module (``pytestmark`` or ``@pytest.mark.prometheus``). ``promtool``, the
# older mark, implies it. What ``--without-servers`` does keeps the marks honest.
SERVER_FIXTURES = frozenset(
    {"promtool_bin", "scenario_library", "prometheus_for", "prometheus_with_rules"}
)

# Every binary a test or the lab finds on PATH to run a server or promtool.
SERVER_BINARIES = (
    "prometheus",
    "promtool",
    "alertmanager",
    "prometheus-alertmanager",
    "amtool",
    "victoria-metrics",
    "vmctl",
)

# Set to the stand-ins' directory once it is first on PATH (pytest-xdist's workers inherit it).
STAND_INS_ENV = "SERVEDIAG_SERVER_STAND_INS"

STAND_IN_EXIT = 97


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--without-servers",
        action="store_true",
        help="put stand-ins that fail first on PATH for every server binary and promtool: "
        "with -m 'not prometheus', a test that needs one but lacks the mark fails",
    )


def _mark_server_tests(item: pytest.Item) -> None:
    info = getattr(item, "_fixtureinfo", None)
    closure = set(info.names_closure) if info is not None else set()
    if closure & SERVER_FIXTURES or item.get_closest_marker("promtool"):
        item.add_marker(pytest.mark.prometheus)


def write_stand_ins(directory: Path) -> None:
    """A script in ``directory`` for each of ``SERVER_BINARIES`` that says on stderr it is a
    stand-in (the test that ran it lacks the prometheus mark) and exits ``STAND_IN_EXIT``."""
    for name in SERVER_BINARIES:
        script = directory / name
        script.write_text(
            "#!/bin/sh\n"
            f"echo '{name} is stood in for (pytest --without-servers): "
            "the test that ran it needs the prometheus mark' >&2\n"
            f"exit {STAND_IN_EXIT}\n",
            encoding="utf-8",
        )
        script.chmod(0o755)


def _stand_in_for_servers(config: pytest.Config) -> None:
    directory = Path(tempfile.mkdtemp(prefix="servediag-without-servers-"))
    write_stand_ins(directory)
    os.environ[STAND_INS_ENV] = str(directory)
    os.environ["PATH"] = os.pathsep.join([str(directory), os.environ.get("PATH", "")])
    config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))


# --- parallel workers (make test runs pytest-xdist with --dist loadgroup) --------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "xdist_group(name): run on one pytest-xdist worker")
    if config.getoption("without_servers") and STAND_INS_ENV not in os.environ:
        _stand_in_for_servers(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A module whose tests share a module-scoped fixture (a Prometheus with a simulated
    fleet, say) runs on one worker, so the fixture is built once; the rest spread. A test
    that asks for a server fixture of this file is marked ``prometheus``."""
    grouped = config.getoption("loadgroup", False)
    for item in items:
        _mark_server_tests(item)
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d and d[-1].scope == "module" for d in defs):
            group = item.nodeid.split("::")[0]
            item.add_marker(pytest.mark.xdist_group(group))
            if grouped:
                _name_the_group(item, group)


def _name_the_group(item: pytest.Item, group: str) -> None:
    """Put the group in the item's node id, which is where xdist's scheduler reads it
    (``path::test@group``). xdist 3.8 writes it to ``item._nodeid``, which pytest 9 no longer
    reads (its node id is ``item._id``): the groups were silently lost, and a module's
    fixture was built again on each worker that got one of its tests (test_health's 70 s
    fleet twice). Where pytest still reads ``_nodeid``, xdist's own renaming works."""
    try:
        from _pytest.nodeid import NodeId
    except ImportError:
        return
    node = item._id  # type: ignore[attr-defined]
    if "@" in str(node) or not node.names:
        return
    # The group goes after the parameters, as the last name's tail: xdist takes a node id
    # for grouped only where its "@" comes after its last "]".
    last = node.names[-1] + (f"[{node.params}]" if node.params is not None else "")
    item._id = NodeId(path=node.path, names=(*node.names[:-1], f"{last}@{group}"))  # type: ignore[attr-defined]
