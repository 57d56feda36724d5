"""The simulator fitted to this server: two speed factors, and whether the replay matches.

The replay at today's configuration is compared with what was measured. Two factors are
fitted, no more: prefill speed (the share of peak FLOP/s, ``mfu``) from the TTFT median, and
decode speed (the share of peak bandwidth, ``mbu``) from the ITL median; each is the ratio of
replayed to measured median, applied once and replayed again. Then every figure compared
(TTFT and ITL p50 and p95, KV usage, preemptions, the queue) must be within 30% of the
measured one, or within a small absolute margin for figures near zero; otherwise the
calibration refuses and nothing is predicted. What is left (the residual of each figure) is
the uncertainty every prediction carries.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnoser.whatif.replay import Config
from diagnoser.whatif.stats import Observed

TOLERANCE = 0.30
CLOSE_ENOUGH = 0.10  # medians this close need no factor
# Figures compared, with the absolute margin under which a difference is noise.
CHECKED: dict[str, float] = {
    "ttft_p50": 0.005,
    "ttft_p95": 0.02,
    "itl_p50": 0.002,
    "itl_p95": 0.004,
    "kv_usage": 0.05,
    "preemptions_per_second": 0.02,
    "waiting": 1.0,
}
# The speed factors stay where a GPU can be: a factor that would take the efficiency past
# the peak, or below a quarter of the preset's, says the GPU or the model is not what was
# assumed.
LOWEST, HIGHEST = 0.25, 4.0


@dataclass
class Calibration:
    ok: bool
    reason: str | None
    prefill_factor: float
    decode_factor: float
    config: Config  # today's configuration with the fitted factors
    measured: dict[str, float | None]
    replayed: dict[str, float | None]
    residual: dict[str, float | None] = field(default_factory=dict)  # relative, or absolute
    replays: int = 0


def relative(name: str, measured: float | None) -> bool:
    """Whether a figure's residual is relative to the measured figure (else absolute: a
    figure measured within its margin of noise of zero)."""
    return measured is not None and abs(measured) > CHECKED.get(name, 0.0)


def gap(name: str, replayed: float | None, measured: float | None) -> tuple[float | None, bool]:
    """The residual of one figure (relative to the measured one; absolute under the figure's
    margin) and whether it is within the tolerance."""
    if replayed is None or measured is None:
        return None, True
    margin = CHECKED.get(name, 0.0)
    diff = replayed - measured
    if relative(name, measured):
        rel = diff / abs(measured)
        return rel, abs(rel) <= TOLERANCE or abs(diff) <= margin
    return diff, abs(diff) <= margin


def with_factors(cfg: Config, prefill: float, decode: float) -> Config:
    base = dataclasses.replace(cfg.engine)
    engine = dataclasses.replace(base, mfu=base.mfu * prefill, mbu=base.mbu * decode)
    return dataclasses.replace(cfg, engine=engine)


def factors(
    today: Config, got: dict[str, float | None], want: dict[str, float | None]
) -> tuple[float, float]:
    """The (prefill, decode) speed factors that bring today's replay (``got``) to what was
    measured (``want``): each the ratio of the medians, within where a GPU can be; (1, 1) when
    the medians are already within ``CLOSE_ENOUGH``."""
    ratio_t = _ratio(got["ttft_p50"], want["ttft_p50"])
    ratio_i = _ratio(got["itl_p50"], want["itl_p50"])
    if abs(ratio_t - 1) <= CLOSE_ENOUGH and abs(ratio_i - 1) <= CLOSE_ENOUGH:
        return 1.0, 1.0
    prefill = min(max(ratio_t, LOWEST), HIGHEST, 1.0 / today.engine.mfu)
    decode = min(max(ratio_i, LOWEST), HIGHEST, 1.0 / today.engine.mbu)
    return prefill, decode


def judge(
    today: Config,
    prefill: float,
    decode: float,
    got: dict[str, float | None],
    want: dict[str, float | None],
    replays: int,
) -> Calibration:
    """The calibration: ``got``, the replay at today's configuration with the factors, against
    ``want``; it refuses when any figure is off by more than the tolerance."""
    residual: dict[str, float | None] = {}
    off = []
    for name in CHECKED:
        r, within = gap(name, got[name], want[name])
        residual[name] = r
        if not within:
            off.append(f"{name.replace('_', ' ')} {_show(got[name])} against {_show(want[name])}")
    reason = None
    if off:
        reason = (
            f"the replay does not match the window within {TOLERANCE:.0%} after fitting "
            f"prefill x{prefill:.2f} and decode x{decode:.2f}: " + "; ".join(off)
        )
    return Calibration(
        ok=not off,
        reason=reason,
        prefill_factor=prefill,
        decode_factor=decode,
        config=with_factors(today, prefill, decode),
        measured=want,
        replayed=got,
        residual=residual,
        replays=replays,
    )


def calibrate(
    today: Config,
    measured: Observed,
    run: Callable[[Config], Observed],
    slo: tuple[float, float],
) -> tuple[Calibration, Observed]:
    """Fit the two factors with ``run`` (a replay at a configuration), one replay after
    another; the calibration and the replay of today that the predictions are compared
    with. (``predict`` runs the same steps with the levers' replays alongside.)"""
    want = measured.figures(*slo)
    got_obs = run(today)
    prefill, decode = factors(today, got_obs.figures(*slo), want)
    replays = 1
    if (prefill, decode) != (1.0, 1.0):
        got_obs = run(with_factors(today, prefill, decode))
        replays += 1
    return judge(today, prefill, decode, got_obs.figures(*slo), want, replays), got_obs


def _ratio(replayed: float | None, measured: float | None) -> float:
    """How much faster the server is than the replay (replayed / measured); 1 unknown."""
    if not replayed or not measured or not math.isfinite(replayed / measured):
        return 1.0
    return replayed / measured


def _show(value: float | None) -> str:
    return "none" if value is None else f"{value:.3g}"
