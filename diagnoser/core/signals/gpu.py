"""GPU signals from NVIDIA's dcgm-exporter, joined to the models whose pods use the GPU."""

from __future__ import annotations

from diagnoser.core import promql as q
from diagnoser.core.signals.base import Signal
from diagnoser.core.signals.names import GPU_FB_FREE, GPU_FB_USED, GPU_UTIL


def _gpu_util(window: str) -> str:
    return f"{GPU_UTIL} / 100"


def _gpu_fb_used(window: str) -> str:
    return f"{GPU_FB_USED} * 1048576"


def _gpu_fb_share(window: str) -> str:
    return f"{GPU_FB_USED} / (({GPU_FB_USED} + {GPU_FB_FREE}) > 0)"


def signals() -> list[Signal]:
    s = Signal
    return [
        s(
            "gpu_utilization",
            "ratio",
            "Share of time any kernel ran on the model's GPUs (DCGM), mean; not compute used.",
            q.on_gpus(_gpu_util),
            ("dcgm_gpu_utilization", "avg"),
            any_engine=True,
        ),
        s(
            "gpu_memory_used_bytes",
            "bytes",
            "GPU framebuffer used (DCGM), the fullest GPU.",
            q.on_gpus(_gpu_fb_used, fn="max"),
            ("dcgm_fb_used_bytes", "max"),
            any_engine=True,
        ),
        s(
            "gpu_memory_used_share",
            "ratio",
            "GPU framebuffer used over total (DCGM), fullest GPU.",
            q.on_gpus(_gpu_fb_share, fn="max"),
            ("dcgm_fb_used", "share"),
            any_engine=True,
        ),
    ]
