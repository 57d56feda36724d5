"""The platform's reason a model's servers went down, from kube-state-metrics', cAdvisor's,
node-exporter's and DCGM's series as diagnose reads them (``diagnosis.platform``)."""

from __future__ import annotations

import numpy as np
import pytest

from diagnoser.diagnosis import Window, diagnose
from diagnoser.diagnosis.platform import reason
from diagnoser.plumbing.source import PrometheusSource, Series
from lab.real.record import DATA, raw_prometheus
from lab.real.replayed import provenance
from lab.replay import Replay

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
T = T0 + 60.0 * np.arange(30)
SPAN = (T0, T0 + 29 * 60)


def _s(values: list[float]) -> Series:
    return Series({"model_name": "m"}, T, np.array(values, dtype=np.float64))


def _from(minute: int, value: float, before: float = 0.0) -> Series:
    return _s([before] * minute + [value] * (30 - minute))


def test_an_oom_kill_is_named_with_its_limit_time_and_restarts():
    # the restart count over 5m rises three times: at minutes 12, 18 and 24
    restarts = [0.0] * 12 + [1.0] * 6 + [2.0] * 6 + [3.0] * 6
    said = reason(
        {
            "container_oom_killed": _from(12, 1.0),
            "container_memory_limit_bytes": _from(0, 64 * 2**30),
            "container_restarts": _s(restarts),
        },
        SPAN,
    )
    assert said == "OOMKilled at the 64 GiB limit at 08:12, 3 restarts (kube-state-metrics)"


def test_an_eviction_under_memory_pressure_comes_before_what_its_container_did():
    said = reason(
        {
            "pods_evicted": _from(20, 1.0),
            "node_memory_pressure": _from(15, 1.0),
            "container_error_exit": _from(20, 1.0),
        },
        SPAN,
    )
    assert said == "evicted by its node under memory pressure at 08:20 (kube-state-metrics)"


def test_a_kill_by_the_kubelet_is_its_liveness_probe_not_a_crash():
    said = reason(
        {
            "container_error_exit": _from(10, 1.0),
            "container_exit_code": _from(10, 137.0),
            "container_restarts": _s([0.0] * 10 + [1.0] * 20),
        },
        SPAN,
    )
    assert said == (
        "killed by the kubelet (reason Error, exit code 137: its liveness probe failed) at "
        "08:10, 1 restart (kube-state-metrics)"
    )


def test_off_kubernetes_the_kernels_oom_kill_is_named_from_node_exporter():
    kills = {"node_oom_kills": _s([0.0] * 7 + [1.0] * 5 + [0.0] * 18)}  # one, over 5 minutes
    down = {"targets_down": _from(8, 1.0)}  # the next minute's scrape failed
    assert reason(kills, SPAN, down) == (
        "the kernel's OOM killer killed 1 process on its host at 08:07, as its server went "
        "down (node-exporter)"
    )
    # A kill on the host long before the server went down was another process's.
    assert reason(kills, SPAN, {"targets_down": _from(20, 1.0)}) is None
    assert reason(kills, SPAN) is None


def test_series_that_say_nothing_name_nothing():
    assert reason({}, SPAN) is None
    assert (
        reason({"container_oom_killed": _from(0, 0.0), "node_oom_kills": _from(0, 0.0)}, SPAN)
        is None
    )


@pytest.mark.prometheus
def test_a_real_oom_kill_is_named_from_the_real_node_exporter(tmp_path, site):
    """The real oom-killed recording (a vLLM CPU server killed by the kernel's OOM killer at
    its memory cgroup's limit, Debian's node-exporter scraped beside it on the same host),
    backfilled into a real Prometheus: node-exporter's OOM kill, joined to the server by the
    host part of their instances, names why the server went down, and the availability SLI
    counts its downtime (the clients lost a fifth of their requests)."""
    directory = DATA / "oom-killed"
    meta = Replay(directory / "incident.json.gz").meta
    with raw_prometheus(directory, tmp_path) as prom:
        result = diagnose(PrometheusSource(prom.url), site, Window.plan(meta["since"], meta["end"]))
    (health,) = result.health
    exit_ = provenance(directory)["phases"][-1]["exits"][0]["at"]  # when the server exited
    assert health.platform == (
        f"the kernel's OOM killer killed 1 process on its host at {exit_[11:16]}, as its "
        "server went down (node-exporter)"
    )
    assert health.reasons[0].endswith(f"of the window: {health.platform}")
    assert health.slis[0].name == "availability" and 0.7 < health.slis[0].good < 0.9


@pytest.mark.parametrize(
    ("scenario", "scraped"),
    [("healthy-steady", set()), ("pod-evicted", {"kube-state-metrics", "node-exporter"})],
)
def test_an_exporter_that_is_not_scraped_is_not_asked_about(
    scenario_library, prometheus_for, site, scenario, scraped
):
    """The platform's joins read the servers' series over an hour at every step: asked on a
    store with none of the exporter's series, each costs Prometheus that read for nothing."""
    from diagnoser.diagnosis.fetch import needed_signals
    from diagnoser.diagnosis.platform import unasked, unscraped

    prom = prometheus_for(scenario)
    end = scenario_library[scenario].end
    absent = unscraped(PrometheusSource(prom.url), Window.plan(3600.0, end))
    assert scraped <= {"kube-state-metrics", "cadvisor", "node-exporter"} - absent
    skipped = unasked(needed_signals(site), absent)
    assert ("pods_evicted" in skipped) is not bool(scraped)
    assert ("node_memory_available_share" in skipped) is not ("node-exporter" in scraped)
    assert "requests_waiting" not in skipped
