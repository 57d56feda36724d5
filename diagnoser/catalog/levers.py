"""Levers: the engine settings and deployment changes a fix turns, in a form a machine reads.

A lever is ``NAME`` or ``NAME:CHANGE`` (``NAME=CHANGE`` works too), the change one of:

- ``+0.05`` / ``-2``: add to today's value;
- ``x0.75``: multiply today's value;
- ``512`` / ``fp8``: set the value.

Playbooks list the levers of their fix (``levers:``); ``servediag what-if --lever`` takes the
same text. Each lever says whether turning it restarts the engine (a vLLM flag read at start)
or not (more replicas, a client-side cap). The simulator applies them (``whatif.levers``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class LeverError(ValueError):
    """A lever that does not parse or names nothing the engine has; ``str()`` is one line."""


@dataclass(frozen=True)
class Knob:
    """One thing a lever can turn."""

    name: str
    flag: str  # what an operator changes
    restart: bool  # whether changing it restarts the engine
    kind: str  # "float", "int", "choice" or "switch"
    choices: tuple[str, ...] = ()
    default: str = ""  # the change when the lever is named alone
    lo: float = 0.0
    hi: float = float("inf")
    help: str = ""


KNOBS: dict[str, Knob] = {
    k.name: k
    for k in (
        Knob(
            "gpu_memory_utilization",
            "--gpu-memory-utilization",
            True,
            "float",
            default="+0.05",
            lo=0.05,
            hi=0.99,
            help="vLLM's share of GPU memory: more KV-cache blocks",
        ),
        Knob(
            "kv_cache_dtype",
            "--kv-cache-dtype",
            True,
            "choice",
            choices=("fp8", "auto"),
            default="fp8",
            help="fp8 halves the KV bytes per token: twice the tokens in the same memory",
        ),
        Knob(
            "num_gpu_blocks",
            "--num-gpu-blocks-override",
            True,
            "int",
            default="x2",
            lo=1,
            hi=1e8,
            help="KV-cache blocks set outright (where the memory share does not size the "
            "cache, as on vLLM's CPU build run with an override)",
        ),
        Knob(
            "max_num_seqs",
            "--max-num-seqs",
            True,
            "int",
            default="x0.75",
            lo=1,
            hi=1e5,
            help="sequences running at once",
        ),
        Knob(
            "max_num_batched_tokens",
            "--max-num-batched-tokens",
            True,
            "int",
            default="x0.5",
            lo=16,
            hi=1e7,
            help="tokens per engine step (the prefill chunk)",
        ),
        Knob(
            "replicas",
            "replicas",
            False,
            "int",
            default="+1",
            lo=1,
            hi=256,
            help="servers of the model, the load spread evenly",
        ),
        Knob(
            "enable_prefix_caching",
            "--enable-prefix-caching",
            True,
            "switch",
            help="reuse the KV of shared prompt prefixes, at the hit rate measured (or given)",
        ),
        Knob(
            "max_tokens",
            "max_tokens (client or gateway)",
            False,
            "int",
            default="x0.5",
            lo=1,
            hi=1e7,
            help="a cap on the tokens a request may generate",
        ),
    )
}
_TEXT = re.compile(r"^\s*([a-z_]+)\s*(?:[:=]\s*(\S+)\s*)?$")
_NUMBER = r"[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"
_CHANGE = re.compile(rf"^(?P<op>[-+x*]?)(?P<n>{_NUMBER})$")


@dataclass(frozen=True)
class Lever:
    """One change: ``op`` is ``+`` (add), ``x`` (multiply), ``=`` (set) or ``on`` (switch);
    ``value`` its number or choice (a switch's: the prefix-cache hit share, or "" for the
    share measured)."""

    knob: Knob
    op: str
    value: str

    @property
    def name(self) -> str:
        return self.knob.name

    @property
    def restart(self) -> bool:
        return self.knob.restart

    @property
    def text(self) -> str:
        if self.op == "on":
            return self.name + (f":{self.value}" if self.value else "")
        sign = {"+": "+" if not self.value.startswith("-") else "", "x": "x", "=": ""}[self.op]
        return f"{self.name}:{sign}{self.value}"

    def apply(self, today: float) -> float:
        """The new value of a numeric knob, from today's, within the knob's range."""
        n = float(self.value)
        new = {"+": today + n, "x": today * n, "=": n}[self.op]
        return min(max(new, self.knob.lo), self.knob.hi)


def parse_lever(text: str) -> Lever:
    """``gpu_memory_utilization:+0.05`` -> a Lever; ``LeverError`` naming what is wrong."""
    m = _TEXT.match(text)
    if not m:
        raise LeverError(f"lever {text!r} is not NAME or NAME:CHANGE (e.g. max_num_seqs:x0.75)")
    name, change = m.group(1), m.group(2)
    knob = KNOBS.get(name)
    if knob is None:
        raise LeverError(f"unknown lever {name!r} (known: {', '.join(KNOBS)})")
    if knob.kind == "switch":
        if change is None:
            return Lever(knob, "on", "")
        share = _number(change)
        if share is None or not 0 <= share < 1:
            raise LeverError(f"lever {name}: the hit share must be from 0 to 1 (got {change!r})")
        return Lever(knob, "on", f"{share:g}")
    change = change if change is not None else knob.default
    if knob.kind == "choice":
        if change not in knob.choices:
            raise LeverError(f"lever {name}: one of {', '.join(knob.choices)} (got {change!r})")
        return Lever(knob, "=", change)
    c = _CHANGE.match(change)
    if not c:
        raise LeverError(f"lever {name}: the change must be +N, -N, xN or N (got {change!r})")
    op = {"": "=", "+": "+", "-": "+", "x": "x", "*": "x"}[c.group("op")]
    value = float(c.group("n")) * (-1 if c.group("op") == "-" else 1)
    if op == "x" and value <= 0:
        raise LeverError(f"lever {name}: a factor must be above 0 (got {change!r})")
    if op == "=" and not knob.lo <= value <= knob.hi:
        raise LeverError(f"lever {name}: {value:g} is outside {knob.lo:g} to {knob.hi:g}")
    return Lever(knob, op, f"{value:g}")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


# A JSON-schema pattern for a lever's text (the loader checks the values with parse_lever).
SCHEMA_PATTERN = "^(" + "|".join(KNOBS) + r")(\s*[:=]\s*[-+x*]?[A-Za-z0-9_.]+)?$"
