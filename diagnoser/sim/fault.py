"""What goes wrong with a simulated server, as a scenario's ``fault`` knobs set it: another
process on its GPU, a hang, KV transfers, a failing GPU, and what the platform does to its
container (a memory limit, a liveness probe, a start that fails)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Fault:
    other_process_gb: float = 0.0  # GPU memory taken by another process
    restart_seconds: float = 60.0  # time to come back after a crash or deploy
    # The model's first N servers whose engine hangs: the process lives and its API server
    # answers, but no step runs (a collective waiting for a dead rank, a GPU that never
    # returns). Requests sent to it wait; its metrics stay at the last step's values.
    hung_instances: int = 0
    # Disaggregated prefill, seen from the decode side (engine.kv_consumer): the bandwidth a
    # prompt's KV moves at from the prefill instance (GB/s; a NIC or RDMA path that falls back
    # to TCP moves it at a few), and the share of transfers that fail (a prefill instance
    # restarted, a link down, a lease that expired).
    kv_transfer_gbps: float = 25.0
    kv_transfer_failure: float = 0.0
    # The model's first N servers whose first GPU is failing (an uncorrectable ECC error, XID
    # 48): a few minutes after each start the engine touches the bad memory again and dies.
    gpu_faulty_instances: int = 0
    # Host memory (kube_exporters only, :mod:`diagnoser.sim.platform`): the container's memory
    # limit (0: none), its working set at start and how fast it climbs while it serves; at the
    # limit the kernel kills it (OOMKilled) and the kubelet restarts it.
    memory_limit_gb: float = 0.0
    host_memory_gb: float = 16.0
    host_memory_growth_gb_per_min: float = 0.0
    # The first N servers' nodes evict their pods, or are lost (:mod:`diagnoser.sim.nodes`).
    evicted_instances: int = 0
    lost_instances: int = 0
    # The kubelet kills a container whose engine hung this long (a liveness probe that a hang
    # fails; 0: none). A container started while start_failure is set (a START_FAILURES
    # waiting reason) cannot start.
    liveness_kill_seconds: float = 0.0
    start_failure: str = ""
