"""Scope labels beside fixed names: a label named like one of a table's columns or of a
series' own labels is renamed ``label_<name>`` (prefixed again while that name is taken), so
no label hides a column or is hidden by one. The frames, the CSV, ``servediag watch``'s
series and the rules that read them all rename by this one rule."""

from __future__ import annotations

from collections.abc import Iterable

LABEL_PREFIX = "label_"


def renamed(labels: Iterable[str], fixed: frozenset[str]) -> dict[str, str]:
    """Each of ``labels`` (in order, once) with the name it goes by beside ``fixed``."""
    order = list(dict.fromkeys(labels))
    taken = fixed | set(order)
    out: dict[str, str] = {}
    for label in order:
        name = label
        if label in fixed:
            name = LABEL_PREFIX + label
            while name in taken:
                name = LABEL_PREFIX + name
            taken |= {name}
        out[label] = name
    return out
