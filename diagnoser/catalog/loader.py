"""Load and validate the playbook catalog.

A playbook is one YAML file named after its id. Every file is checked against the playbook
schema and then against the signal vocabulary, the shape registry and the rest of the
catalog; the first problem is reported as one line naming the file and the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from diagnoser.catalog.levers import LeverError, parse_lever
from diagnoser.catalog.model import Alert, Condition, Playbook, Signature
from diagnoser.catalog.schema import validator
from diagnoser.catalog.shapes import SHAPES
from diagnoser.metrics.signals import SIGNALS
from diagnoser.plumbing.errors import FileFieldError, read_yaml_mapping

# ${targets} in an alert expression: the label matcher that selects vLLM scrape targets;
# ${by}: the labels of the site's model grouping (model_name and the site's group labels).
TARGETS = "targets"
BY = "by"
SPECIAL = frozenset({TARGETS, BY})
PLACEHOLDER = re.compile(r"\$\{([a-z0-9_]+)(@instance)?(?::([0-9]+[smhd]))?\}")
OFFSET = re.compile(r"\boffset ([0-9]+[smhd])\b")
COMMON_KEYS = frozenset({"signal", "over", "stat", "weight", "why", "instead", "param"})


class CatalogError(FileFieldError):
    """A playbook that cannot be used; ``str()`` is one line naming file and field."""


# --- locations ------------------------------------------------------------------------------


def builtin_dir() -> Path:
    """The catalog shipped with the package (wheel), or ``playbooks/`` in a source checkout."""
    packaged = Path(str(resources.files("diagnoser"))) / "_catalog" / "playbooks"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "playbooks"


# --- loading --------------------------------------------------------------------------------


def _field_path(parts: Iterable[object]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _read(path: Path) -> dict[str, Any]:
    data = read_yaml_mapping(path, CatalogError, "a playbook")
    for parts in _non_finite(data, ()):
        raise CatalogError(path, _field_path(parts), "must be a finite number")
    errors = sorted(validator().iter_errors(data), key=lambda e: (len(e.path), list(e.path)))
    if errors:
        err = errors[0]
        where = _field_path(err.absolute_path) or "(top level)"
        raise CatalogError(path, where, _schema_message(err))
    return data


def _non_finite(data: Any, parts: tuple[object, ...]) -> Iterator[tuple[object, ...]]:
    """Where a NaN or an infinity sits (YAML's ``.nan``, ``.inf``): no threshold is either."""
    if isinstance(data, float) and not math.isfinite(data):
        yield parts
    items = (
        data.items()
        if isinstance(data, dict)
        else enumerate(data)
        if isinstance(data, list)
        else ()
    )
    for key, value in items:
        yield from _non_finite(value, (*parts, key))


def _unclosed_action(template: str) -> int | None:
    """Where a ``{{`` opens a template action that no ``}}`` closes (before the next ``{{``)."""
    for m in re.finditer(r"\{\{", template):
        close, again = template.find("}}", m.end()), template.find("{{", m.end())
        if close < 0 or 0 <= again < close:
            return m.start()
    return None


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
    found = [s for s in SHAPES if s in raw]
    if len(found) != 1:
        names = ", ".join(found) or "none"
        raise CatalogError(path, where, f"needs exactly one of {', '.join(SHAPES)} (found {names})")
    shape = SHAPES[found[0]]
    for key in sorted(set(raw) - COMMON_KEYS - {shape.name} - shape.modifiers):
        raise CatalogError(path, f"{where}.{key}", f"does not apply to '{shape.name}'")
    for key in sorted(shape.required - set(raw)):
        raise CatalogError(path, f"{where}.{key}", f"is required with {shape.name}")
    if "param" in raw and not shape.numeric:
        raise CatalogError(path, f"{where}.param", f"'{shape.name}' has no threshold to bind")
    for key in ("signal", "over"):
        if key in raw and raw[key] not in SIGNALS:
            raise CatalogError(path, f"{where}.{key}", f"unknown signal {raw[key]!r}")
    if shape.name == "tracks" and raw["tracks"] not in SIGNALS:
        raise CatalogError(path, f"{where}.tracks", f"unknown signal {raw['tracks']!r}")
    for key, value in raw.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise CatalogError(path, f"{where}.{key}", "must be a finite number")
    return Condition(
        signal=raw["signal"],
        shape=shape.name,
        value=raw[shape.name],
        over=raw.get("over"),
        held=raw.get("held"),
        stat=raw.get("stat", "median"),
        floor=raw.get("floor"),
        min_corr=raw.get("min_corr"),
        exponent=raw.get("exponent"),
        weight=float(raw.get("weight", 1.0)),
        why=raw.get("why"),
        instead=tuple(raw.get("instead", ())),
        param=raw.get("param"),
    )


def _test(c: Condition) -> tuple[object, ...]:
    """What a condition tests, whatever its group, weight or wording."""
    return (c.signal, c.over, c.shape, c.value, c.held, c.stat, c.floor, c.min_corr, c.exponent)


def _signature(path: Path, raw: dict[str, Any], where: str = "signature") -> Signature:
    groups: dict[str, tuple[Condition, ...]] = {}
    for group in ("all", "any", "none", "supporting", "absolute"):
        groups[group] = tuple(
            _condition(path, f"{where}.{group}[{i}]", c) for i, c in enumerate(raw.get(group, []))
        )
    for i, c in enumerate(groups["absolute"]):
        if SHAPES[c.shape].relative:
            raise CatalogError(
                path,
                f"{where}.absolute[{i}].{c.shape}",
                "an absolute state is judged without a baseline: use a level shape",
            )
    for i, c in enumerate(raw.get("none", [])):
        if "why" not in c:
            raise CatalogError(
                path, f"{where}.none[{i}].why", "an exclusion must say which cause it points to"
            )
    for group in ("all", "any", "supporting", "absolute"):
        for i, c in enumerate(raw.get(group, [])):
            if "instead" in c:
                raise CatalogError(
                    path, f"{where}.{group}[{i}].instead", "only an exclusion (none) can name one"
                )
    # A parameter binds one test: several conditions may hold it only if they are that test
    # (the same signal, shape and threshold, e.g. in ``absolute`` and ``any``).
    seen: dict[str, tuple[str, Condition]] = {}
    for group in ("all", "any", "none", "supporting", "absolute"):
        for i, c in enumerate(groups[group]):
            if c.param is not None:
                at = f"{where}.{group}[{i}].param"
                first = seen.setdefault(c.param, (at, c))
                if _test(first[1]) != _test(c):
                    raise CatalogError(path, at, f"{c.param!r} is bound at {first[0]}")
    onset = raw.get("onset")
    if onset is not None and onset not in SIGNALS:
        raise CatalogError(path, f"{where}.onset", f"unknown signal {onset!r}")
    for name in raw.get("requires", []):
        if name not in SIGNALS:
            raise CatalogError(path, f"{where}.requires", f"unknown signal {name!r}")
    otherwise = None
    if "otherwise" in raw:
        inner = f"{where}.otherwise"
        if where != "signature":
            raise CatalogError(path, inner, "an otherwise has no otherwise of its own")
        if not raw.get("requires"):
            raise CatalogError(path, inner, "judged where requires has no series: name them")
        otherwise = _signature(path, raw["otherwise"], inner)
        if any(c.param for c in otherwise.conditions()):
            raise CatalogError(
                path, inner, "binds no alert parameter: the alert is the signature's"
            )
        if not otherwise.requires:
            raise CatalogError(path, f"{inner}.requires", "say what it reads in their place")
        otherwise = replace(
            otherwise,
            onset=otherwise.onset or onset,
            explains=otherwise.explains or tuple(raw.get("explains", [])),
        )
    return Signature(
        otherwise=otherwise,
        all=groups["all"],
        any=groups["any"],
        none=groups["none"],
        supporting=groups["supporting"],
        onset=onset,
        requires=tuple(raw.get("requires", [])),
        explains=tuple(raw.get("explains", [])),
        max_confidence=float(raw.get("max_confidence", 1.0)),
        absolute=groups["absolute"],
    )


def _alert(path: Path, raw: dict[str, Any], severity: str, sig: Signature) -> Alert:
    own: dict[str, float] = {}
    why: dict[str, str] = {}
    for name, value in raw.get("params", {}).items():
        if isinstance(value, dict):
            own[name], why[name] = float(value["value"]), value["why"]
        else:
            own[name] = float(value)
        if not math.isfinite(own[name]):
            raise CatalogError(path, f"alert.params.{name}", "must be a finite number")
    bound = sig.bound()
    for name in sorted(set(own) & set(bound)):
        raise CatalogError(
            path, f"alert.params.{name}", "is bound to a signature condition (param:); drop it here"
        )
    params = {**own, **{name: float(c.value) for name, c in bound.items()}}
    for key in ("expr", "summary", "description"):
        for m in PLACEHOLDER.finditer(raw[key]):
            name = m.group(1)
            if name in SPECIAL and key == "expr" and not (m.group(2) or m.group(3)):
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
    used = {m.group(1) for m in PLACEHOLDER.finditer(raw["expr"])}
    for name in sorted(set(params) - used):
        where = f"alert.params.{name}" if name in own else "signature"
        raise CatalogError(path, where, f"parameter {name!r} is not used in alert.expr")
    if "{{" in raw["summary"]:
        raise CatalogError(path, "alert.summary", "must be static (no {{ templates }})")
    unclosed = _unclosed_action(raw["description"])
    if unclosed is not None:
        raise CatalogError(
            path,
            "alert.description",
            f"not a valid template: the action at character {unclosed + 1} is not closed with }}}}",
        )
    if "fallback" in raw and not OFFSET.search(raw["expr"]):
        raise CatalogError(path, "alert.fallback", "the expression compares with no offset")
    return Alert(
        name=raw["name"],
        expr=raw["expr"].strip(),
        for_=raw["for"],
        severity=raw.get("severity", severity),
        floor=raw.get("floor", "requests"),
        summary=raw["summary"],
        description=raw["description"].strip(),
        params=params,
        why=why,
        keep_firing_for=raw.get("keep_firing_for"),
        fallback=raw.get("fallback"),
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
    for i, text in enumerate(data.get("levers", [])):
        try:
            parse_lever(text)
        except LeverError as exc:
            raise CatalogError(path, f"levers[{i}]", str(exc)) from None
    signature = _signature(path, data["signature"]) if detectable else None
    alert = None
    if detectable:
        assert signature is not None
        alert = _alert(path, data["alert"], data["severity"], signature)
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
        signature=signature,
        alert=alert,
        levers=tuple(data.get("levers", [])),
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
        self._check_explains_cycles()

    def _check_explains_cycles(self) -> None:
        """A cause that (through others) explains itself would demote every member. Two
        playbooks that explain each other are no such loop: each can be the other's
        consequence, and the order of events decides which is the cause (``rank``)."""
        explains = {p.id: p.signature.explains for p in self._by_id.values() if p.signature}
        graph = {
            pid: tuple(n for n in ids if pid not in explains.get(n, ()))
            for pid, ids in explains.items()
        }
        state: dict[str, int] = {}

        def visit(pid: str, trail: list[str]) -> None:
            state[pid] = 1
            for nxt in graph.get(pid, ()):
                if state.get(nxt) == 1:
                    cycle = " -> ".join([*trail[trail.index(nxt) :], nxt])
                    raise CatalogError(
                        self._by_id[pid].path, "signature.explains", f"cycle {cycle}"
                    )
                if nxt not in state:
                    visit(nxt, [*trail, nxt])
            state[pid] = 2

        for pid in sorted(graph):
            if pid not in state:
                visit(pid, [pid])

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

    def by_alert(self) -> dict[str, Playbook]:
        return {p.alert.name: p for p in self if p.alert}

    def replaced(self, playbooks: Iterable[Playbook]) -> Catalog:
        """This catalog with some playbooks replaced (same ids)."""
        new = {p.id: p for p in playbooks}
        return Catalog(new.get(p.id, p) for p in self)


def with_param(pb: Playbook, name: str, value: float) -> Playbook:
    """``pb`` with one alert parameter set: in the alert, and in the signature condition that
    holds it, so the alert and the diagnosis test the same number."""
    assert pb.alert is not None and pb.signature is not None
    sig = pb.signature

    def bind(conds: tuple[Condition, ...]) -> tuple[Condition, ...]:
        return tuple(replace(c, value=value) if c.param == name else c for c in conds)

    signature = replace(
        sig,
        all=bind(sig.all),
        any=bind(sig.any),
        none=bind(sig.none),
        supporting=bind(sig.supporting),
        absolute=bind(sig.absolute),
    )
    alert = replace(pb.alert, params={**pb.alert.params, name: value})
    return replace(pb, signature=signature, alert=alert)


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
