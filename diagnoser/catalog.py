"""Load and validate the playbook catalog.

A playbook is one YAML file named after its id. Every file is checked against
``playbook.schema.json`` and then against the signal vocabulary and the rest of the catalog;
the first problem is reported as one line naming the file and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from diagnoser.errors import FileFieldError, read_yaml_mapping
from diagnoser.signals import SIGNALS

SHAPES = (
    "rises",
    "falls",
    "flat",
    "rises_by",
    "above",
    "below",
    "drifts",
    "spikes",
    "plateau",
    "tracks",
    "grows_with",
)
RATIO_SHAPES = frozenset({"rises", "falls", "flat", "drifts"})
# Which modifiers each shape accepts (besides signal, over, stat, weight, why).
MODIFIERS: dict[str, frozenset[str]] = {
    "held": frozenset({"above", "below", "plateau"}),
    "floor": RATIO_SHAPES | {"rises_by"},
    "min_corr": frozenset({"tracks"}),
    "exponent": frozenset({"grows_with"}),
}
CHAPTERS = {
    "tokens": "Models read tokens, not words",
    "prefill-decode": "Prefill fills the KV cache. Decode reads it",
    "attention": "Why keep the Keys and Values?",
    "latency": "The anatomy of \u201cit feels slow\u201d",
    "batching": "Static vs continuous batching",
    "memory": "The GPU memory budget",
}
# ${targets} in an alert expression: the label matcher that selects vLLM scrape targets.
TARGETS = "targets"
PLACEHOLDER = re.compile(r"\$\{([a-z0-9_]+)(@instance)?(?::([0-9]+[smhd]))?\}")


class CatalogError(FileFieldError):
    """A playbook that cannot be used; ``str()`` is one line naming file and field."""


@dataclass(frozen=True)
class Condition:
    signal: str
    shape: str
    value: float | str
    over: str | None = None
    held: float | None = None
    stat: str = "median"
    floor: float | None = None
    min_corr: float | None = None
    exponent: float | None = None
    weight: float = 1.0
    why: str | None = None
    # An exclusion with ``instead`` is contested: it rules the playbook out only when one of
    # these playbooks matches the same scope at least as strongly (see matching.resolve).
    instead: tuple[str, ...] = ()

    def describe(self) -> str:
        """Readable form, e.g. ``ttft_p95 rises >= 1.5x``."""
        subject = f"{self.signal} / {self.over}" if self.over else self.signal
        v = self.value
        text = {
            "rises": lambda: f"rises >= {v}x",
            "falls": lambda: f"falls to <= {v}x",
            "flat": lambda: f"stays within \u00b1{float(v):.0%}",
            "rises_by": lambda: f"rises by >= {v}",
            "above": lambda: f">= {v}",
            "below": lambda: f"<= {v}",
            "drifts": lambda: f"drifts up steadily to >= {v}x",
            "spikes": lambda: f"spikes to >= {v}x its median",
            "plateau": lambda: f"pinned at its ceiling (within {float(v):.0%})",
            "tracks": lambda: f"moves with {v}",
            "grows_with": lambda: f"grows faster than {v} (exponent >= {self.exponent})",
        }[self.shape]()
        if self.held is not None:
            text += f" for {self.held:.0%} of the window"
        return f"{subject} {text}"


@dataclass(frozen=True)
class Signature:
    all: tuple[Condition, ...]
    any: tuple[Condition, ...] = ()
    none: tuple[Condition, ...] = ()
    supporting: tuple[Condition, ...] = ()
    onset: str | None = None
    explains: tuple[str, ...] = ()
    max_confidence: float = 1.0

    def conditions(self) -> Iterator[Condition]:
        yield from self.all
        yield from self.any
        yield from self.none
        yield from self.supporting


@dataclass(frozen=True)
class Alert:
    name: str
    expr: str
    for_: str
    severity: str
    floor: str
    summary: str
    description: str
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Playbook:
    id: str
    title: str
    kind: str
    chapter: str
    severity: str
    symptom: str
    cause: str
    fix: tuple[str, ...]
    guardrail: tuple[str, ...]
    evidence: tuple[str, ...]
    seed_symptoms: tuple[str, ...]
    seed_scenario: str | None
    path: Path
    impact: str | None = None
    relates_to: tuple[str, ...] = ()
    signature: Signature | None = None
    alert: Alert | None = None

    @property
    def detectable(self) -> bool:
        return self.kind == "detectable"

    @property
    def chapter_title(self) -> str:
        return CHAPTERS[self.chapter]


# --- locations ------------------------------------------------------------------------------


def builtin_dir() -> Path:
    """The catalog shipped with the package (wheel), or ``playbooks/`` in a source checkout."""
    packaged = Path(str(resources.files("diagnoser"))) / "_catalog" / "playbooks"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "playbooks"


@cache
def _validator() -> Any:
    import jsonschema

    text = resources.files("diagnoser").joinpath("playbook.schema.json").read_text("utf-8")
    schema = json.loads(text)
    return jsonschema.Draft202012Validator(schema)


# --- loading --------------------------------------------------------------------------------


def _field_path(parts: Iterable[object]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _read(path: Path) -> dict[str, Any]:
    data = read_yaml_mapping(path, CatalogError, "a playbook")
    errors = sorted(_validator().iter_errors(data), key=lambda e: (len(e.path), list(e.path)))
    if errors:
        err = errors[0]
        where = _field_path(err.absolute_path) or "(top level)"
        raise CatalogError(path, where, _schema_message(err))
    return data


def _schema_message(err: Any) -> str:
    if err.validator == "additionalProperties":
        extra = sorted(set(err.instance) - set(err.schema.get("properties", {})))
        return f"unknown field {', '.join(map(repr, extra))}"
    if err.validator == "required":
        return str(err.message).replace(" is a required property", " is required")
    if err.validator == "enum":
        return f"{err.instance!r} is not one of {', '.join(map(str, err.validator_value))}"
    return str(err.message)


def _condition(path: Path, where: str, raw: dict[str, Any]) -> Condition:
    shapes = [s for s in SHAPES if s in raw]
    if len(shapes) != 1:
        found = ", ".join(shapes) or "none"
        raise CatalogError(path, where, f"needs exactly one of {', '.join(SHAPES)} (found {found})")
    shape = shapes[0]
    for mod, allowed in MODIFIERS.items():
        if mod in raw and shape not in allowed:
            raise CatalogError(path, f"{where}.{mod}", f"does not apply to '{shape}'")
    if shape == "grows_with" and "exponent" not in raw:
        raise CatalogError(path, f"{where}.exponent", "is required with grows_with")
    if shape == "plateau" and "held" not in raw:
        raise CatalogError(path, f"{where}.held", "is required with plateau")
    for key in ("signal", "over", "tracks"):
        if key in raw and raw[key] not in SIGNALS:
            raise CatalogError(path, f"{where}.{key}", f"unknown signal {raw[key]!r}")
    return Condition(
        signal=raw["signal"],
        shape=shape,
        value=raw[shape],
        over=raw.get("over"),
        held=raw.get("held"),
        stat=raw.get("stat", "median"),
        floor=raw.get("floor"),
        min_corr=raw.get("min_corr"),
        exponent=raw.get("exponent"),
        weight=float(raw.get("weight", 1.0)),
        why=raw.get("why"),
        instead=tuple(raw.get("instead", ())),
    )


def _signature(path: Path, raw: dict[str, Any]) -> Signature:
    groups: dict[str, tuple[Condition, ...]] = {}
    for group in ("all", "any", "none", "supporting"):
        groups[group] = tuple(
            _condition(path, f"signature.{group}[{i}]", c) for i, c in enumerate(raw.get(group, []))
        )
    for i, c in enumerate(raw.get("none", [])):
        if "why" not in c:
            raise CatalogError(
                path, f"signature.none[{i}].why", "an exclusion must say which cause it points to"
            )
    for group in ("all", "any", "supporting"):
        for i, c in enumerate(raw.get(group, [])):
            if "instead" in c:
                raise CatalogError(
                    path, f"signature.{group}[{i}].instead", "only an exclusion (none) can name one"
                )
    onset = raw.get("onset")
    if onset is not None and onset not in SIGNALS:
        raise CatalogError(path, "signature.onset", f"unknown signal {onset!r}")
    return Signature(
        all=groups["all"],
        any=groups["any"],
        none=groups["none"],
        supporting=groups["supporting"],
        onset=onset,
        explains=tuple(raw.get("explains", [])),
        max_confidence=float(raw.get("max_confidence", 1.0)),
    )


def _alert(path: Path, raw: dict[str, Any], severity: str) -> Alert:
    params = {k: float(v) for k, v in raw.get("params", {}).items()}
    for key in ("expr", "summary", "description"):
        for m in PLACEHOLDER.finditer(raw[key]):
            name = m.group(1)
            if name == TARGETS and key == "expr" and not (m.group(2) or m.group(3)):
                continue
            if name in params and (m.group(2) or m.group(3)):
                raise CatalogError(
                    path, f"alert.{key}", f"${{{name}}} is a parameter, not a signal"
                )
            if name not in params and name not in SIGNALS:
                raise CatalogError(
                    path, f"alert.{key}", f"${{{name}}} is neither a signal nor one of alert.params"
                )
            if key != "expr" and name not in params:
                raise CatalogError(
                    path, f"alert.{key}", "only ${param} placeholders are allowed here"
                )
        leftover = PLACEHOLDER.sub("", raw[key])
        if "${" in leftover:
            raise CatalogError(path, f"alert.{key}", "malformed ${...} placeholder")
    if "{{" in raw["summary"]:
        raise CatalogError(path, "alert.summary", "must be static (no {{ templates }})")
    return Alert(
        name=raw["name"],
        expr=raw["expr"].strip(),
        for_=raw["for"],
        severity=raw.get("severity", severity),
        floor=raw.get("floor", "requests"),
        summary=raw["summary"],
        description=raw["description"].strip(),
        params=params,
    )


def load_playbook(path: Path) -> Playbook:
    data = _read(path)
    if data["id"] != path.stem:
        raise CatalogError(path, "id", f"{data['id']!r} must equal the file name {path.stem!r}")
    detectable = data["kind"] == "detectable"
    for key in ("signature", "alert"):
        if detectable and key not in data:
            raise CatalogError(path, key, "is required for a detectable playbook")
        if not detectable and key in data:
            raise CatalogError(path, key, "an advisory playbook has no " + key)
    if not detectable and not data.get("relates_to"):
        raise CatalogError(path, "relates_to", "an advisory playbook must name related playbooks")
    for i, name in enumerate(data["evidence"]):
        if name not in SIGNALS:
            raise CatalogError(path, f"evidence[{i}]", f"unknown signal {name!r}")
    seed = data["seed"]
    return Playbook(
        id=data["id"],
        title=data["title"],
        kind=data["kind"],
        chapter=data["chapter"],
        severity=data["severity"],
        symptom=data["symptom"].strip(),
        cause=data["cause"].strip(),
        fix=tuple(s.strip() for s in data["fix"]),
        guardrail=tuple(s.strip() for s in data["guardrail"]),
        evidence=tuple(data["evidence"]),
        seed_symptoms=tuple(seed["symptoms"]),
        seed_scenario=seed.get("scenario"),
        path=path,
        impact=data.get("impact", "").strip() or None,
        relates_to=tuple(data.get("relates_to", [])),
        signature=_signature(path, data["signature"]) if detectable else None,
        alert=_alert(path, data["alert"], data["severity"]) if detectable else None,
    )


class Catalog:
    """Playbooks by id, cross-checked (references resolve, alert names unique)."""

    def __init__(self, playbooks: Iterable[Playbook]):
        self._by_id: dict[str, Playbook] = {}
        for pb in playbooks:
            if pb.id in self._by_id:
                raise CatalogError(
                    pb.path, "id", f"{pb.id!r} is already defined in {self._by_id[pb.id].path}"
                )
            self._by_id[pb.id] = pb
        self._check_references()

    def _check_references(self) -> None:
        alerts: dict[str, Playbook] = {}
        for pb in self._by_id.values():
            refs = [("relates_to", pb.relates_to)]
            if pb.signature:
                refs.append(("signature.explains", pb.signature.explains))
                for i, cond in enumerate(pb.signature.none):
                    refs.append((f"signature.none[{i}].instead", cond.instead))
            for where, ids in refs:
                for i, ref in enumerate(ids):
                    if ref not in self._by_id or ref == pb.id:
                        raise CatalogError(pb.path, f"{where}[{i}]", f"unknown playbook {ref!r}")
            if pb.alert:
                if pb.alert.name in alerts:
                    raise CatalogError(
                        pb.path,
                        "alert.name",
                        f"{pb.alert.name!r} is already used by {alerts[pb.alert.name].id}",
                    )
                alerts[pb.alert.name] = pb

    def __iter__(self) -> Iterator[Playbook]:
        return iter(sorted(self._by_id.values(), key=lambda p: p.id))

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, pid: object) -> bool:
        return pid in self._by_id

    def __getitem__(self, pid: str) -> Playbook:
        return self._by_id[pid]

    def ids(self) -> list[str]:
        return sorted(self._by_id)

    def detectable(self) -> list[Playbook]:
        return [p for p in self if p.detectable]

    def advisory(self) -> list[Playbook]:
        return [p for p in self if not p.detectable]


def playbook_files(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise CatalogError(directory, "", "not a directory")
    return sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))


def load_catalog(*extra_dirs: Path) -> Catalog:
    """The built-in catalog plus the playbooks in ``extra_dirs`` (users' own)."""
    paths = playbook_files(builtin_dir())
    for d in extra_dirs:
        files = playbook_files(d)
        if not files:
            raise CatalogError(d, "", "no playbook files (*.yaml) found")
        paths += files
    return Catalog(load_playbook(p) for p in paths)
