"""Values from outside (Prometheus labels, Alertmanager alerts) made safe to print.

A label value is whatever an exporter or a relabelling put there: an escape sequence in it
(``\\x1b]0;...\\x07`` sets a terminal's title, others rewrite the screen or the clipboard), a
line break that forges a line of the report, or a bidirectional override that shows text in
another order than it is. Every text and Markdown report passes such values through
``printable``, which writes each of those characters as a visible escape (``\\x1b``,
``\\n``, ``\\u202e``); JSON keeps the values as they are, encoded by ``json``.
"""

from __future__ import annotations

# C0 controls, DEL and C1 controls; line and paragraph separators; the bidirectional marks,
# embeddings, overrides and isolates.
_UNSAFE = [
    *range(0x00, 0x20),
    *range(0x7F, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x2028, 0x202F),
    *range(0x2066, 0x206A),
]
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}
_TABLE = {c: _NAMED.get(c, f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}


def printable(value: str) -> str:
    """``value`` with every control, line-separator and bidirectional character written as a
    visible escape, so that printing it can change nothing but the characters shown."""
    return value.translate(_TABLE)
