"""Prompts of a known length in tokens, for the probe's prompt length classes.

Two ways to count, and the probe says which one it used:

- **the served model's tokenizer** (``--tokenizer tokenizer.json``, read with the optional
  ``tokenizers`` package): the prompt is cut to exactly N tokens of that tokenizer;
- **the approximation**: the prompt is N words drawn from :data:`WORDS`, common English words
  that are each one token, with a leading space, in the vocabularies this was checked on
  (GPT-4's cl100k, Mistral's SentencePiece v1 and v3, Tekken): N words are N tokens there.
  Other vocabularies may split a few of them. A server's chat template adds its own few
  tokens on top, which the server's ``usage.prompt_tokens`` shows.

Every request gets freshly drawn words, so no two prompts share a prefix: the server's prefix
cache cannot serve a probe's prompt from an earlier one, and TTFT measures a real prefill.
The simulator counts prompt tokens with :func:`approx_tokens`, which gives N for these
prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from diagnoser.metrics.buckets import class_size, prompt_bucket_label
from diagnoser.metrics.tokens import WORDS
from diagnoser.plumbing.errors import UserError, read_text

APPROXIMATION = "approximation"
TOKENIZER = "tokenizer"
# The tokenizer.json of the largest vocabularies (256k tokens) is some 35 MiB.
MAX_TOKENIZER_BYTES = 64 << 20


def parse_classes(text: str) -> list[int]:
    """``128,1k,4k,16k`` -> [128, 1024, 4096, 16384] (``k`` is 1024; sorted, no repeats)."""
    out: list[int] = []
    for part in text.split(","):
        size = class_size(part) if part.strip() else None
        if size is None or size != int(size) or size < 1:
            raise UserError(
                f"--classes: {part.strip()!r} is not a prompt length like 128, 1k or 16k"
            )
        if size > 1024 * 1024:
            raise UserError(f"--classes: {part.strip()} is longer than 1m tokens")
        out.append(int(size))
    if len(set(prompt_bucket_label(n) for n in out)) != len(out):
        raise UserError("--classes: a prompt length is given twice")
    return sorted(out)


class TokenCounter(Protocol):
    """Builds a prompt of ``tokens`` tokens; ``source`` says how tokens were counted."""

    source: str
    description: str

    def prompt(self, tokens: int, rng: random.Random) -> tuple[str, int]:
        """A fresh prompt and its length in tokens by this counter."""
        ...


@dataclass
class Approximation:
    source: str = APPROXIMATION
    description: str = (
        "approximation: one common English word per token "
        "(exact on the cl100k, Mistral SentencePiece and Tekken vocabularies)"
    )

    def prompt(self, tokens: int, rng: random.Random) -> tuple[str, int]:
        return " ".join(rng.choices(WORDS, k=tokens)), tokens


ATTEMPTS = 8  # word draws tried for an exact length


class TokenizerJson:
    """A Hugging Face ``tokenizer.json``, read with the ``tokenizers`` package."""

    source = TOKENIZER

    def __init__(self, tokenizer: Any, path: Path):
        self.tok = tokenizer
        self.description = f"tokenizer: {path}"

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def prompt(self, tokens: int, rng: random.Random) -> tuple[str, int]:
        """A prompt of exactly ``tokens`` tokens if one of a few draws allows it, else the
        nearest found (and its true count, which the probe reports)."""
        best = ("", -1)
        for _ in range(ATTEMPTS):
            words = list(rng.choices(WORDS, k=tokens + 8))
            ids: list[int] = self.tok.encode(" ".join(words), add_special_tokens=False).ids
            while len(ids) < tokens + 8:  # a tokenizer that merges words: draw more
                words += rng.choices(WORDS, k=tokens + 8 - len(ids))
                ids = self.tok.encode(" ".join(words), add_special_tokens=False).ids
            # Decoding a cut can end in part of a word that encodes differently: take the cut
            # nearest ``tokens`` whose text has exactly ``tokens`` tokens.
            for delta in (0, -1, 1, -2, 2, -3, 3, -4, 4):
                text = str(self.tok.decode(ids[: tokens + delta]))
                counted = self.count(text)
                if counted == tokens:
                    return text, counted
                if abs(counted - tokens) < abs(best[1] - tokens):
                    best = (text, counted)
        return best


def load_counter(path: Path | None) -> tuple[TokenCounter, str | None]:
    """The counter for ``--tokenizer PATH`` (or the approximation), and a warning if any.

    Without the ``tokenizers`` package the approximation is used and the warning says so; a
    file that cannot be read as a tokenizer is the user's error.
    """
    if path is None:
        return Approximation(), None
    if not path.exists():
        raise UserError(f"--tokenizer {path}: no such file")

    def error(p: Path, where: str, message: str) -> UserError:
        return UserError(f"--tokenizer {p}: {message}")

    # Through the bounded reader: a FIFO or /dev/zero is refused, not read without end.
    text = read_text(path, error, MAX_TOKENIZER_BYTES)
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return Approximation(), (
            f"the 'tokenizers' package is not installed, so {path} is not used: prompt lengths "
            "are approximate (pip install tokenizers)"
        )
    try:
        tok = Tokenizer.from_str(text)
    except Exception as exc:  # the Rust library raises its own exception types
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"--tokenizer {path}: not a tokenizer.json ({first})") from None
    return TokenizerJson(tok, path), None
