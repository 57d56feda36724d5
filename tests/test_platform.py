"""The platform's reason a model's servers went down, from kube-state-metrics', cAdvisor's,
node-exporter's and DCGM's series as diagnose reads them (``diagnosis.platform``)."""

from __future__ import annotations

import time

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

    # Without kube-state-metrics, the playbook reads node-exporter's kill as the server went
    # down in its place: found, at the lower confidence of what cannot name the process.
    (oom,) = [m for m in result.findings if m.playbook.id == "container-oom-killed"]
    assert oom.confidence <= 0.7
    assert [r.condition.signal for r in oom.results if r.group == "all"] == [
        "host_oom_kills_at_down"
    ]


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


def _never_served(t0: float) -> str:
    """40 minutes at 30 s: the pod chat-0 serves the model chat for 10 minutes and is deleted;
    its replacement chat-0-r1 never serves (its target down from its first scrape), its
    container started and killed by the kubelet (reason Error, exit 137) every 4 minutes."""
    pod = 'namespace="llm",pod="{}"'
    ksm = f'job="kube-state-metrics",instance="ksm:8080",{pod.format("chat-0-r1")},uid="u1"'
    lines = {
        "vllm:num_requests_running": "gauge",
        "up": "gauge",
        "kube_pod_info": "gauge",
        "kube_pod_container_status_restarts_total": "counter",
        "kube_pod_container_status_last_terminated_reason": "gauge",
        "kube_pod_container_status_last_terminated_exitcode": "gauge",
    }
    out: dict[str, list[str]] = {name: [] for name in lines}
    old = f'job="vllm",instance="chat-0:8000",{pod.format("chat-0")}'
    new = f'job="vllm",instance="chat-0-r1:8000",{pod.format("chat-0-r1")}'
    for i in range(80):
        t, minute = t0 + 30.0 * i, i / 2
        if minute < 10:
            out["vllm:num_requests_running"].append(f'{{{old},model_name="chat"}} 3 {t:.0f}')
            out["up"].append(f"{{{old}}} 1 {t:.0f}")
            continue
        kills = int((minute - 10) // 4)
        out["up"].append(f"{{{new}}} 0 {t:.0f}")
        out["kube_pod_info"].append(f'{{{ksm},node="n1",host_ip="10.0.0.9"}} 1 {t:.0f}')
        out["kube_pod_container_status_restarts_total"].append(
            f'{{{ksm},container="vllm"}} {kills} {t:.0f}'
        )
        if kills:
            for name, value in (("reason", 1), ("exitcode", 137)):
                labels = f'{ksm},container="vllm"' + (',reason="Error"' if name == "reason" else "")
                out[f"kube_pod_container_status_last_terminated_{name}"].append(
                    f"{{{labels}}} {value} {t:.0f}"
                )
    text = []
    for name, type_ in lines.items():
        text.append(f"# TYPE {name} {type_}")
        text += [f"{name}{sample}" for sample in out[name]]
    return "\n".join([*text, "# EOF", ""])


@pytest.mark.prometheus
def test_a_pod_that_never_served_is_read_through_its_own_series(tmp_path, site):
    """A rollout's new pod whose server never served (killed by its liveness probe while it
    loads) has no model series to be joined through: its own pod's kube-state-metrics series,
    read through its target's up, say why, the time nothing answered is unavailable, and the
    liveness probe's playbook reads the kill."""
    from lab.promserver import Prometheus, backfill

    t0 = float(int(time.time()) // 60 * 60 - 3600)
    om = tmp_path / "never-served.om"
    om.write_text(_never_served(t0))
    backfill(om, tmp_path / "tsdb")
    with Prometheus(tmp_path / "tsdb") as prom:
        result = diagnose(PrometheusSource(prom.url), site, Window.plan(1800, t0 + 39.5 * 60))
    (health,) = result.health
    assert health.never_served == 1 and health.targets_down == health.targets_total == 1
    restarted = time.strftime("%H:%M", time.gmtime(t0 + 14 * 60))
    assert health.platform == (
        f"killed by the kubelet (reason Error, exit code 137: its liveness probe failed) at "
        f"{restarted}, 7 restarts (kube-state-metrics)"
    )
    assert health.reasons[0].endswith(
        f"1 of them a rollout's new pods that never served: {health.platform}"
    )
    assert health.slis[0].good < 0.8 and health.slis[0].now == 0
    # The kill read through the pod names the cause; a server that never came up is not
    # taken for one whose KV cache cannot fit (that exits with code 1, not a signal's 137).
    assert [m.playbook.id for m in result.findings] == ["liveness-probe-kill"]
