#!/usr/bin/env python3
"""Validate Grafana dashboard JSON files against the generated schemas.

    .venv/bin/python scripts/check-dashboard-schema.py dashboards/*.json

Prints one line per violation, `FILE:PATH: message` (PATH is a JSONPath such as
`$.panels[3].datasource`), and exits 1 if there is any, 2 on usage errors.

Three checks, all from tests/data (made by scripts/grafana-dashboard-schema):
  1. the whole file against grafana-dashboard.schema.json;
  2. each panel whose type has a grafana-panel-<type>.schema.json against it
     (panel `options` and `fieldConfig.defaults.custom`);       --no-panels skips
  3. each panel target against the schema's definitions/DataQuery
     (core Grafana types targets as free-form objects);         --no-targets skips
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import jsonschema
except ImportError:  # pragma: no cover
    sys.exit("jsonschema is not installed: run this with the project's .venv/bin/python")

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def jsonpath(parts) -> str:
    out = "$"
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def _branch_const(schema: dict, key: str):
    prop = (schema.get("properties") or {}).get(key) or {}
    return prop.get("const", ...)


def leaves(err):
    """Flatten anyOf/oneOf errors to the errors of the branch that was meant."""
    if err.validator not in ("anyOf", "oneOf") or not err.context:
        yield err
        return
    branches: dict[int, list] = {}
    for sub in err.context:
        branches.setdefault(sub.schema_path[0], []).append(sub)
    # Every branch fails on the value itself (wrong type / const): one line.
    if all(not s.relative_path and s.validator in ("type", "const", "enum") for s in err.context):
        alts = []
        for b in err.validator_value:
            alts.append(
                b.get("type") or ("const " + json.dumps(b["const"]) if "const" in b else "enum")
            )
        err.message = f"{json.dumps(err.instance)} is not any of: {', '.join(map(str, alts))}"
        yield err
        return
    # Discriminate on a `type` const (RowPanel has type: const "row").
    inst_type = err.instance.get("type") if isinstance(err.instance, dict) else None
    candidates = list(range(len(err.validator_value)))
    exact = [i for i in candidates if _branch_const(err.validator_value[i], "type") == inst_type]
    if exact:
        candidates = exact
    else:
        candidates = [
            i for i in candidates if _branch_const(err.validator_value[i], "type") is ...
        ] or candidates
    best = min(candidates, key=lambda i: (len(branches.get(i, [])), i))
    for sub in branches.get(best, []):
        yield from leaves(sub)


def message(err) -> str:
    """jsonschema's message, with JSON (not Python) spelling of the offending value."""
    if err.validator == "type":
        want = (
            err.validator_value
            if isinstance(err.validator_value, str)
            else " or ".join(err.validator_value)
        )
        return f"{json.dumps(err.instance)} is not of type {want}"
    if err.validator in ("enum", "const"):
        return (
            f"{json.dumps(err.instance)} is not {'one of ' if err.validator == 'enum' else ''}"
            + json.dumps(err.validator_value)
        )
    return err.message


def validate(validator, instance, prefix=()):
    found = []
    for err in validator.iter_errors(instance):
        for leaf in leaves(err):
            found.append((tuple(prefix) + tuple(leaf.absolute_path), leaf))
    # A wrong type also fails the enum/const next to it: report the cause once.
    typed = {path for path, e in found if e.validator == "type"}
    for path, e in found:
        if not (e.validator in ("enum", "const") and path in typed):
            yield path, e


def walk_panels(panels, prefix=("panels",)):
    for i, p in enumerate(panels or []):
        if not isinstance(p, dict):
            continue
        yield (*prefix, i), p
        if isinstance(p.get("panels"), list):
            yield from walk_panels(p["panels"], (*prefix, i, "panels"))


def make_validator(schema):
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema)


def check_file(path: Path, dash_v, dq_v, panel_vs) -> list[tuple[tuple, str]]:
    doc = json.loads(path.read_text())
    out = [(p, message(e)) for p, e in validate(dash_v, doc)]
    if isinstance(doc, dict):
        for ppath, panel in walk_panels(doc.get("panels")):
            pv = panel_vs.get(panel.get("type"))
            if pv is not None:
                out += [
                    (p, f"[panel {panel['type']}] {message(e)}")
                    for p, e in validate(pv, panel, ppath)
                ]
            if dq_v is not None and isinstance(panel.get("targets"), list):
                for j, t in enumerate(panel["targets"]):
                    out += [
                        (p, f"[DataQuery] {message(e)}")
                        for p, e in validate(dq_v, t, (*ppath, "targets", j))
                    ]
    # stable order: document path, then message
    return sorted(
        set(out), key=lambda x: ([(isinstance(k, int), str(k).zfill(6)) for k in x[0]], x[1])
    )


def load_validators(
    schema_path: Path = DATA / "grafana-dashboard.schema.json",
    panel_schema_dir: Path = DATA,
    *,
    panels: bool = True,
    targets: bool = True,
):
    """The validators ``check_file`` takes: the dashboard's, DataQuery's (or None) and one
    per panel type that has a ``grafana-panel-<type>.schema.json``."""
    schema = json.loads(schema_path.read_text())
    dash_v = make_validator(schema)
    dq_v = None
    if targets and "DataQuery" in schema.get("definitions", {}):
        dq_v = make_validator(
            {
                "$schema": schema.get("$schema"),
                "$ref": "#/definitions/DataQuery",
                "definitions": schema["definitions"],
            }
        )
    panel_vs = {}
    if panels:
        for f in sorted(panel_schema_dir.glob("grafana-panel-*.schema.json")):
            panel_vs[f.name[len("grafana-panel-") : -len(".schema.json")]] = make_validator(
                json.loads(f.read_text())
            )
    return dash_v, dq_v, panel_vs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--schema", type=Path, default=DATA / "grafana-dashboard.schema.json")
    ap.add_argument("--panel-schema-dir", type=Path, default=DATA)
    ap.add_argument("--no-panels", action="store_true")
    ap.add_argument("--no-targets", action="store_true")
    ap.add_argument("-q", "--quiet", action="store_true", help="only the per-file counts")
    args = ap.parse_args(argv)

    dash_v, dq_v, panel_vs = load_validators(
        args.schema, args.panel_schema_dir, panels=not args.no_panels, targets=not args.no_targets
    )

    total = 0
    for f in args.files:
        try:
            problems = check_file(f, dash_v, dq_v, panel_vs)
        except (OSError, ValueError) as exc:
            print(f"{f}: cannot read: {exc}")
            total += 1
            continue
        total += len(problems)
        if args.quiet:
            print(f"{f}: {len(problems)} violation(s)")
        for p, msg in problems if not args.quiet else ():
            print(f"{f}:{jsonpath(p)}: {msg}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
