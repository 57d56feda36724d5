"""Errors a user can fix: each renders as one line, and the CLI exits with status 2.

The files users hand us (playbooks, scenarios, the site config, a model's config.json, a
token) are read here, through one bounded reader (``read_bytes``): what is not a regular file
(a FIFO would block the read forever, ``/dev/zero`` would fill the memory) or is larger than
any such file can be is refused before a byte is read, and what is not text, not YAML or JSON,
nested absurdly deep, blown up through YAML aliases or holding a whole number no setting can
take (a YAML integer of hundreds of digits) is refused in one line naming the file and the
field, before any code walks it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from diagnoser.plumbing.printable import printable

# Deeper than any playbook, scenario or config.json (they nest a handful of levels); far
# shallower than the recursion of the code that walks them.
MAX_DEPTH = 64
# Values a document may expand to through YAML aliases (a "billion laughs" file is refused).
MAX_VALUES = 1_000_000
# The largest playbook or scenario is about 6 KiB, and PyYAML reads some 20 KiB a second at
# worst on a busy machine: a file a hundred times the largest is still read in a minute.
MAX_YAML_BYTES = 1 << 20
# A model's config.json is a few KiB; a CA bundle (the system's) a few hundred.
MAX_FILE_BYTES = 4 << 20
# Whole numbers beyond int64: no count, size or threshold of any file is that large, and
# turning one into a float overflows (or, past 4,300 digits, Python refuses to read it).
MAX_WHOLE_BITS = 63


class UserError(Exception):
    """Bad input (a playbook, a config, a scenario): ``str()`` is one line to show."""


class FileFieldError(UserError):
    """A problem located in a file and, where known, a field of it."""

    def __init__(self, path: object, where: str, message: str):
        self.path, self.where, self.message = str(path), where, message
        shown = printable(self.path)  # one line, whatever the path holds
        super().__init__(f"{shown}: {where}: {message}" if where else f"{shown}: {message}")


ErrorFactory = Callable[[Path, str, str], UserError]


_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def read_bytes(path: Path, error: ErrorFactory, most: int = MAX_FILE_BYTES) -> bytes:
    """A regular file's bytes, at most ``most`` of them. A FIFO, a device, a directory, a file
    larger than ``most`` or one that cannot be opened raises ``error``. The file is opened
    without blocking (opening a FIFO no one writes to would wait forever) and checked on the
    descriptor it is read from, so it cannot be swapped for another between check and read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(path, "", f"cannot read: {exc.strerror or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a file")
            raise error(path, "", f"is {kind}, not a regular file")
        chunks, left = [], most + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise error(path, "", f"cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > most:
        raise error(path, "", f"larger than {_size(most)}; is it the right file?")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


def read_text(path: Path, error: ErrorFactory, most: int = MAX_FILE_BYTES) -> str:
    """A regular file's text (see ``read_bytes``); not UTF-8 (a binary file) raises ``error``."""
    data = read_bytes(path, error, most)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(path, "", f"not UTF-8 text (byte {exc.start}); is it a binary file?") from None


def whole_number_problem(data: Any) -> tuple[str, str] | None:
    """Where a parsed document holds a whole number beyond int64, and what it is, or None.
    Keys count too (YAML allows a number as a key). Each distinct node is walked once."""
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, where = stack.pop()
        if isinstance(node, int) and not isinstance(node, bool):
            if node.bit_length() > MAX_WHOLE_BITS:
                digits = int(node.bit_length() * 0.30103) + 1
                return where or "(top level)", (
                    f"a whole number of about {digits} digits; no setting here goes beyond "
                    f"2^{MAX_WHOLE_BITS}"
                )
            continue
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, list):
            stack += [(v, f"{where}[{i}]") for i, v in enumerate(node)]
            continue
        for key, value in node.items():
            if isinstance(key, int) and not isinstance(key, bool):
                stack.append((key, where or "(top level)"))
            stack.append((value, f"{where}.{key}" if where else str(key)))
    return None


def nesting_problem(data: Any) -> str | None:
    """Why a parsed document cannot be used, or None: nested deeper than ``MAX_DEPTH``,
    holding itself (a YAML alias to its own ancestor), or expanding through aliases to more
    than ``MAX_VALUES`` values. Walks each distinct node once, without recursion."""
    if not isinstance(data, (dict, list)):
        return None  # a scalar: nothing nested
    done: dict[int, tuple[int, int]] = {}  # id -> (depth, values it expands to)
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(data, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        kids = [
            v
            for v in (node.values() if isinstance(node, dict) else node)
            if isinstance(v, (dict, list))
        ]
        if not children_done:
            if key in done:
                continue
            open_.add(key)
            stack.append((node, True))
            for kid in kids:
                if id(kid) in open_:
                    return "holds itself (a YAML alias refers to its own ancestor)"
                if id(kid) not in done:
                    stack.append((kid, False))
            if len(open_) > MAX_DEPTH:
                return f"nested deeper than {MAX_DEPTH} levels"
            continue
        open_.discard(key)
        depth = 1 + max((done[id(k)][0] for k in kids), default=0)
        values = 1 + len(node) + sum(done[id(k)][1] for k in kids)
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if values > MAX_VALUES:
            return f"expands to more than {MAX_VALUES:,} values (through YAML aliases)"
        done[key] = (depth, values)
    return None


def load_yaml(path: Path, error: ErrorFactory) -> Any:
    """A YAML file's data; unreadable, malformed or absurdly nested files raise ``error``."""
    text = read_text(path, error, MAX_YAML_BYTES)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(path, where, f"not valid YAML: {problem}") from None
    except RecursionError:
        raise error(path, "", f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError:  # Python refuses to read integers of thousands of digits
        raise error(path, "", "holds a number of thousands of digits") from None
    problem = nesting_problem(data)
    if problem is not None:
        raise error(path, "", problem)
    number = whole_number_problem(data)
    if number is not None:
        raise error(path, *number)
    return data


def read_yaml_mapping(path: Path, error: ErrorFactory, what: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping; unreadable or malformed files raise ``error``."""
    data = load_yaml(path, error)
    if not isinstance(data, dict):
        raise error(path, "", f"{what} must be a YAML mapping")
    return data
