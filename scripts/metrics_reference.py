"""Shared code for the scripts that build a metrics reference from a wheel.

``scripts/vllm-metrics-reference`` and ``scripts/sglang-metrics-reference``
read an inference server's wheel (a zip file) and find, with ``ast`` only
(the server is never imported), every Prometheus metric family whose name
starts with the server's prefix (``vllm:``, ``sglang:``). Each family's type,
label names, buckets, documentation, the conditions it is registered under
and its source file:line are written to ``tests/data/<server>-<version>.json``.

The evaluator below resolves the expressions a constructor is called with:
literals, module constants (also through imports inside the wheel), class
attributes, ``self.x`` set in ``__init__``, loop and comprehension variables
(one definition per element), f-strings, concatenation, simple one-line
helper functions, ``range`` and comprehensions. What stays unknown is kept as
the expression's source text, never guessed.

Stdlib only.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

GENERATED_BY = "scripts/metrics_reference.py"

# prometheus_client's default histogram buckets (without +Inf).
PROMETHEUS_DEFAULT_BUCKETS = [
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
]

MAX_CANDIDATES = 64


class InputError(Exception):
    """Bad input: reported as one line on stderr, exit status 2."""


class Unresolved(Exception):
    """An expression whose value cannot be known from the source alone."""


@dataclass(frozen=True)
class Symbol:
    """A runtime value known only by name, e.g. ``max_model_len``."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class BucketSpec:
    """Buckets computed at runtime, described in words."""

    description: str


@dataclass(frozen=True)
class ListOf:
    """Keys of a mapping known only by description (e.g. ``x.keys()``)."""

    description: str


# --------------------------------------------------------------------------
# Source tree (wheel)
# --------------------------------------------------------------------------


class SourceTree:
    """The Python files of one wheel, parsed on demand."""

    def __init__(self, wheel_path: str, package: str):
        self.wheel_path = wheel_path
        self.package = package
        try:
            self._zip = zipfile.ZipFile(wheel_path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise InputError(f"{wheel_path}: not a readable wheel ({exc})") from None
        self.files: dict[str, str] = {}
        for info in self._zip.infolist():
            name = info.filename
            if name.endswith(".py") and name.startswith(package + "/"):
                self.files[name] = ""
        self._text: dict[str, str] = {}
        self._modules: dict[str, Module] = {}

    def text(self, path: str) -> str:
        if path not in self._text:
            raw = self._zip.read(path)
            try:
                self._text[path] = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise InputError(f"{path}: not UTF-8 text") from None
        return self._text[path]

    def module(self, path: str) -> Module:
        if path not in self._modules:
            text = self.text(path)
            try:
                tree = ast.parse(text, filename=path)
            except SyntaxError as exc:
                raise InputError(
                    f"{os.path.basename(self.wheel_path)}: {path}:{exc.lineno}: "
                    f"does not parse ({exc.msg})"
                ) from None
            self._modules[path] = Module(self, path, text, tree)
        return self._modules[path]

    def path_of_module(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for cand in (base + ".py", base + "/__init__.py"):
            if cand in self.files:
                return cand
        return None

    def dotted_of_path(self, path: str) -> str:
        mod = path[:-3]
        if mod.endswith("/__init__"):
            mod = mod[: -len("/__init__")]
        return mod.replace("/", ".")

    def sha256(self) -> str:
        h = hashlib.sha256()
        with open(self.wheel_path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()


class Module:
    def __init__(self, tree_: SourceTree, path: str, text: str, tree: ast.Module):
        self.src = tree_
        self.path = path
        self.lines = text.splitlines()
        self.tree = tree
        self.dotted = tree_.dotted_of_path(path)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        # top-level names: imports, assignments, defs
        self.imports: dict[str, tuple[str, str | None]] = {}
        self.assigns: dict[str, list[ast.AST]] = {}
        self.defs: dict[str, ast.AST] = {}
        for stmt in self._top_statements(tree.body):
            self._index(stmt)

    def _top_statements(self, body: list[ast.stmt]) -> Iterable[ast.stmt]:
        for stmt in body:
            # look inside module-level if/try blocks (TYPE_CHECKING, fallbacks)
            if isinstance(stmt, ast.If):
                yield from self._top_statements(stmt.body)
                yield from self._top_statements(stmt.orelse)
            elif isinstance(stmt, ast.Try):
                yield from self._top_statements(stmt.body)
                for h in stmt.handlers:
                    yield from self._top_statements(h.body)
            else:
                yield stmt

    def _index(self, stmt: ast.stmt) -> None:
        if isinstance(stmt, ast.Import):
            for a in stmt.names:
                local = a.asname or a.name.split(".")[0]
                self.imports[local] = (a.name if a.asname else a.name.split(".")[0], None)
        elif isinstance(stmt, ast.ImportFrom):
            base = self._absolute(stmt.module, stmt.level)
            for a in stmt.names:
                self.imports[a.asname or a.name] = (base, a.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if stmt.value is None:
                return
            for t in targets:
                if isinstance(t, ast.Name):
                    self.assigns.setdefault(t.id, []).append(stmt.value)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.defs[stmt.name] = stmt

    def _absolute(self, module: str | None, level: int) -> str:
        if level == 0:
            return module or ""
        parts = self.dotted.split(".")
        if not self.path.endswith("__init__.py"):
            parts = parts[:-1]
        if level > 1:
            parts = parts[: len(parts) - (level - 1)]
        if module:
            parts.append(module)
        return ".".join(parts)

    def enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        cur = self.parent.get(node)
        while cur is not None and not isinstance(cur, kinds):
            cur = self.parent.get(cur)
        return cur

    def comment_above(self, node: ast.AST) -> str | None:
        """Comment lines directly above the statement holding ``node``."""
        stmt = node
        while stmt is not None and not isinstance(stmt, ast.stmt):
            stmt = self.parent.get(stmt)
        if stmt is None:
            return None
        i = stmt.lineno - 2
        out: list[str] = []
        while i >= 0 and self.lines[i].strip().startswith("#"):
            line = re.sub(r"[=\-#*]{5,}", "", self.lines[i].strip().lstrip("#")).strip()
            if line:
                out.append(line)
            i -= 1
        return " ".join(reversed(out)) or None


# --------------------------------------------------------------------------
# Evaluator
# --------------------------------------------------------------------------


@dataclass
class Scope:
    module: Module
    at: ast.AST  # the node being evaluated for (position in the source)
    bindings: dict[str, Any] = field(default_factory=dict)
    depth: int = 0


SpecialCall = Callable[["Evaluator", ast.Call, Scope], list[Any]]


class Evaluator:
    def __init__(
        self,
        tree: SourceTree,
        symbols: Iterable[str] = (),
        param_hints: dict[str, Any] | Callable[[str, ast.AST, Module], Any] | None = None,
        special_calls: dict[str, SpecialCall] | None = None,
    ):
        self.tree = tree
        self.symbols = set(symbols)
        self.param_hints = param_hints or {}
        self.special_calls = special_calls or {}
        self.used_hints: set[str] = set()

    # -- public ---------------------------------------------------------------

    def values(self, node: ast.AST, scope: Scope) -> list[Any]:
        """All candidate values of ``node`` (raises Unresolved)."""
        if scope.depth > 40:
            raise Unresolved("too deep")
        out = self._eval(node, scope)
        uniq: list[Any] = []
        for v in out:
            if not any(_same(v, u) for u in uniq):
                uniq.append(v)
        if len(uniq) > MAX_CANDIDATES:
            raise Unresolved("too many candidates")
        return uniq

    def value(self, node: ast.AST, scope: Scope) -> Any:
        vals = self.values(node, scope)
        if len(vals) != 1:
            raise Unresolved(f"{len(vals)} candidates")
        return vals[0]

    # -- dispatch -------------------------------------------------------------

    def _sub(
        self,
        scope: Scope,
        at: ast.AST | None = None,
        module: Module | None = None,
        bindings: dict[str, Any] | None = None,
    ) -> Scope:
        return Scope(
            module=module or scope.module,
            at=at if at is not None else scope.at,
            bindings=scope.bindings if bindings is None else bindings,
            depth=scope.depth + 1,
        )

    def _eval(self, node: ast.AST, scope: Scope) -> list[Any]:
        method = getattr(self, "_eval_" + type(node).__name__, None)
        if method is None:
            raise Unresolved(type(node).__name__)
        return method(node, scope)

    def _eval_Constant(self, node: ast.Constant, scope: Scope) -> list[Any]:
        return [node.value]

    def _seq(self, elts: list[ast.expr], scope: Scope) -> list[list[Any]]:
        parts: list[list[list[Any]]] = []
        for e in elts:
            if isinstance(e, ast.Starred):
                parts.append([list(v) for v in self.values(e.value, scope) if _iterable(v)])
            else:
                parts.append([[v] for v in self.values(e, scope)])
        combos = []
        for prod in itertools.product(*parts):
            combos.append([x for chunk in prod for x in chunk])
            if len(combos) > MAX_CANDIDATES:
                raise Unresolved("too many candidates")
        return combos

    def _eval_List(self, node: ast.List, scope: Scope) -> list[Any]:
        return [list(c) for c in self._seq(node.elts, scope)]

    def _eval_Tuple(self, node: ast.Tuple, scope: Scope) -> list[Any]:
        return [tuple(c) for c in self._seq(node.elts, scope)]

    def _eval_Set(self, node: ast.Set, scope: Scope) -> list[Any]:
        return [list(c) for c in self._seq(node.elts, scope)]

    def _eval_Dict(self, node: ast.Dict, scope: Scope) -> list[Any]:
        out: dict[Any, Any] = {}
        for k, v in zip(node.keys, node.values, strict=False):
            if k is None:
                sub = self.value(v, scope)
                if isinstance(sub, dict):
                    out.update(sub)
                    continue
                raise Unresolved("dict unpack")
            try:
                key = self.value(k, scope)
                hash(key)
            except (Unresolved, TypeError):
                continue
            try:
                out[key] = self.value(v, scope)
            except Unresolved:
                out[key] = _Opaque(ast.unparse(v))
        return [out]

    def _eval_JoinedStr(self, node: ast.JoinedStr, scope: Scope) -> list[Any]:
        parts: list[list[str]] = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append([str(v.value)])
            elif isinstance(v, ast.FormattedValue):
                vals = self.values(v.value, scope)
                strs = []
                for x in vals:
                    if isinstance(x, (Symbol, BucketSpec, ListOf, _Opaque)):
                        raise Unresolved("symbolic in f-string")
                    if v.format_spec is not None:
                        spec = self.value(v.format_spec, scope)
                        strs.append(format(x, spec))
                    else:
                        strs.append(_str(x))
                parts.append(strs)
            else:
                raise Unresolved("f-string part")
        return ["".join(p) for p in itertools.product(*parts)]

    def _eval_BinOp(self, node: ast.BinOp, scope: Scope) -> list[Any]:
        left = self.values(node.left, scope)
        right = self.values(node.right, scope)
        out = []
        for a, b in itertools.product(left, right):
            out.append(_binop(node.op, a, b))
        return out

    def _eval_UnaryOp(self, node: ast.UnaryOp, scope: Scope) -> list[Any]:
        out = []
        for v in self.values(node.operand, scope):
            if isinstance(node.op, ast.USub) and isinstance(v, (int, float)):
                out.append(-v)
            elif isinstance(node.op, ast.UAdd) and isinstance(v, (int, float)):
                out.append(v)
            elif isinstance(node.op, ast.Not) and not isinstance(v, (Symbol, _Opaque)):
                out.append(not v)
            else:
                raise Unresolved("unary op")
        return out

    def _eval_IfExp(self, node: ast.IfExp, scope: Scope) -> list[Any]:
        try:
            test = self.value(node.test, scope)
            if not isinstance(test, (Symbol, _Opaque, ListOf, BucketSpec)):
                return self.values(node.body if test else node.orelse, scope)
        except Unresolved:
            pass
        return self.values(node.body, scope) + self.values(node.orelse, scope)

    def _eval_Subscript(self, node: ast.Subscript, scope: Scope) -> list[Any]:
        out = []
        for base in self.values(node.value, scope):
            if isinstance(node.slice, ast.Slice):
                lo = self.value(node.slice.lower, scope) if node.slice.lower else None
                hi = self.value(node.slice.upper, scope) if node.slice.upper else None
                st = self.value(node.slice.step, scope) if node.slice.step else None
                if isinstance(base, (list, tuple, str)):
                    out.append(base[slice(lo, hi, st)])
                    continue
                raise Unresolved("slice")
            for idx in self.values(node.slice, scope):
                try:
                    out.append(base[idx])
                except (KeyError, IndexError, TypeError):
                    raise Unresolved("subscript") from None
        return out

    def _eval_Name(self, node: ast.Name, scope: Scope) -> list[Any]:
        return self.lookup(node.id, scope)

    def _eval_Attribute(self, node: ast.Attribute, scope: Scope) -> list[Any]:
        if node.attr in self.symbols:
            return [Symbol(node.attr)]
        # self.x
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            return self._self_attr(node.attr, scope)
        # module / class attribute
        if isinstance(node.value, (ast.Name, ast.Attribute)):
            target = self._resolve_namespace(node.value, scope)
            if target is not None:
                mod, cls = target
                if cls is None:
                    return self.lookup_in_module(node.attr, mod, scope)
                return self._class_attr(mod, cls, node.attr, scope)
        bases = self.values(node.value, scope)
        out = []
        for b in bases:
            if isinstance(b, _EnumMember) and node.attr in ("value", "name"):
                out.append(b.value if node.attr == "value" else b.name)
            elif isinstance(b, dict) and node.attr in b:
                out.append(b[node.attr])
            else:
                raise Unresolved(f"attribute {node.attr}")
        return out

    def _eval_Call(self, node: ast.Call, scope: Scope) -> list[Any]:
        fname = _callee_name(node.func)
        if fname in self.special_calls:
            return self.special_calls[fname](self, node, scope)
        if isinstance(node.func, ast.Name):
            builtin = _BUILTINS.get(node.func.id)
            if builtin is not None and not self._is_defined(node.func.id, scope):
                args = [self.value(a, scope) for a in node.args]
                try:
                    return [builtin(*args)]
                except Exception:
                    raise Unresolved(f"builtin {node.func.id}") from None
        if isinstance(node.func, ast.Attribute):
            meth = node.func.attr
            if meth in (
                "keys",
                "values",
                "items",
                "copy",
                "upper",
                "lower",
                "strip",
                "replace",
                "format",
                "join",
                "get",
            ):
                out = []
                for base in self.values(node.func.value, scope):
                    args = [self.value(a, scope) for a in node.args]
                    out.append(_method(base, meth, args, node))
                return out
        # a simple helper function: def f(a, b): return <expr>
        fn = self._function_def(node.func, scope)
        if fn is not None:
            mod, fdef = fn
            body = [
                s
                for s in fdef.body
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                params = [a.arg for a in fdef.args.args]
                if params and params[0] in ("self", "cls"):
                    params = params[1:]
                binding_opts: list[list[tuple[str, Any]]] = []
                for p, a in zip(params, node.args, strict=False):
                    binding_opts.append([(p, v) for v in self.values(a, scope)])
                for kw in node.keywords:
                    if kw.arg is not None:
                        binding_opts.append([(kw.arg, v) for v in self.values(kw.value, scope)])
                out = []
                for combo in itertools.product(*binding_opts):
                    sub = self._sub(scope, at=body[0], module=mod, bindings=dict(combo))
                    out.extend(self.values(body[0].value, sub))
                return out
        raise Unresolved(f"call {fname}")

    def _eval_ListComp(self, node: ast.ListComp, scope: Scope) -> list[Any]:
        return [list(self._comprehension(node.elt, node.generators, scope))]

    _eval_GeneratorExp = _eval_ListComp

    def _eval_SetComp(self, node: ast.SetComp, scope: Scope) -> list[Any]:
        return [list(self._comprehension(node.elt, node.generators, scope))]

    def _eval_DictComp(self, node: ast.DictComp, scope: Scope) -> list[Any]:
        pairs = self._comprehension(
            ast.Tuple(elts=[node.key, node.value], ctx=ast.Load()), node.generators, scope
        )
        return [dict(pairs)]

    def _comprehension(
        self, elt: ast.expr, gens: list[ast.comprehension], scope: Scope
    ) -> list[Any]:
        results: list[Any] = []

        def rec(i: int, bindings: dict[str, Any]) -> None:
            sub = self._sub(scope, bindings=bindings)
            if i == len(gens):
                results.append(self.value(elt, sub))
                if len(results) > 10000:
                    raise Unresolved("comprehension too large")
                return
            g = gens[i]
            it = self.value(g.iter, sub)
            if not _iterable(it):
                raise Unresolved("comprehension iterable")
            for item in it:
                b = dict(bindings)
                bind_target(g.target, item, b)
                subb = self._sub(scope, bindings=b)
                if all(self.value(c, subb) for c in g.ifs):
                    rec(i + 1, b)

        rec(0, dict(scope.bindings))
        return results

    # -- names ----------------------------------------------------------------

    def _is_defined(self, name: str, scope: Scope) -> bool:
        m = scope.module
        return name in scope.bindings or name in m.assigns or name in m.defs or name in m.imports

    def lookup(self, name: str, scope: Scope) -> list[Any]:
        if name in scope.bindings:
            return [scope.bindings[name]]
        if name in ("None", "True", "False"):
            return [{"None": None, "True": True, "False": False}[name]]
        if name in self.symbols:
            return [Symbol(name)]
        # enclosing function scopes (innermost first)
        fn = scope.module.enclosing(scope.at, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        while fn is not None:
            local = self._function_local(name, fn, scope)
            if local is not None:
                return local
            fn = scope.module.enclosing(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        return self.lookup_in_module(name, scope.module, scope)

    def lookup_in_module(self, name: str, mod: Module, scope: Scope) -> list[Any]:
        if name in mod.assigns:
            value = mod.assigns[name][-1]
            return self.values(value, self._sub(scope, at=value, module=mod, bindings={}))
        if name in mod.imports:
            base, attr = mod.imports[name]
            if attr is None:
                raise Unresolved(f"module {base}")
            target = self.tree.path_of_module(base)
            if target is not None:
                tmod = self.tree.module(target)
                if attr in tmod.defs and isinstance(tmod.defs[attr], ast.ClassDef):
                    raise Unresolved(f"class {attr}")
                return self.lookup_in_module(attr, tmod, scope)
            sub = self.tree.path_of_module(base + "." + attr)
            if sub is not None:
                raise Unresolved(f"module {base}.{attr}")
            raise Unresolved(f"external {base}.{attr}")
        if name in mod.defs:
            raise Unresolved(f"definition {name}")
        raise Unresolved(f"name {name}")

    def _function_local(self, name: str, fn: ast.AST, scope: Scope) -> list[Any] | None:
        mod = scope.module
        at_line = getattr(scope.at, "lineno", 10**9)
        # loop / comprehension targets enclosing the position
        cur = mod.parent.get(scope.at)
        node = scope.at
        while cur is not None and cur is not fn:
            if (
                isinstance(cur, (ast.For, ast.AsyncFor))
                and node is not cur.iter
                and _binds(cur.target, name)
            ):
                return self._loop_values(cur.target, cur.iter, name, scope)
            if isinstance(cur, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
                for g in cur.generators:
                    if _binds(g.target, name) and node is not g.iter:
                        return self._loop_values(g.target, g.iter, name, scope)
            node, cur = cur, mod.parent.get(cur)
        # assignments in this function before the position
        assigns: list[tuple[ast.AST, ast.AST]] = []  # (stmt, value)
        for stmt in ast.walk(fn):
            if stmt is fn:
                continue
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if mod.enclosing(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) is not fn:
                continue
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Name) and t.id == name:
                        assigns.append((stmt, stmt.value))
                    elif isinstance(t, (ast.Tuple, ast.List)) and _binds(t, name):
                        assigns.append((stmt, None))
            elif (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == name
                and stmt.value is not None
            ):
                assigns.append((stmt, stmt.value))
            elif (
                isinstance(stmt, ast.AugAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == name
            ):
                assigns.append((stmt, None))
            elif isinstance(stmt, ast.NamedExpr) and stmt.target.id == name:
                assigns.append((stmt, stmt.value))
        before = [a for a in assigns if a[0].lineno < at_line]
        if before:
            before.sort(key=lambda a: a[0].lineno)
            last_stmt, _ = before[-1]
            chosen = [before[-1]]
            # the other branch of an if/else that does not hold the position
            parent_if = mod.enclosing(last_stmt, (ast.If,))
            if parent_if is not None and not _contains(parent_if, scope.at):
                for st, val in before[:-1]:
                    if _contains(parent_if, st) and _branch_of(parent_if, st) != _branch_of(
                        parent_if, last_stmt
                    ):
                        chosen.append((st, val))
                        break
            out: list[Any] = []
            for _st, val in chosen:
                if val is None:
                    raise Unresolved(f"local {name}")
                out.extend(self.values(val, self._sub(scope, at=val)))
            return out
        # parameters
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            params = [a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs]
            if name in params:
                if callable(self.param_hints):
                    hinted = self.param_hints(name, fn, scope.module)
                    if hinted is not None:
                        self.used_hints.add(name)
                        return [hinted]
                elif name in self.param_hints:
                    self.used_hints.add(name)
                    return [self.param_hints[name]]
                raise Unresolved(f"parameter {name}")
        return None

    def _loop_values(
        self, target: ast.AST, iter_node: ast.AST, name: str, scope: Scope
    ) -> list[Any]:
        out = []
        for it in self.values(iter_node, self._sub(scope, at=iter_node)):
            if not _iterable(it):
                raise Unresolved("loop iterable")
            for item in it:
                b: dict[str, Any] = {}
                bind_target(target, item, b)
                out.append(b[name])
        return out

    # -- attributes -----------------------------------------------------------

    def _enclosing_class(self, scope: Scope) -> ast.ClassDef | None:
        return scope.module.enclosing(scope.at, (ast.ClassDef,))  # type: ignore[return-value]

    def _self_attr(self, attr: str, scope: Scope) -> list[Any]:
        cls = self._enclosing_class(scope)
        if cls is None:
            raise Unresolved(f"self.{attr}")
        return self._class_attr(scope.module, cls, attr, scope, instance=True)

    def _class_attr(
        self,
        mod: Module,
        cls: ast.ClassDef,
        attr: str,
        scope: Scope,
        instance: bool = False,
        seen: int = 0,
    ) -> list[Any]:
        if seen > 6:
            raise Unresolved("class depth")
        is_enum = any(
            _callee_name(b) in ("Enum", "IntEnum", "StrEnum")
            or (isinstance(b, ast.Attribute) and b.attr.endswith("Enum"))
            for b in cls.bases
        ) or any(_callee_name(b).endswith("Enum") for b in cls.bases)
        for stmt in cls.body:
            if isinstance(stmt, ast.Assign):
                for t in stmt.targets:
                    if isinstance(t, ast.Name) and t.id == attr:
                        vals = self.values(
                            stmt.value, self._sub(scope, at=stmt.value, module=mod, bindings={})
                        )
                        if is_enum:
                            return [_EnumMember(attr, v) for v in vals]
                        return vals
            elif (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id == attr
                and stmt.value is not None
            ):
                return self.values(
                    stmt.value, self._sub(scope, at=stmt.value, module=mod, bindings={})
                )
        if instance:
            # self.attr = value inside the class's methods (the position's own
            # method first, then __init__)
            methods = [
                s for s in cls.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            here = mod.enclosing(scope.at, (ast.FunctionDef, ast.AsyncFunctionDef))
            methods.sort(key=lambda m: (m is not here, m.name != "__init__"))
            for m in methods:
                found = []
                for st in ast.walk(m):
                    if isinstance(st, ast.Assign):
                        for t in st.targets:
                            if (
                                isinstance(t, ast.Attribute)
                                and t.attr == attr
                                and isinstance(t.value, ast.Name)
                                and t.value.id == "self"
                            ):
                                if m is here and st.lineno >= getattr(scope.at, "lineno", 0):
                                    continue
                                found.append(st)
                if found:
                    found.sort(key=lambda s: s.lineno)
                    st = found[-1]
                    return self.values(
                        st.value, self._sub(scope, at=st.value, module=mod, bindings={})
                    )
        # base classes
        for b in cls.bases:
            target = self._resolve_namespace(b, Scope(module=mod, at=cls, depth=scope.depth + 1))
            if target is not None and target[1] is not None:
                try:
                    return self._class_attr(target[0], target[1], attr, scope, instance, seen + 1)
                except Unresolved:
                    continue
        raise Unresolved(f"{cls.name}.{attr}")

    def _resolve_namespace(
        self, node: ast.AST, scope: Scope
    ) -> tuple[Module, ast.ClassDef | None] | None:
        """Resolve ``node`` to a module (cls None) or a class inside the wheel."""
        if isinstance(node, ast.Name):
            mod = scope.module
            name = node.id
            if name in mod.defs and isinstance(mod.defs[name], ast.ClassDef):
                return mod, mod.defs[name]  # type: ignore[return-value]
            # class defined in an enclosing scope
            for n in ast.walk(mod.tree):
                if (
                    isinstance(n, ast.ClassDef)
                    and n.name == name
                    and _contains(
                        mod.enclosing(n, (ast.FunctionDef, ast.AsyncFunctionDef)) or mod.tree,
                        scope.at,
                    )
                ):
                    return mod, n
            if name in mod.imports:
                base, attr = mod.imports[name]
                if attr is None:
                    path = self.tree.path_of_module(base)
                    return (self.tree.module(path), None) if path else None
                path = self.tree.path_of_module(base + "." + attr)
                if path is not None:
                    return self.tree.module(path), None
                path = self.tree.path_of_module(base)
                if path is None:
                    return None
                tmod = self.tree.module(path)
                return self._resolve_namespace(
                    ast.Name(id=attr, ctx=ast.Load()),
                    Scope(module=tmod, at=tmod.tree, depth=scope.depth + 1),
                )
            return None
        if isinstance(node, ast.Attribute):
            inner = self._resolve_namespace(node.value, scope)
            if inner is None:
                return None
            mod, cls = inner
            if cls is None:
                if node.attr in mod.defs and isinstance(mod.defs[node.attr], ast.ClassDef):
                    return mod, mod.defs[node.attr]  # type: ignore[return-value]
                if node.attr in mod.imports:
                    return self._resolve_namespace(
                        ast.Name(id=node.attr, ctx=ast.Load()),
                        Scope(module=mod, at=mod.tree, depth=scope.depth + 1),
                    )
                path = self.tree.path_of_module(mod.dotted + "." + node.attr)
                if path is not None:
                    return self.tree.module(path), None
                return None
            for st in cls.body:
                if isinstance(st, ast.ClassDef) and st.name == node.attr:
                    return mod, st
        return None

    def _function_def(self, func: ast.AST, scope: Scope) -> tuple[Module, ast.FunctionDef] | None:
        if isinstance(func, ast.Name):
            mod = scope.module
            name = func.id
            if name in mod.defs and isinstance(mod.defs[name], ast.FunctionDef):
                return mod, mod.defs[name]  # type: ignore[return-value]
            if name in mod.imports:
                base, attr = mod.imports[name]
                path = self.tree.path_of_module(base) if attr else None
                if path:
                    tmod = self.tree.module(path)
                    if attr in tmod.defs and isinstance(tmod.defs[attr], ast.FunctionDef):
                        return tmod, tmod.defs[attr]  # type: ignore[return-value]
        elif isinstance(func, ast.Attribute):
            target = self._resolve_namespace(func.value, scope)
            if target is not None:
                mod, cls = target
                body = cls.body if cls is not None else mod.tree.body
                for st in body:
                    if isinstance(st, ast.FunctionDef) and st.name == func.attr:
                        return mod, st
        return None


class _Opaque:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"<{self.text}>"


@dataclass(frozen=True)
class _EnumMember:
    name: str
    value: Any

    def __str__(self) -> str:
        return str(self.value)


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) is type(b) and a == b
    except Exception:
        return False


def _iterable(v: Any) -> bool:
    return isinstance(v, (list, tuple, dict, range, str))


def _str(x: Any) -> str:
    if isinstance(x, _EnumMember):
        return str(x.value)
    return str(x)


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    if isinstance(a, _EnumMember):
        a = a.value
    if isinstance(b, _EnumMember):
        b = b.value
    if isinstance(a, (Symbol, BucketSpec, ListOf, _Opaque)) or isinstance(
        b, (Symbol, BucketSpec, ListOf, _Opaque)
    ):
        if isinstance(op, ast.Add) and isinstance(a, ListOf) and isinstance(b, (list, tuple)):
            return ListOf(a.description + " + " + json.dumps(list(b)))
        raise Unresolved("symbolic arithmetic")
    try:
        if isinstance(op, ast.Add):
            if isinstance(a, list) and isinstance(b, tuple):
                return a + list(b)
            if isinstance(a, tuple) and isinstance(b, list):
                return list(a) + b
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.Div):
            return a / b
        if isinstance(op, ast.FloorDiv):
            return a // b
        if isinstance(op, ast.Mod):
            return a % b
        if isinstance(op, ast.Pow):
            return a**b
    except Exception:
        raise Unresolved("arithmetic") from None
    raise Unresolved("operator")


def _method(base: Any, meth: str, args: list[Any], node: ast.Call) -> Any:
    if isinstance(base, dict):
        if meth == "keys":
            return list(base.keys())
        if meth == "values":
            return list(base.values())
        if meth == "items":
            return list(base.items())
        if meth == "copy":
            return dict(base)
        if meth == "get":
            return base.get(*args)
    if isinstance(base, (list, tuple)) and meth == "copy":
        return list(base)
    if isinstance(base, str) and meth in ("upper", "lower", "strip", "replace", "format", "join"):
        return getattr(base, meth)(*args)
    raise Unresolved(f"method {meth}")


_BUILTINS: dict[str, Callable[..., Any]] = {
    "range": lambda *a: list(range(*a)),
    "list": lambda x=(): list(x),
    "tuple": lambda x=(): tuple(x),
    "sorted": lambda x: sorted(x),
    "float": float,
    "int": int,
    "str": str,
    "len": len,
    "dict": lambda x=(): dict(x),
    "max": max,
    "min": min,
}


def _callee_name(func: ast.AST) -> str:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Call):
        return _callee_name(func.func)
    return ""


def _binds(target: ast.AST, name: str) -> bool:
    if isinstance(target, ast.Name):
        return target.id == name
    if isinstance(target, (ast.Tuple, ast.List)):
        return any(_binds(e, name) for e in target.elts)
    return False


def bind_target(target: ast.AST, value: Any, out: dict[str, Any]) -> None:
    if isinstance(target, ast.Name):
        out[target.id] = value
    elif isinstance(target, (ast.Tuple, ast.List)):
        if not isinstance(value, (list, tuple)) or len(value) != len(target.elts):
            raise Unresolved("unpacking")
        for t, v in zip(target.elts, value, strict=False):
            bind_target(t, v, out)
    else:
        raise Unresolved("loop target")


def _contains(outer: ast.AST, inner: ast.AST) -> bool:
    if outer is inner:
        return True
    lo, hi = getattr(outer, "lineno", None), getattr(outer, "end_lineno", None)
    il = getattr(inner, "lineno", None)
    if lo is None or hi is None or il is None:
        return any(n is inner for n in ast.walk(outer))
    return lo <= il <= hi and any(n is inner for n in ast.walk(outer))


def _branch_of(if_node: ast.If, stmt: ast.AST) -> str:
    for s in if_node.body:
        if _contains(s, stmt):
            return "body"
    return "orelse"


# --------------------------------------------------------------------------
# Finding metric definitions
# --------------------------------------------------------------------------

TYPE_BY_CTOR = {
    "gauge": "gauge",
    "counter": "counter",
    "histogram": "histogram",
    "summary": "summary",
    "info": "info",
    "enum": "stateset",
}

CTOR_RE = re.compile(r"^_*(?P<kind>gauge|counter|histogram|summary|info|enum)(_cls)?$", re.I)
METADATA_RE = re.compile(r"(?P<kind>Counter|Gauge|Histogram)Metadata$")


@dataclass
class Definition:
    declared_name: str
    type: str
    file: str
    line: int
    qualname: str
    labels: list[str] | None
    labels_expr: str | None
    buckets: Any
    buckets_expr: str | None
    documentation: str | None
    conditions: list[str]
    comment: str | None
    multiprocess_mode: str | None
    notes: list[str]
    style: str  # "constructor" or "metadata"


def _qualname(mod: Module, node: ast.AST) -> str:
    parts = []
    cur = mod.parent.get(node)
    while cur is not None:
        if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            parts.append(cur.name)
        cur = mod.parent.get(cur)
    return ".".join(reversed(parts)) or "<module>"


def _conditions(mod: Module, node: ast.AST) -> list[str]:
    """Enclosing if-tests (with polarity) and earlier early-return guards."""
    conds: list[str] = []
    child = node
    cur = mod.parent.get(node)
    while cur is not None:
        if isinstance(cur, ast.If):
            test = ast.unparse(cur.test)
            if any(_contains(s, child) for s in cur.body):
                conds.append(test)
            else:
                conds.append(_negate(cur.test))
        elif isinstance(cur, ast.IfExp) and child is not cur.test:
            conds.append(ast.unparse(cur.test) if child is cur.body else _negate(cur.test))
        if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # guards: `if X: return` at the top level of the function before us
            stmt_here = None
            for st in cur.body:
                if _contains(st, node):
                    stmt_here = st
                    break
            for st in cur.body:
                if st is stmt_here:
                    break
                # (a guard that raises is an error check, not a condition)
                if (
                    isinstance(st, ast.If)
                    and not st.orelse
                    and st.body
                    and isinstance(st.body[-1], ast.Return)
                ):
                    conds.append(_negate(st.test))
            break
        child, cur = cur, mod.parent.get(cur)
    conds.reverse()
    return conds


def _negate(test: ast.expr) -> str:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return ast.unparse(test.operand)
    return f"not ({ast.unparse(test)})"


def _arg(call: ast.Call, kw: str, pos: int | None) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == kw:
            return k.value
    if pos is not None and len(call.args) > pos and not isinstance(call.args[pos], ast.Starred):
        return call.args[pos]
    return None


def _kwargs_dict(call: ast.Call) -> ast.AST | None:
    for k in call.keywords:
        if k.arg is None:
            return k.value
    return None


def _jsonable(v: Any) -> Any:
    if isinstance(v, float):
        if v == float("inf"):
            return "+Inf"
        if v.is_integer() and abs(v) < 1e15:
            # keep 1.0 as 1.0 (json writes it as 1.0)
            return v
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, _EnumMember):
        return _jsonable(v.value)
    if isinstance(v, (Symbol, _Opaque)):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


def find_definitions(
    tree: SourceTree,
    ev: Evaluator,
    prefix: str,
    candidate_files: list[str],
    labels_hook: Callable[[Module, ast.AST, Definition], None] | None = None,
) -> tuple[list[Definition], list[dict[str, Any]]]:
    defs: list[Definition] = []
    unresolved: list[dict[str, Any]] = []
    for path in candidate_files:
        mod = tree.module(path)
        for node in ast.walk(mod.tree):
            if not isinstance(node, ast.Call):
                continue
            fname = _callee_name(node.func)
            m = CTOR_RE.match(fname)
            style = "constructor"
            if m is None:
                m = METADATA_RE.search(fname)
                style = "metadata"
                if m is None:
                    continue
            kind = TYPE_BY_CTOR[m.group("kind").lower()]
            if style == "constructor":
                name_node = _arg(node, "name", 0)
                if name_node is None:
                    kw = _kwargs_dict(node)
                    if kw is None:
                        continue
                    # metric_cls(**kwargs): name taken from a kwargs dict
                    continue
            else:
                name_node = _metadata_key(mod, node)
                if name_node is None:
                    continue
            scope = Scope(module=mod, at=node)
            # one definition per loop/comprehension binding used by the call
            envs = _loop_environments(ev, mod, node, scope)
            names_seen: set[str] = set()
            for env in envs:
                scope = Scope(module=mod, at=node, bindings=env)
                try:
                    names = ev.values(name_node, scope)
                except Unresolved as exc:
                    text = ast.unparse(name_node)
                    if prefix.rstrip(":") in text or prefix in mod.lines[node.lineno - 1]:
                        unresolved.append(
                            {"file": path, "line": node.lineno, "expr": text, "reason": str(exc)}
                        )
                    continue
                for name in names:
                    if not isinstance(name, str) or not name.startswith(prefix):
                        continue
                    if name in names_seen and not env:
                        continue
                    names_seen.add(name)
                    d = _make_definition(ev, mod, node, scope, name, kind, style)
                    if labels_hook is not None:
                        labels_hook(mod, node, d)
                    defs.append(d)
    return defs, unresolved


def _metadata_key(mod: Module, call: ast.Call) -> ast.AST | None:
    child: ast.AST = call
    parent = mod.parent.get(call)
    while isinstance(parent, (ast.Tuple,)) and len(parent.elts) == 1:  # (X(...),)
        child, parent = parent, mod.parent.get(parent)
    if isinstance(parent, ast.Dict):
        for k, v in zip(parent.keys, parent.values, strict=False):
            if v is child:
                return k
    if isinstance(parent, ast.Assign):
        for t in parent.targets:
            if isinstance(t, ast.Subscript):
                return t.slice
    return None


def _loop_environments(
    ev: Evaluator, mod: Module, node: ast.AST, scope: Scope
) -> list[dict[str, Any]]:
    """Bindings for the loop/comprehension variables the call refers to."""
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
    loops: list[tuple[ast.AST, ast.AST]] = []  # (target, iter)
    child = node
    cur = mod.parent.get(node)
    while cur is not None and not isinstance(
        cur, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)
    ):
        if isinstance(cur, (ast.For, ast.AsyncFor)) and child is not cur.iter:
            loops.append((cur.target, cur.iter))
        elif isinstance(cur, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for g in cur.generators:
                if child is not g.iter:
                    loops.append((g.target, g.iter))
        child, cur = cur, mod.parent.get(cur)
    loops = [lp for lp in loops if any(_binds(lp[0], u) for u in used)]
    if not loops:
        return [{}]
    envs: list[dict[str, Any]] = [{}]
    for target, it in reversed(loops):  # outermost first
        new_envs = []
        for env in envs:
            try:
                seq = ev.value(it, Scope(module=mod, at=it, bindings=env))
            except Unresolved:
                return [{}]
            if not _iterable(seq):
                return [{}]
            for item in seq:
                b = dict(env)
                try:
                    bind_target(target, item, b)
                except Unresolved:
                    return [{}]
                new_envs.append(b)
        envs = new_envs
    return envs


def _try_value(ev: Evaluator, node: ast.AST | None, scope: Scope) -> tuple[Any, str | None, bool]:
    """(value, expression text, resolved?)"""
    if node is None:
        return None, None, True
    try:
        vals = ev.values(node, scope)
        if len(vals) == 1:
            return vals[0], ast.unparse(node), True
        return vals, ast.unparse(node), False
    except Unresolved:
        return None, ast.unparse(node), False


def _make_definition(
    ev: Evaluator, mod: Module, node: ast.Call, scope: Scope, name: str, kind: str, style: str
) -> Definition:
    notes: list[str] = []
    if style == "constructor":
        doc_node = _arg(node, "documentation", 1)
        labels_node = _arg(node, "labelnames", 2)
        buckets_node = _arg(node, "buckets", None)
        # prometheus_client full name: namespace_subsystem_name_unit
        for part in ("namespace", "subsystem"):
            n = _arg(node, part, None)
            if n is not None:
                val, _, ok = _try_value(ev, n, scope)
                if ok and val:
                    notes.append(f"{part}={val!r} prepended by prometheus_client")
    else:
        doc_node = _arg(node, "documentation", None)
        labels_node = _arg(node, "labelnames", None)
        buckets_node = _arg(node, "buckets", None)
    doc, _, doc_ok = _try_value(ev, doc_node, scope)
    if not doc_ok or not isinstance(doc, str):
        doc = None if doc_node is None else f"<unresolved: {ast.unparse(doc_node)}>"
    labels, labels_expr, labels_ok = _try_value(ev, labels_node, scope)
    if labels_node is None:
        labels_list: list[str] | None = []
    elif (
        labels_ok and isinstance(labels, (list, tuple)) and all(isinstance(x, str) for x in labels)
    ):
        labels_list = [str(x) for x in labels]
    elif labels_ok and isinstance(labels, ListOf):
        labels_list = None
        labels_expr = labels.description
    else:
        labels_list = None
    buckets: Any = None
    buckets_expr = None
    if kind == "histogram":
        if buckets_node is None:
            buckets = "prometheus_client default"
            notes.append("default buckets: " + json.dumps(PROMETHEUS_DEFAULT_BUCKETS))
        else:
            val, buckets_expr, ok = _try_value(ev, buckets_node, scope)
            if ok and isinstance(val, BucketSpec):
                buckets = val.description
            elif (
                ok
                and isinstance(val, (list, tuple))
                and all(isinstance(x, (int, float)) for x in val)
            ):
                buckets = _jsonable(list(val))
            elif ok and val is None and style == "metadata":
                buckets = "prometheus_client default"
                notes.append("default buckets: " + json.dumps(PROMETHEUS_DEFAULT_BUCKETS))
            else:
                buckets = f"runtime: {buckets_expr}"
    mp_node = _arg(node, "multiprocess_mode", None)
    mp_val, _, mp_ok = _try_value(ev, mp_node, scope)
    return Definition(
        declared_name=name,
        type=kind,
        file=mod.path,
        line=node.lineno,
        qualname=_qualname(mod, node),
        labels=labels_list,
        labels_expr=None if labels_list is not None else labels_expr,
        buckets=buckets,
        buckets_expr=ast.unparse(buckets_node)
        if (buckets_node is not None and not isinstance(buckets_node, (ast.List, ast.Tuple)))
        else None,
        documentation=doc,
        conditions=_conditions(mod, node),
        comment=mod.comment_above(node),
        multiprocess_mode=mp_val if mp_ok and isinstance(mp_val, str) else None,
        notes=notes,
        style=style,
    )


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def exposed_names(declared: str, kind: str) -> tuple[str, str, list[str]]:
    """(family name, main exposed sample name, all sample names)."""
    if kind == "counter":
        family = declared[:-6] if declared.endswith("_total") else declared
        return family, family + "_total", [family + "_total", family + "_created"]
    if kind == "histogram":
        return declared, declared, [declared + s for s in ("_bucket", "_count", "_sum", "_created")]
    if kind == "summary":
        return declared, declared, [declared + s for s in ("_count", "_sum", "_created")]
    if kind == "info":
        family = declared[:-5] if declared.endswith("_info") else declared
        return family, family + "_info", [family + "_info"]
    return declared, declared, [declared]


def build_reference(
    defs: list[Definition],
    header: dict[str, Any],
    unresolved: list[dict[str, Any]],
    is_hidden: Callable[[Definition], str | None],
    primary_rank: Callable[[Definition], int],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    by_name: dict[str, list[Definition]] = {}
    for d in defs:
        _, exposed, _ = exposed_names(d.declared_name, d.type)
        by_name.setdefault(exposed, []).append(d)
    families: dict[str, Any] = {}
    for exposed in sorted(by_name):
        ds = sorted(by_name[exposed], key=lambda d: (primary_rank(d), d.file, d.line))
        # identical definitions reached through several loop bindings: keep one
        uniq: list[Definition] = []
        for d in ds:
            if not any(
                (u.file, u.line, u.type, u.labels, u.buckets)
                == (d.file, d.line, d.type, d.labels, d.buckets)
                for u in uniq
            ):
                uniq.append(d)
        p = uniq[0]
        family, _, samples = exposed_names(p.declared_name, p.type)
        entry: dict[str, Any] = {
            "name": exposed,
            "declared_name": p.declared_name,
            "family": family,
            "type": p.type,
            "samples": samples,
            "labels": p.labels,
        }
        if p.labels is None:
            entry["labels_expr"] = p.labels_expr
        if p.type == "histogram":
            entry["buckets"] = p.buckets
            if p.buckets_expr:
                entry["buckets_expr"] = p.buckets_expr
        entry["documentation"] = p.documentation
        hidden = is_hidden(p)
        entry["hidden"] = hidden is not None
        if hidden:
            entry["hidden_condition"] = hidden
        doc = (p.documentation or "") + " " + (p.comment or "")
        entry["deprecated"] = bool(hidden) or bool(re.search(r"deprecat", doc, re.I))
        entry["conditions"] = p.conditions
        if p.comment:
            entry["source_comment"] = p.comment
        if p.multiprocess_mode:
            entry["multiprocess_mode"] = p.multiprocess_mode
        if p.notes:
            entry["notes"] = p.notes
        entry["source"] = f"{p.file}:{p.line}"
        entry["defined_in"] = p.qualname
        others = []
        for d in uniq[1:]:
            o: dict[str, Any] = {
                "source": f"{d.file}:{d.line}",
                "defined_in": d.qualname,
                "type": d.type,
                "labels": d.labels,
            }
            if d.type == "histogram":
                o["buckets"] = d.buckets
            if d.conditions:
                o["conditions"] = d.conditions
            if d.declared_name != p.declared_name:
                o["declared_name"] = d.declared_name
            others.append(o)
        if others:
            entry["other_definitions"] = others
        families[exposed] = entry
    out = dict(header)
    out["family_count"] = len(families)
    if extra:
        out.update(extra)
    out["families"] = families
    out["unresolved"] = sorted(unresolved, key=lambda u: (u["file"], u["line"], u["expr"]))
    return out


def write_json(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


_METRICISH = re.compile(r"(Counter|Gauge|Histogram)Metadata\(|\b_?(gauge|counter|histogram)_cls\(")


def candidate_files(tree: SourceTree, prefix: str, always: Iterable[str] = ()) -> list[str]:
    """Files whose text mentions the prefix (as a string literal start)."""
    bare = prefix.rstrip(":")
    pat = re.compile(
        r"""(["'])"""
        + re.escape(prefix)
        + r"""|f["'][^"'\n]*"""
        + re.escape(prefix)
        + r"""|["']"""
        + re.escape(bare)
        + r"""["']"""
    )
    out = set(always)
    for path in tree.files:
        if path in out:
            continue
        try:
            text = tree.text(path)
        except InputError:
            continue
        if (prefix in text and pat.search(text)) or _METRICISH.search(text):
            out.add(path)
    return sorted(out)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pip_download(package: str, version: str, dest: str) -> str:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"{package}=={version}",
        "-d",
        dest,
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as exc:
        raise InputError(f"pip download {package}=={version}: {exc}") from None
    if proc.returncode != 0:
        lines = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.startswith("ERROR")]
        why = lines[0] if lines else f"pip exited {proc.returncode}"
        if "from versions:" in why:
            why = why.split(" (from versions:")[0]
        raise InputError(f"pip download {package}=={version} failed: {why}")
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise InputError(f"pip download {package}=={version}: expected one wheel, found {wheels}")
    return os.path.join(dest, wheels[0])


def parse_args(argv: list[str] | None, server: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=f"Write tests/data/{server}-VERSION.json: the {server} Prometheus metric "
        f"families read from the wheel's source with ast."
    )
    p.add_argument("version", help=f"{server} version, e.g. 0.33.0")
    p.add_argument("--wheel", help="use this wheel instead of `pip download`")
    p.add_argument("--out", help=f"output path (default tests/data/{server}-VERSION.json)")
    p.add_argument("--stdout", action="store_true", help="print the JSON instead of writing it")
    return p.parse_args(argv)


def run(
    argv: list[str] | None, server: str, build: Callable[[SourceTree, str, str], dict[str, Any]]
) -> int:
    args = parse_args(argv, server)
    tmpdir = None
    try:
        try:
            if args.wheel:
                wheel = args.wheel
                if not os.path.isfile(wheel):
                    raise InputError(f"{wheel}: no such file")
            else:
                tmpdir = tempfile.mkdtemp(prefix=f"{server}-wheel-")
                wheel = pip_download(server, args.version, tmpdir)
            tree = SourceTree(wheel, server)
            data = build(tree, args.version, os.path.basename(wheel))
        except InputError as exc:
            print(f"{server}-metrics-reference: {exc}", file=sys.stderr)
            return 2
        except RecursionError:
            print(
                f"{server}-metrics-reference: {args.wheel or server}: "
                "source too deeply nested to read",
                file=sys.stderr,
            )
            return 2
        if args.stdout:
            text = json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            try:
                sys.stdout.write(text)
                sys.stdout.flush()
            except BrokenPipeError:
                # e.g. piped into `head`; do not print a traceback
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0
        out = args.out or os.path.join(
            repo_root(), "tests", "data", f"{server}-{args.version}.json"
        )
        write_json(out, data)
        print(f"{out}: {data['family_count']} families", file=sys.stderr)
        return 0
    finally:
        if tmpdir:
            shutil.rmtree(tmpdir, ignore_errors=True)
