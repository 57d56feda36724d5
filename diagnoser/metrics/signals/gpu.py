"""GPU signals from NVIDIA's dcgm-exporter, joined to the models that use the GPUs: through
their pod in Kubernetes (dcgm-exporter's pod mapping), through their host elsewhere."""

from __future__ import annotations

from diagnoser.metrics import exporters
from diagnoser.metrics import promql as q
from diagnoser.metrics.signals.base import Signal, everywhere


def _gpu_util(sel: str) -> str:
    return f"{exporters.GPU_UTIL.name}{sel} / 100"


def _gpu_fb_used(sel: str) -> str:
    return f"{exporters.GPU_FB_USED.name}{sel} * 1048576"


def _gpu_fb_share(sel: str) -> str:
    used, free = f"{exporters.GPU_FB_USED.name}{sel}", f"{exporters.GPU_FB_FREE.name}{sel}"
    return f"{used} / (({used} + {free}) > 0)"


def _plain(family: str, factor: str = "") -> q.GpuExpr:
    """The DCGM gauge as it is (times ``factor``)."""
    return lambda sel: f"{family}{sel}{factor}"


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "gpu_utilization",
            "ratio",
            "Share of time any kernel ran on the model's GPUs (DCGM), mean; not compute used.",
            everywhere(q.on_gpus(_gpu_util)),
            ("dcgm_gpu_utilization", "avg"),
        ),
        s(
            "gpu_memory_used_bytes",
            "bytes",
            "GPU framebuffer used (DCGM), the fullest GPU.",
            everywhere(q.on_gpus(_gpu_fb_used, fn="max")),
            ("dcgm_fb_used_bytes", "max"),
        ),
        s(
            "gpu_memory_used_share",
            "ratio",
            "GPU framebuffer used over total (DCGM), fullest GPU.",
            everywhere(q.on_gpus(_gpu_fb_share, fn="max")),
            ("dcgm_fb_used", "share"),
        ),
        s(
            "gpu_power_watts",
            "W",
            "Power drawn by the model's GPUs (DCGM), summed: near the boards' power limit the "
            "clocks come down.",
            everywhere(q.on_gpus(_plain(exporters.GPU_POWER.name), fn="sum")),
            ("dcgm_power_usage_watts", "sum"),
        ),
        s(
            "gpu_temperature_max",
            "celsius",
            "GPU temperature (DCGM), the hottest of the model's GPUs.",
            everywhere(q.on_gpus(_plain(exporters.GPU_TEMP.name), fn="max")),
            ("dcgm_gpu_temp_celsius", "max"),
        ),
        s(
            "gpu_sm_clock_min",
            "Hz",
            "SM clock (DCGM), the slowest of the model's GPUs: a busy GPU below its boost clock "
            "is throttled (power or heat).",
            everywhere(q.on_gpus(_plain(exporters.GPU_SM_CLOCK.name, " * 1000000"), fn="min")),
            ("dcgm_sm_clock_hertz", "min"),
        ),
        s(
            "gpu_xid_last",
            "xid",
            "The last XID error code of the model's GPUs (DCGM), the highest; 0 means none.",
            everywhere(q.on_gpus(_plain(exporters.GPU_XID.name), fn="max")),
            ("dcgm_xid_errors", "max"),
        ),
    ]
