"""Secrets blanked out of what a server says, in whatever encoding it says them in.

A server's error page may echo the request, and it rarely echoes it as it was sent: a token
in a query string comes back URL-encoded (``%2F``, ``+`` for a space, ``%252F`` once more
encoded), a JSON error escapes it (``\\/``, ``\\u002f``), an HTML page escapes it (``&#47;``,
``&sol;``, ``&amp;``), and a proxy's 407 page shows the ``Proxy-Authorization`` header it got,
base64 and all. ``Redactor`` matches each secret written in any mix of those encodings, one
character at a time (a page may escape some characters and not others), and its base64 forms:
the whole secret's, and the part of it that shows inside a longer base64 text at each of the
three alignments a secret can have there (a header such as ``Basic <base64 of user:pass>``).

Secrets shorter than ``MIN_SECRET`` characters are not blanked out: they would blank out
ordinary words, and servediag's own messages never contain a credential.
"""

from __future__ import annotations

import base64
import functools
import html.entities
import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

MIN_SECRET = 4
MASK = "***"
# The shortest run of base64 characters taken for a secret's: four characters are 24 bits.
MIN_BASE64 = 4

_NAMED_JSON = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n"}
_NAMED_JSON |= {"\r": "\\r", "\t": "\\t"}


def _entities() -> dict[str, list[str]]:
    """Each character's named HTML references (``&amp;``, ``&sol;``, legacy ``&amp``)."""
    out: dict[str, list[str]] = {}
    for name, text in html.entities.html5.items():
        if len(text) == 1:
            out.setdefault(text, []).append("&" + name)
    # The longest first: the first alternative that matches is taken, and ``&gt`` would
    # leave the ``;`` of ``&gt;`` behind.
    return {c: sorted(names, key=len, reverse=True) for c, names in out.items()}


_ENTITIES = _entities()


def _hex(value: int, width: int) -> str:
    """``value`` in hexadecimal, ``width`` digits, each matching either case."""
    digits = f"{value:0{width}x}"
    return "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in digits)


def _char(c: str) -> tuple[str, int]:
    """A pattern for one character in any of the encodings above, and the length of its
    longest match."""
    raw = c.encode("utf-8")
    forms = [(re.escape(c), 1)]
    # URL-encoded, once or twice.
    forms.append(("".join(f"%(?:25)?{_hex(b, 2)}" for b in raw), 5 * len(raw)))
    if c == " ":
        forms.append((r"\+", 1))
    code = ord(c)
    if code > 0xFFFF:  # JSON writes it as a surrogate pair
        high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
        forms.append((rf"\\u{_hex(high, 4)}\\u{_hex(low, 4)}", 12))
    else:
        forms.append((rf"\\u{_hex(code, 4)}", 6))
    if c in _NAMED_JSON:
        forms.append((re.escape(_NAMED_JSON[c]), 2))
    # Numeric character references, with a few leading zeros and the optional semicolon.
    forms.append((rf"&#0{{0,4}}{code};?", 8 + len(str(code))))
    forms.append((rf"&#[xX]0{{0,4}}{_hex(code, 1)};?", 9 + len(f"{code:x}")))
    forms += [(re.escape(e), len(e)) for e in _ENTITIES.get(c, [])]
    return "(?:" + "|".join(f for f, _ in forms) + ")", max(n for _, n in forms)


def _spelled(text: str) -> tuple[str, int]:
    """A pattern for ``text`` with each character in any encoding, and its longest match."""
    chars = [_char(c) for c in text]
    return "".join(p for p, _ in chars), sum(n for _, n in chars)


def _base64_forms(secret: str) -> list[tuple[str, int]]:
    """The secret's base64, standard and URL-safe: whole, and the characters that stand for
    it alone inside a longer base64 text, at each alignment (with the one character on each
    side that holds a few of its bits, whatever its neighbours), each with its longest
    match."""
    raw = secret.encode("utf-8")
    out = []
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode().rstrip("=")
        first = -(-8 * shift // 6)  # the first character made of the secret's bits only
        last = 8 * (shift + len(raw)) // 6  # one past the last such character
        core = encoded[first:last]
        if len(core) < MIN_BASE64:
            continue
        for alphabet, edge in (("+/", "[A-Za-z0-9+/]"), ("-_", "[A-Za-z0-9_-]")):
            pattern, longest = _spelled(core.translate(str.maketrans("+/", alphabet)))
            padding = r"(?:=|%3[dD]|\\u003[dD]|&#61;)"
            out.append((f"{edge}?{pattern}{edge}?{padding}{{0,2}}", longest + 2 + 2 * 6))
    return out


class Redactor:
    """Blanks out every form of the given secrets (each at least ``MIN_SECRET`` long)."""

    def __init__(self, secrets: Iterable[str]):
        kept = sorted({s for s in secrets if len(s) >= MIN_SECRET}, key=len, reverse=True)
        self.secrets = tuple(kept)
        forms = [_spelled(s) for s in kept] + [f for s in kept for f in _base64_forms(s)]
        self._pattern = re.compile("|".join(p for p, _ in forms)) if forms else None
        # The longest text that one form of a secret can take.
        self.longest = max((n for _, n in forms), default=0)

    def __bool__(self) -> bool:
        return self._pattern is not None

    def clean(self, text: str) -> str:
        """``text`` with every form of every secret replaced by ``***``."""
        if self._pattern is None:
            return text
        return self._pattern.sub(MASK, text)

    def head(self, text: str, most: int) -> str:
        """At most the first ``most`` characters of ``text``, cleaned. Where ``text`` is
        longer, a secret may straddle the cut, and its first part matches no secret's form:
        so ``longest`` characters more are cleaned, and then left off."""
        if len(text) <= most:
            return self.clean(text)
        out = self.clean(text[: most + self.longest])
        return out[: max(0, len(out) - self.longest)]


@functools.lru_cache(maxsize=64)
def redactor(secrets: tuple[str, ...]) -> Redactor:
    """A ``Redactor`` for these secrets, compiled once (the same ones come back each time)."""
    return Redactor(secrets)


def userinfo_secrets(url: str) -> list[str]:
    """The secrets in a URL's ``user:password@``: the password (as written and decoded),
    ``user:password`` and its base64 (what a ``Basic`` header carries)."""
    try:
        parts = urlsplit(url if "://" in url else f"http://{url}")
    except ValueError:
        return []
    if parts.password is None:
        return []
    user, password = unquote(parts.username or ""), unquote(parts.password)
    pair = f"{user}:{password}"
    return [password, parts.password, pair, base64.b64encode(pair.encode()).decode()]
