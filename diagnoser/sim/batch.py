"""The decoding sequences of one engine, as arrays: the hot path of the simulator is
vectorised over them."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

CHAT = "/v1/chat/completions"


@dataclass
class Request:
    rid: int
    arrival: float  # at the API server
    prompt: int
    target_out: int  # tokens it will generate before stopping
    max_tokens: int
    length_stop: bool  # stops because target_out == max_tokens
    ready: float = 0.0  # tokenized, handed to the engine
    scheduled: float = -1.0
    first_token: float = -1.0
    last_token: float = -1.0
    generated: int = 0
    prefilled: int = 0  # tokens computed so far (this admission)
    to_prefill: int = 0  # tokens this admission must compute
    cached: int = 0  # tokens found in the prefix cache (this admission)
    first_cached: int = 0  # prefix-cache hits at the first admission (vLLM's PrefillStats)
    shared: float = 0.0  # share of the prompt that repeats other requests' prefix
    accept: float = 0.0  # speculative decoding: chance each draft token is accepted
    preemptions: int = 0
    unreported_preemptions: int = 0  # preempted since its latest output
    # At its latest preemption: blocks the others held, free blocks not its own.
    preempted_used: int = 0
    preempted_free: int = 0
    probe: str | None = None  # prompt bucket, for synthetic probe requests
    handler: str = CHAT  # the API route it arrived on
    adapter: int = -1  # the LoRA adapter it names (-1: the base model)
    deferred: bool = False  # skipped by the scheduler for its adapter, not scheduled since
    # A KV consumer's request: when the transfer of its prompt's KV began (it is ready once
    # the KV has arrived), the bytes moved, whether the transfer failed, and the prompt
    # tokens whose KV it brought (from the first admission).
    fetch_start: float = -1.0
    fetch_bytes: float = 0.0
    kv_failed: bool = False
    external: int = 0
    outcome: str = ""  # "finished", "aborted" (a crash) or "error" (its KV load failed)


class Batch:
    """The decoding sequences, in admission order, as arrays (the hot path is vectorised)."""

    def __init__(self) -> None:
        self.reqs: list[Request] = []
        self.prompt = np.zeros(0, dtype=np.int64)
        self.generated = np.zeros(0, dtype=np.int64)
        self.target = np.zeros(0, dtype=np.int64)
        self.last = np.zeros(0, dtype=np.float64)  # time of each sequence's latest token
        self.accept = np.zeros(0, dtype=np.float64)
        self._context = 0  # tokens held by the batch, kept up to date (a hot path)
        # The fewest tokens any sequence has left to generate, while known (None: recount).
        self._min_left: int | None = None

    def __len__(self) -> int:
        return len(self.reqs)

    def add(self, req: Request) -> None:
        self.add_all([req])

    def add_all(self, reqs: list[Request]) -> None:
        """Append ``reqs`` in order (one concatenation per array, however many they are)."""
        if not reqs:
            return
        least = min(r.target_out - r.generated for r in reqs)
        if not self.reqs:
            self._min_left = least
        elif self._min_left is not None:
            self._min_left = min(self._min_left, least)
        self.reqs += reqs
        self.prompt = _joined(self.prompt, [r.prompt for r in reqs])
        self.generated = _joined(self.generated, [r.generated for r in reqs])
        self.target = _joined(self.target, [r.target_out for r in reqs])
        self.last = _joined(self.last, [r.last_token for r in reqs])
        self.accept = _joined(self.accept, [r.accept for r in reqs])
        self._context += sum(r.prompt + r.generated for r in reqs)

    def pop(self) -> Request:
        req = self.reqs.pop()
        req.generated = int(self.generated[-1])
        req.last_token = float(self.last[-1])
        self._context -= req.prompt + req.generated
        self._min_left = None
        self.prompt, self.generated, self.target, self.last, self.accept = (
            self.prompt[:-1],
            self.generated[:-1],
            self.target[:-1],
            self.last[:-1],
            self.accept[:-1],
        )
        return req

    def context(self) -> int:
        return self._context

    def min_left(self) -> int:
        """The fewest tokens any sequence has left to generate (the batch is not empty)."""
        if self._min_left is None:
            self._min_left = int((self.target - self.generated).min())
        return self._min_left

    def progress(self, req: Request) -> tuple[int, float] | None:
        """A running sequence's tokens so far and its latest token's time (None: not here)."""
        for i, r in enumerate(self.reqs):
            if r is req:
                return int(self.generated[i]), float(self.last[i])
        return None

    def grow(self, tokens: np.ndarray, total: int | None = None) -> None:
        """Each sequence generated ``tokens[i]`` more (``total`` of them, when known)."""
        self.generated = self.generated + tokens
        self._context += int(tokens.sum()) if total is None else total
        self._min_left = None

    def grow_each(self, tokens: int) -> None:
        """Every sequence generated ``tokens`` more."""
        self.generated = self.generated + tokens
        self._context += tokens * len(self.reqs)
        if self._min_left is not None:
            self._min_left -= tokens

    def blocks(self, block_size: int, extra: int = 0) -> int:
        """KV blocks the sequences hold once each has ``extra`` more tokens (whole numbers:
        the ceiling of each division, as positive token counts round up)."""
        return int(((self.prompt + self.generated + (extra + block_size - 1)) // block_size).sum())

    def keep(self, mask: np.ndarray, context: int | None = None) -> None:
        """Keep the sequences ``mask`` selects (holding ``context`` tokens, when known)."""
        self.reqs = list(itertools.compress(self.reqs, mask.tolist()))
        self.prompt, self.generated, self.target, self.last, self.accept = (
            self.prompt[mask],
            self.generated[mask],
            self.target[mask],
            self.last[mask],
            self.accept[mask],
        )
        if context is None:
            context = int(self.prompt.sum() + self.generated.sum())
        self._context = context
        self._min_left = None


def _joined(a: np.ndarray, more: list[int] | list[float]) -> np.ndarray:
    joined = np.empty(len(a) + len(more), dtype=a.dtype)
    joined[: len(a)] = a
    joined[len(a) :] = more
    return joined
