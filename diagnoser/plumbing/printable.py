"""Values from outside (Prometheus labels and answers, Alertmanager alerts, a probed server)
made safe to print.

A label value is whatever an exporter or a relabelling put there: an escape sequence in it
(``\\x1b]0;...\\x07`` sets a terminal's title, others rewrite the screen or the clipboard), a
line break that forges a line of the report, or a bidirectional override that shows text in
another order than it is. Two guards, both used by every text and Markdown output:

- ``printable(value)`` writes each of those characters in one value as a visible escape
  (``\\x1b``, ``\\n``, ``\\u202e``): applied to every label value where it is placed;
- ``inert(text)`` does the same to a whole rendered report except its line breaks and tabs
  (and, when ``sgr``, the colour codes a report adds itself), so a value that reaches the
  output by a path that forgot ``printable`` still cannot drive the terminal.

JSON keeps the values as they are, encoded by ``json``; HTML escapes them and runs ``inert``.

A third guard is for text a renderer reads as markup, Markdown and chat messages (Mattermost
and Rocket.Chat render Markdown, mentions and bare URLs): ``defang(value)`` keeps a value from
notifying a channel (``@channel``, ``@all``, ``@here``, ``@someone``), making a Markdown link or
image (``[text](url)``) or becoming a link by itself (``https://...``, ``www.``), by putting an
invisible word joiner where each would be recognised. What the reader sees does not change.
"""

from __future__ import annotations

import re

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
_LAYOUT = {c: e for c, e in _TABLE.items() if c not in (0x09, 0x0A)}
# Select Graphic Rendition (colour, bold, reset): all a report's own escapes ever are.
_SGR = re.compile(r"\x1b\[[0-9;]{0,16}m")


def printable(value: str) -> str:
    """``value`` with every control, line-separator and bidirectional character written as a
    visible escape, so that printing it can change nothing but the characters shown."""
    return value.translate(_TABLE)


def inert(text: str, sgr: bool = False) -> str:
    """A rendered text with every control, line-separator and bidirectional character but its
    line breaks and tabs written as a visible escape; with ``sgr``, colour codes are kept."""
    if not sgr:
        return text.translate(_LAYOUT)
    out, last = [], 0
    for m in _SGR.finditer(text):
        out += [text[last : m.start()].translate(_LAYOUT), m.group()]
        last = m.end()
    out.append(text[last:].translate(_LAYOUT))
    return "".join(out)


# WORD JOINER: no width, no break; between "@" and a name, "]" and "(", ":" and "//", a
# renderer no longer sees a mention, a link or a URL, and the reader sees the same text.
JOINER = "\u2060"
_MARKUP = re.compile(r"@|\]\(|:(?=//)|(?i:\bwww)(?=\.)")


def defang(value: str) -> str:
    """``value`` unable to mention anyone, make a Markdown link or image, or autolink, once
    rendered as Markdown or a chat message (see the module's docstring)."""
    return _MARKUP.sub(lambda m: m.group()[0] + JOINER + m.group()[1:], value)
