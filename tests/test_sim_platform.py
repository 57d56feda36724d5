"""The simulator's platform series as the exporters write them: kube-state-metrics' and
cAdvisor's about a pod (an OOM kill at the container's limit, the back-off after it, a new pod
born without a past) and DCGM's uncorrectable errors on a failing GPU."""

from __future__ import annotations

from diagnoser.hardware.presets import gpu, model
from diagnoser.metrics import exporters as X
from diagnoser.metrics import platform as P
from diagnoser.metrics.exposition import Recorder
from diagnoser.sim.engine import EngineConfig
from diagnoser.sim.server import ApiServerConfig, Fault, Server, ServerSpec


def _server(fault: Fault, **spec: object) -> Server:
    s = ServerSpec(
        "m",
        model("llama-3.1-8b"),
        gpu("H100-80GB"),
        EngineConfig(),
        ApiServerConfig(),
        pod="m-0",
        instance="m-0:8000",
    )
    for key, value in spec.items():
        setattr(s, key, value)
    return Server(s, start=0.0, fault=fault)


def _latest(rec: Recorder, family: str, by: str = "reason") -> dict[str, float]:
    """Each series of ``family`` at its last sample, by its label ``by`` ("" without one)."""
    points = rec.families[family].points if family in rec.families else {}
    return {dict(lb).get(by, ""): pts[-1][1] for lb, pts in points.items()}


def _run(server: Server, until: int, rec: Recorder) -> None:
    for t in range(1, until):
        server.maintain(float(t))
        if t % 30 == 0:
            server.record(rec, float(t), 30.0)


def _ends_killed(server: Server, rec: Recorder, t: float, reason: str) -> None:
    """At ``t`` the container is killed (SIGKILL, exit code 137) with ``reason``: one restart
    counted, and the kubelet backing off before the next start."""
    server.maintain(t)
    assert not server.up
    server.record(rec, t + 5.0, 30.0)
    assert _latest(rec, P.RESTARTS.name) == {"": 1.0}
    assert _latest(rec, P.LAST_TERMINATED_REASON.name) == {reason: 1.0}
    assert _latest(rec, P.LAST_TERMINATED_EXITCODE.name) == {"": 137.0}
    assert _latest(rec, P.WAITING_REASON.name) == {"CrashLoopBackOff": 1.0}


def test_a_container_killed_at_its_limit_restarts_oomkilled_and_backs_off():
    fault = Fault(memory_limit_gb=40, host_memory_gb=20, host_memory_growth_gb_per_min=2.0)
    server = _server(fault, kube_exporters=True)
    rec = Recorder()
    _run(server, 600, rec)  # 20 GB to 40 GB in 10 minutes: killed at 600 s
    assert _latest(rec, P.RESTARTS.name) == {"": 0.0}
    assert P.LAST_TERMINATED_REASON.name not in rec.families  # born with the first end
    ws = _latest(rec, P.CONTAINER_WORKING_SET.name)[""]
    assert 0.9 < ws / _latest(rec, P.CONTAINER_LIMITS.name)[""] < 1.0
    _ends_killed(server, rec, 600.0, "OOMKilled")
    assert _latest(rec, P.POD_PHASE.name, "phase")["Running"] == 1.0  # a crash loop stays Running
    # Back from the restart: the working set climbs again from where a container starts.
    _run(server, 700, rec)
    assert server.up
    assert _latest(rec, P.CONTAINER_WORKING_SET.name)[""] < ws / 1.5


def test_a_new_pod_is_born_without_its_predecessors_restarts():
    fault = Fault(memory_limit_gb=40, host_memory_gb=20, host_memory_growth_gb_per_min=2.0)
    server = _server(fault, kube_exporters=True, rollout="new-pods")
    _run(server, 602, Recorder())
    server.schedule_restart(650.0, EngineConfig())
    _run(server, 800, Recorder())
    rec = Recorder()
    server.record(rec, 800.0, 30.0)
    assert server.s.pod == "m-0-r1" and _latest(rec, P.RESTARTS.name) == {"": 0.0}
    assert P.LAST_TERMINATED_REASON.name not in rec.families


def test_without_kube_exporters_no_platform_series_and_no_kill():
    fault = Fault(memory_limit_gb=40, host_memory_gb=20, host_memory_growth_gb_per_min=2.0)
    server = _server(fault)
    rec = Recorder()
    _run(server, 700, rec)
    assert server.up and P.RESTARTS.name not in rec.families


def test_a_failing_gpu_counts_uncorrectable_errors_and_raises_xid_48():
    healthy = Recorder()
    _run(_server(Fault()), 61, healthy)
    assert X.GPU_ECC_DBE.name not in healthy.families  # not in the default counters
    server = _server(Fault(gpu_faulty_instances=1))
    rec = Recorder()
    _run(server, 900, rec)
    errors = _latest(rec, X.GPU_ECC_DBE.name, "gpu")
    assert errors["0"] >= 2  # each run dies a few minutes in, one more error each time
    assert _latest(rec, X.GPU_XID.name, "gpu")["0"] == 48


def _by_pod(rec: Recorder, family: str, by: str) -> dict[tuple[str, str], float]:
    """Each series of ``family`` at its last sample, by (pod, label ``by``)."""
    points = rec.families[family].points
    return {(dict(lb)["pod"], dict(lb)[by]): pts[-1][1] for lb, pts in points.items()}


def _condition(rec: Recorder, condition: str) -> dict[tuple[str, str], float]:
    """kube-state-metrics' ``condition`` of each node at its last sample, by (node, status)."""
    points = rec.families[P.NODE_CONDITION.name].points
    return {
        (d["node"], d["status"]): pts[-1][1]
        for lb, pts in points.items()
        if (d := dict(lb))["condition"] == condition
    }


def test_a_pod_evicted_under_node_pressure_is_kept_failed_and_replaced_elsewhere():
    server = _server(Fault(evicted_instances=1), kube_exporters=True)
    rec = Recorder()
    _run(server, 120, rec)
    assert _by_pod(rec, P.POD_REASON.name, "reason")[("m-0", "Evicted")] == 0.0  # every reason
    _run(server, 400, rec)  # the neighbour takes the node's memory over 150 s
    assert server.s.pod == "m-0-r1" and server.s.node == "gpu-node-0-n1"
    rec = Recorder()
    server.record(rec, 400.0, 30.0)
    reasons, phases = (
        _by_pod(rec, P.POD_REASON.name, "reason"),
        _by_pod(rec, P.POD_PHASE.name, "phase"),
    )
    assert reasons[("m-0", "Evicted")] == 1.0 and phases[("m-0", "Failed")] == 1.0
    assert reasons[("m-0-r1", "Evicted")] == 0.0 and phases[("m-0-r1", "Failed")] == 0.0
    pressure = _condition(rec, "MemoryPressure")
    assert pressure[("gpu-node-0", "true")] == 1.0  # for the transition period after
    assert pressure[("gpu-node-0-n1", "false")] == 1.0
    avail = _latest(rec, P.NODE_MEM_AVAILABLE.name, "instance")
    assert avail["gpu-node-0:9100"] < avail["gpu-node-0-n1:9100"] / 4  # the neighbour holds it


def test_a_lost_node_takes_its_targets_down_then_its_series_end():
    server = _server(Fault(lost_instances=1), kube_exporters=True)
    _run(server, 2, Recorder())
    assert not server.up  # lost at once, at 1 s
    rec = Recorder()
    server.record(rec, 30.0, 30.0)  # every target on it fails its scrape
    assert _latest(rec, X.UP.name, "instance") == {"m-0:8000": 0.0, "gpu-node-0:9100": 0.0}
    assert _condition(rec, "Ready")["gpu-node-0", "true"] == 1.0  # not yet Unknown
    rec = Recorder()
    server.record(rec, 60.0, 30.0)  # past the grace period: Ready (and all) Unknown
    ready = _condition(rec, "Ready")
    assert ready == {
        (server.s.node, s): float(s == "unknown") for s in ("true", "false", "unknown")
    }
    _run(server, 240, Recorder())  # the node deleted, then its pods
    rec = Recorder()
    server.record(rec, 240.0, 30.0)
    assert server.s.pod == "m-0-r1" and P.NODE_INFO.name not in rec.families
    assert X.UP.name not in rec.families  # the replacement waits for a node: no target
    assert _latest(rec, P.POD_INFO.name, "node") == {"": 1.0}
    _run(server, 900, Recorder())
    assert server.up and server.s.node == "gpu-node-0-n1"


def test_a_hung_engine_is_killed_by_its_liveness_probe_and_backs_off():
    server = _server(Fault(liveness_kill_seconds=120.0, hung_instances=1), kube_exporters=True)
    rec = Recorder()
    _run(server, 120, rec)  # hung from its start: the probe has failed for 119 s
    assert server.up and _latest(rec, P.RESTARTS.name) == {"": 0.0}
    # The kubelet's kill: reason Error (not OOMKilled), a signal's exit code.
    _ends_killed(server, rec, 121.0, "Error")
    # Down for the back-off (10 s after the first kill) and the model's load (60 s).
    _run(server, 190, Recorder())
    assert not server.up
    _run(server, 200, Recorder())
    assert server.up


def test_a_container_that_cannot_start_waits_with_its_reason_and_never_restarts():
    server = _server(Fault(start_failure="ImagePullBackOff"), kube_exporters=True)
    rec = Recorder()
    server.record(rec, 10.0, 30.0)
    assert not server.up
    assert _latest(rec, P.WAITING_REASON.name) == {"ErrImagePull": 1.0}  # the first pull
    _run(server, 600, rec)
    assert not server.up
    assert _latest(rec, P.WAITING_REASON.name)["ImagePullBackOff"] == 1.0
    assert _latest(rec, P.RESTARTS.name) == {"": 0.0}  # it never ran, so it never crashed
    assert P.LAST_TERMINATED_REASON.name not in rec.families
    assert _latest(rec, P.POD_PHASE.name, "phase")["Pending"] == 1.0


def test_a_server_that_cannot_fit_its_kv_cache_exits_with_an_error_at_each_start():
    # No KV cache holds one sequence of ten million tokens.
    huge = EngineConfig(max_model_len=10_000_000)
    server = _server(Fault(restart_seconds=60.0), kube_exporters=True, engine=huge)
    rec = Recorder()
    _run(server, 200, rec)
    assert not server.up
    assert _latest(rec, P.LAST_TERMINATED_REASON.name) == {"Error": 1.0}
    assert _latest(rec, P.LAST_TERMINATED_EXITCODE.name) == {"": 1.0}
    assert _latest(rec, P.RESTARTS.name)[""] >= 2.0
