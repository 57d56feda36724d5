"""Files servediag writes (``diagnose --output``, ``simulate --out``, what ``generate`` writes
under ``--out``): whole or not at all, and never through a link.

Each file is written to a temporary file of its own in the same directory (created anew, so a
link planted at a guessable name is not followed), flushed to disk, and renamed over the
target: a failure midway (a full disk, an interrupt) leaves the old file as it was, never a
truncated one, and the rename replaces the name itself, never the file a symbolic link there
points to. A target that is a symbolic link, a directory, a FIFO or a device is refused before
anything is written. ``Staged`` writes several files this way and replaces them only once all
are written (and whatever the caller checks in them holds).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import TextIO

_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def refusal(path: Path) -> str | None:
    """Why ``path`` may not be replaced by a file servediag writes, or None: it is there and
    is not a regular file (a symbolic link is refused, not followed)."""
    try:
        mode = os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None  # not there: writing it says what is wrong with the directory
    except OSError as exc:
        return f"cannot be checked: {exc.strerror or exc}"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"is {kind}; servediag writes only regular files (remove it, or name another)"


class Refused(OSError):
    """A target that is not a regular file; ``str()`` says what it is."""


def _mode(path: Path) -> int:
    """The permissions the written file gets: the old file's, or what the umask allows."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


class Staged:
    """Files written next to their targets, replacing them only at ``commit``. Use as a
    context manager: what was not committed is removed at exit."""

    def __init__(self) -> None:
        self.temps: dict[Path, Path] = {}

    def _create(self, path: Path) -> int:
        why = refusal(path)
        if why is not None:
            raise Refused(f"{path} {why}")
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
        self.temps[path] = Path(name)
        os.fchmod(fd, _mode(path))
        return fd

    def open_text(self, path: Path) -> TextIO:
        """A new temporary file beside ``path``, open for writing UTF-8 text; ``Refused`` if
        ``path`` is there and is no regular file."""
        return os.fdopen(self._create(path), "w", encoding="utf-8")

    def write(self, path: Path, data: bytes) -> Path:
        """Write ``data`` to a new temporary file beside ``path`` and flush it to disk; its
        path is returned, for the caller to check what was written."""
        with os.fdopen(self._create(path), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        return self.temps[path]

    def commit(self) -> None:
        """Rename every temporary file over its target."""
        for path, temp in list(self.temps.items()):
            why = refusal(path)  # a link or a directory put there since
            if why is not None:
                raise Refused(f"{path} {why}")
            os.replace(temp, path)
            del self.temps[path]

    def discard(self) -> None:
        for temp in self.temps.values():
            with contextlib.suppress(OSError):
                temp.unlink()
        self.temps.clear()

    def __enter__(self) -> Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, whole or not at all (see the module's docstring)."""
    with Staged() as staged:
        staged.write(path, data)
        staged.commit()
