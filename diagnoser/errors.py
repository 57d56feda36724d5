"""Errors a user can fix: each renders as one line, and the CLI exits with status 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class UserError(Exception):
    """Bad input (a playbook, a config, a scenario): ``str()`` is one line to show."""


class FileFieldError(UserError):
    """A problem located in a file and, where known, a field of it."""

    def __init__(self, path: object, where: str, message: str):
        self.path, self.where, self.message = str(path), where, message
        super().__init__(f"{self.path}: {where}: {message}" if where else f"{self.path}: {message}")


def read_yaml_mapping(path: Path, error: type[FileFieldError], what: str) -> dict[str, Any]:
    """A YAML file that must hold a mapping; unreadable or malformed files raise ``error``."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise error(path, "", f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise error(path, where, f"not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise error(path, "", f"{what} must be a YAML mapping")
    return data
