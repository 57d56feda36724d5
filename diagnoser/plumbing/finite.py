"""JSON that every parser reads: no ``NaN``, no ``Infinity``.

Python's ``json`` writes a float NaN or infinity as the bare words ``NaN`` and ``Infinity``,
which are not JSON: ``jq``, browsers and Go's decoder refuse the whole document. A series can
hold both (Prometheus writes ``"NaN"`` and ``"+Inf"`` as sample values, and a ratio of huge
values overflows), so every JSON document servediag prints goes through ``finite``: such a
number becomes ``null``, and the document says where and what it was.
"""

from __future__ import annotations

import math
from typing import Any


def finite(doc: Any) -> tuple[Any, list[dict[str, str]]]:
    """A copy of ``doc`` with every NaN or infinite float replaced by ``None``, and one
    ``{"field": "health[0].request_rate", "value": "+Inf"}`` per replacement (the value as
    Prometheus writes it: ``NaN``, ``+Inf``, ``-Inf``)."""
    found: list[dict[str, str]] = []

    def walk(node: Any, where: str) -> Any:
        if isinstance(node, float) and not math.isfinite(node):
            shown = "NaN" if math.isnan(node) else ("+Inf" if node > 0 else "-Inf")
            found.append({"field": where or "(top level)", "value": shown})
            return None
        if isinstance(node, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(doc, ""), found
