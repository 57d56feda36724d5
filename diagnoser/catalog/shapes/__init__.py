"""The shapes a signature tests, one registry: each shape keeps its schema fragment, its
evaluation, its description and its evidence text together, so a new shape is one class
here and nothing else (the loader, the schema, the diagnoser and every report read it from
``SHAPES``)."""

from __future__ import annotations

from typing import Any

from diagnoser.catalog.shapes.base import Data, Periods, Shape, Verdict
from diagnoser.catalog.shapes.compare import Falls, FallsBy, Flat, Rises, RisesBy
from diagnoser.catalog.shapes.growth import GrowsWith
from diagnoser.catalog.shapes.level import Above, Below
from diagnoser.catalog.shapes.window import Drifts, Plateau, Recurs, Spikes, Tracks

__all__ = ["MODIFIER_SCHEMAS", "SHAPES", "Data", "Periods", "Shape", "Verdict"]

SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Rises(),
        Falls(),
        Flat(),
        RisesBy(),
        FallsBy(),
        Above(),
        Below(),
        Drifts(),
        Spikes(),
        Plateau(),
        Tracks(),
        Recurs(),
        GrowsWith(),
    )
}

# Modifiers shapes may accept (each shape lists its own in ``Shape.modifiers``).
MODIFIER_SCHEMAS: dict[str, dict[str, Any]] = {
    "exponent": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "with grows_with: the fitted log-log slope must be at least this",
    },
    "min_corr": {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 1,
        "description": "with tracks: minimum correlation",
    },
    "held": {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": 1,
        "description": "share of the recent samples that must satisfy a level condition",
    },
    "floor": {
        "type": "number",
        "exclusiveMinimum": 0,
        "description": "lower bound used for the baseline in ratios, so a near-zero baseline "
        "does not inflate them",
    },
}
