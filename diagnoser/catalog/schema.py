"""The playbook schema: a base (``schema.base.json``) plus, from the shape registry, each
shape's key and the modifiers shapes accept. ``playbook.schema.json`` beside it is the same
schema written out for editors (``make generate`` keeps it current)."""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

from diagnoser.catalog.levers import KNOBS, SCHEMA_PATTERN
from diagnoser.catalog.shapes import MODIFIER_SCHEMAS, SHAPES

SCHEMA_FILE = "playbook.schema.json"


@cache
def schema() -> dict[str, Any]:
    text = resources.files("diagnoser.catalog").joinpath("schema.base.json").read_text("utf-8")
    out: dict[str, Any] = json.loads(text)
    props = out["$defs"]["condition"]["properties"]
    shaped: dict[str, Any] = {"signal": props.pop("signal"), "over": props.pop("over")}
    for name, shape in SHAPES.items():
        shaped[name] = copy.deepcopy(shape.value_schema)
    used = {m for s in SHAPES.values() for m in s.modifiers}
    for name, fragment in MODIFIER_SCHEMAS.items():
        if name in used:
            shaped[name] = copy.deepcopy(fragment)
    out["$defs"]["condition"]["properties"] = {**shaped, **props}
    # The fix's levers, in the grammar of ``catalog.levers`` (its knob table names them).
    levers = {
        "description": "The fix's levers, as servediag what-if replays them: NAME or "
        "NAME:CHANGE (+N adds, xN multiplies, N or a choice sets), NAME one of " + ", ".join(KNOBS),
        "type": "array",
        "minItems": 1,
        "uniqueItems": True,
        "items": {"type": "string", "pattern": SCHEMA_PATTERN},
    }
    props_top = out["properties"]
    order = list(props_top)
    at = order.index("fix") + 1
    out["properties"] = {
        **{k: props_top[k] for k in order[:at]},
        "levers": levers,
        **{k: props_top[k] for k in order[at:]},
    }
    return out


def render() -> str:
    """The composed schema as the committed ``playbook.schema.json``."""
    return json.dumps(schema(), indent=2) + "\n"


@cache
def validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(schema())
