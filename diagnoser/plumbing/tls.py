"""The CA bundle a user names (``--ca-file``), checked before anything connects.

OpenSSL reads the file itself when a TLS context is made, at the first request: a file that is
not a PEM bundle then ends in ``ssl.SSLError`` deep inside a query, a missing one in
``FileNotFoundError``, and a FIFO or ``/dev/zero`` blocks or fills the memory. Here the file is
read once through the bounded reader (a regular file, at most ``MAX_FILE_BYTES``) and loaded
into a context; what fails is one line naming the option and the file (exit status 2).
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

from diagnoser.plumbing.errors import UserError, read_bytes
from diagnoser.plumbing.http import tls_context


def check_ca_file(path: str, option: str = "--ca-file") -> None:
    """Refuse ``path`` with ``UserError`` unless it is a readable PEM bundle of certificates."""

    def error(p: Path, where: str, message: str) -> UserError:
        unreadable = message.removeprefix("cannot read: ")
        if unreadable != message:
            return UserError(f"cannot read {option} {p}: {unreadable}")
        return UserError(f"{option} {p}: {message}")

    data = read_bytes(Path(path), error)
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise UserError(f"{option} {path}: not a PEM bundle (it holds binary data)") from None
    if "CERTIFICATE-----" not in text:
        raise UserError(f"{option} {path}: not a PEM bundle (no BEGIN CERTIFICATE line)")
    try:
        tls_context(path)  # what each connection uses, made once
    except ssl.SSLError as exc:
        why = re.sub(r"\s*\(_ssl\.c:\d+\)", "", exc.reason or str(exc))
        raise UserError(f"{option} {path}: not a PEM bundle of CA certificates ({why})") from None
    except OSError as exc:
        raise UserError(f"cannot read {option} {path}: {exc.strerror or exc}") from None
