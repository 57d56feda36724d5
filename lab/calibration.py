"""The simulator's step costs against step times measured on a GPU.

``tests/data/gpu-step-costs.json`` (extracted by ``scripts/extract-reference``) holds
prefill, decode and mixed steps of a Llama-3.1-8B-shaped model measured on one H200. Each row
is priced here through the engine's own cost functions, as the engine prices its steps; the
test suite bounds the ratios and ``make bench`` prints them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from diagnoser.hardware.presets import gpu, model
from diagnoser.sim.engine import Engine, EngineConfig

TABLE = Path(__file__).resolve().parent.parent / "tests" / "data" / "gpu-step-costs.json"
GPU, MODEL = "H200", "llama-3.1-8b"
# Simulated / measured. Prefill and decode were measured without a scheduler or sampling,
# so they are lower bounds for a serving engine; the mixed steps ran attention with an
# explicit mask (not the flash path an engine takes), so they may sit on either side.
BOUNDS = {"prefill": (1.0, 1.5), "decode": (1.0, 1.5), "mixed": (1 / 1.5, 1.5)}


@dataclass(frozen=True)
class Row:
    kind: str  # prefill, decode or mixed
    batch: int  # decoding sequences in the step
    context: int  # tokens each of them holds
    chunk: int  # prompt tokens computed in the step
    cached: int  # tokens of that prompt computed before
    measured_ms: float

    @property
    def label(self) -> str:
        parts = []
        if self.batch:
            parts.append(f"{self.batch} x {self.context} ctx")
        if self.chunk:
            parts.append(
                f"{self.chunk} prompt" if self.kind == "prefill" else f"{self.chunk} chunk"
            )
        text = " + ".join(parts)
        if self.cached:
            text += f" after {self.cached} cached"
        return f"{self.kind:<7} {text}"


@dataclass(frozen=True)
class Priced:
    row: Row
    simulated_ms: float

    @property
    def ratio(self) -> float:
        return self.simulated_ms / self.row.measured_ms

    @property
    def within(self) -> bool:
        lo, hi = BOUNDS[self.row.kind]
        return lo <= self.ratio <= hi


def load(path: Path = TABLE) -> list[Row]:
    raw: list[Mapping[str, Any]] = json.loads(path.read_text(encoding="utf-8"))
    return [Row(**r) for r in raw]


def reference_engine(cfg: EngineConfig | None = None) -> Engine:
    """An engine of the measured shape: Llama-3.1-8B on one H200."""
    return Engine(model(MODEL), gpu(GPU), cfg or EngineConfig())


def simulated_seconds(engine: Engine, row: Row) -> float:
    """The step ``row`` describes, priced as the engine prices its own steps."""
    context = row.batch * row.context
    if not row.chunk:
        return engine.decode_step_time(row.batch, context)
    attn = engine.attention_flops(row.cached, row.chunk)
    return engine.mixed_step_time(row.batch, context, row.chunk, attn)


def price(rows: Sequence[Row], engine: Engine | None = None) -> list[Priced]:
    engine = engine or reference_engine()
    return [Priced(r, 1000 * simulated_seconds(engine, r)) for r in rows]


def table(priced: Sequence[Priced]) -> list[str]:
    """One line per row: the step, measured and simulated milliseconds, their ratio."""
    lines = [f"{'step':<50} {'measured':>9} {'simulated':>10} {'ratio':>6}  bounds"]
    for p in priced:
        lo, hi = BOUNDS[p.row.kind]
        flag = "" if p.within else "  OUT"
        lines.append(
            f"{p.row.label:<50} {p.row.measured_ms:>7.2f}ms {p.simulated_ms:>8.2f}ms "
            f"{p.ratio:>6.2f}  {lo:.2f}-{hi:.2f}{flag}"
        )
    return lines
