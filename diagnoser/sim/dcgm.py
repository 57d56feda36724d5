"""What dcgm-exporter reads from a simulated server's GPU boards besides utilisation and
framebuffer: power, temperature and SM clock by board, and the XID gauge."""

from __future__ import annotations

from dataclasses import dataclass

from diagnoser.metrics import exporters as X
from diagnoser.metrics.family import Family


@dataclass(frozen=True)
class Board:
    """What dcgm-exporter reads from a GPU board besides utilisation and memory: power from
    idle to the power limit with the share of time kernels run, temperature rising with it,
    the SM clock at boost while a model is loaded and at its idle clock otherwise; no XID."""

    idle_watts: float
    limit_watts: float
    boost_mhz: float
    idle_mhz: float = 345.0
    idle_celsius: float = 32.0
    hot_celsius: float = 72.0

    def readings(self, busy: float, loaded: bool) -> tuple[tuple[Family, float], ...]:
        return (
            (
                X.GPU_POWER,
                self.idle_watts + (self.limit_watts - self.idle_watts) * 0.6 * busy,
            ),
            (X.GPU_TEMP, self.idle_celsius + (self.hot_celsius - self.idle_celsius) * busy),
            (X.GPU_SM_CLOCK, self.boost_mhz if loaded and busy > 0 else self.idle_mhz),
            (X.GPU_XID, 0.0),
        )


# Published board power limits and maximum SM clocks.
BOARDS = {
    "H100-80GB": Board(idle_watts=70, limit_watts=700, boost_mhz=1980),
    "H200": Board(idle_watts=75, limit_watts=700, boost_mhz=1980),
    "A100-80GB": Board(idle_watts=55, limit_watts=400, boost_mhz=1410),
    "L40S": Board(idle_watts=35, limit_watts=350, boost_mhz=2520, idle_mhz=210),
}
DEFAULT_BOARD = BOARDS["H100-80GB"]
