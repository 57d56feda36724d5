"""The playbook schema: a base (``schema.base.json``) plus, from the shape registry, each
shape's key and the modifiers shapes accept. ``playbook.schema.json`` beside it is the same
schema written out for editors (``make generate`` keeps it current)."""

from __future__ import annotations

import copy
import json
from functools import cache
from importlib import resources
from typing import Any

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
    return out


def render() -> str:
    """The composed schema as the committed ``playbook.schema.json``."""
    return json.dumps(schema(), indent=2) + "\n"


@cache
def validator() -> Any:
    import jsonschema

    return jsonschema.Draft202012Validator(schema())
