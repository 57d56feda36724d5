"""What dcgm-exporter reads from a simulated server's GPU boards besides utilisation and
framebuffer: power, temperature and SM clock by board, and the XID gauge."""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.hardware.presets import GpuSpec
from diagnoser.metrics import exporters as X
from diagnoser.metrics.exposition import Recorder, labels_of
from diagnoser.metrics.family import Family

# The XID a GPU raises for an uncorrectable (double-bit) ECC error.
XID_DBE = 48


@dataclass(frozen=True)
class Board:
    """What dcgm-exporter reads from a GPU board besides utilisation and memory: power from
    idle to the power limit with the share of time kernels run, temperature rising with it,
    the SM clock at boost while a model is loaded and at its idle clock otherwise; XID 48
    once the board raised an uncorrectable memory error."""

    idle_watts: float
    limit_watts: float
    boost_mhz: float
    idle_mhz: float = 345.0
    idle_celsius: float = 32.0
    hot_celsius: float = 72.0

    def readings(
        self, busy: float, loaded: bool, errors: int = 0
    ) -> tuple[tuple[Family, float], ...]:
        return (
            (
                X.GPU_POWER,
                self.idle_watts + (self.limit_watts - self.idle_watts) * 0.6 * busy,
            ),
            (X.GPU_TEMP, self.idle_celsius + (self.hot_celsius - self.idle_celsius) * busy),
            (X.GPU_SM_CLOCK, self.boost_mhz if loaded and busy > 0 else self.idle_mhz),
            (X.GPU_XID, float(XID_DBE if errors else 0)),  # the last XID's number
        )


# Published board power limits and maximum SM clocks.
BOARDS = {
    "H100-80GB": Board(idle_watts=70, limit_watts=700, boost_mhz=1980),
    "H200": Board(idle_watts=75, limit_watts=700, boost_mhz=1980),
    "A100-80GB": Board(idle_watts=55, limit_watts=400, boost_mhz=1410),
    "L40S": Board(idle_watts=35, limit_watts=350, boost_mhz=2520, idle_mhz=210),
}
DEFAULT_BOARD = BOARDS["H100-80GB"]


def ecc_counts(errors: int) -> tuple[tuple[Family, float], ...]:
    """A GPU's uncorrectable memory errors since the driver loaded (each raised XID 48), and
    the row remapped for the first."""
    return (
        (X.GPU_ECC_DBE, float(errors)),
        (X.GPU_REMAPPED_UNCORRECTABLE, float(min(errors, 1))),
    )


def record(
    rec: Recorder,
    t: float,
    gpu: GpuSpec,
    util: list[float],
    used_mib: float,
    uuid: str,
    labels: dict[str, str],
    errors: int | None,
) -> None:
    """dcgm-exporter's series for a server's GPUs at ``t``: ``util`` per GPU (percent), the
    framebuffer used on each, each GPU's UUID made from ``uuid``, ``labels`` on every series.
    ``errors``: the uncorrectable memory errors of its first GPU, or None where the ECC
    families are not counted (the volatile double-bit count is commented out of
    dcgm-exporter's default counters; scenarios without a GPU fault read without them)."""
    total_mib = gpu.memory_bytes / 2**20
    board = BOARDS.get(gpu.name, DEFAULT_BOARD)
    used = min(total_mib, used_mib)
    for i, busy in enumerate(util):
        own = 0 if i or errors is None else errors
        lb = labels_of(gpu=str(i), UUID=f"GPU-{uuid}-{i}", modelName=gpu.name, **labels)
        for fam, value in (
            (X.GPU_UTIL, busy),
            (X.GPU_FB_USED, used),
            (X.GPU_FB_FREE, total_mib - used),
            *board.readings(busy / 100, loaded=used > 0, errors=own),
            *(ecc_counts(own) if errors is not None else ()),
        ):
            rec.sample(fam.name, fam.type, fam.help, lb, t, round(value))
