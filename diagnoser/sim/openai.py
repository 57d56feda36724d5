"""The OpenAI-compatible API of the live simulator: requests parsed, answers shaped as vLLM's.

Only what a streaming client needs: ``/v1/models``, ``/v1/completions`` and
``/v1/chat/completions`` with ``stream`` true or false, server-sent event chunks
(``choices[0].text`` or ``choices[0].delta.content``), ``data: [DONE]`` and a ``usage`` chunk
when ``stream_options.include_usage`` is set. Errors are OpenAI-style JSON bodies.

Prompt tokens are counted with the probe's approximation (:func:`approx_tokens`: a word or a
punctuation mark each), or are the length of ``prompt`` given as token ids; a chat message adds
4 tokens for its role markers and the answer's opening 3, as a chat template would.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diagnoser.metrics.tokens import WORDS, approx_tokens

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
PER_MESSAGE_TOKENS = 4
ANSWER_PRIMER_TOKENS = 3
DEFAULT_COMPLETION_MAX_TOKENS = 16  # the legacy completions API's default


class ApiError(Exception):
    """An OpenAI-style error answer: HTTP status, message and error type."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError"):
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> bytes:
        err = {"message": self.message, "type": self.kind, "param": None, "code": self.status}
        return json.dumps({"error": err}).encode()


@dataclass
class Completion:
    """One parsed request."""

    model: str
    chat: bool
    stream: bool
    include_usage: bool
    prompt_tokens: int
    max_tokens: int | None

    @property
    def object(self) -> str:
        if self.chat:
            return "chat.completion.chunk" if self.stream else "chat.completion"
        return "text_completion"


def _int_field(obj: dict[str, Any], *names: str) -> int | None:
    for name in names:
        value = obj.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ApiError(400, f"'{name}' must be a positive integer, got {value!r}")
        return value
    return None


def _prompt_tokens(obj: dict[str, Any], chat: bool) -> int:
    if chat:
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list")
        total = ANSWER_PRIMER_TOKENS
        for msg in messages:
            if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
                raise ApiError(400, "each message needs a 'role' and a 'content'")
            content = msg.get("content")
            if isinstance(content, list):  # content parts: count the text ones
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise ApiError(400, "each message needs a 'role' and a 'content'")
            total += PER_MESSAGE_TOKENS + approx_tokens(content)
        return total
    prompt = obj.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return max(1, approx_tokens(prompt))
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(x, int) and not isinstance(x, bool) for x in prompt)
    ):
        return len(prompt)
    raise ApiError(400, "'prompt' must be a string or a list of token ids (one prompt)")


def parse(path: str, body: bytes, models: list[str]) -> Completion:
    """The request at ``path`` with JSON ``body``; ``models`` are the served names."""
    try:
        obj = json.loads(body or b"null")
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON") from None
    except RecursionError:  # the parser's recursion, not the server, gives up
        raise ApiError(400, "the request body is JSON nested too deeply") from None
    if not isinstance(obj, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = obj.get("model") or models[0]
    if model not in models:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError")
    chat = path == CHAT_PATH
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false")
    options = obj.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object")
    if obj.get("n", 1) != 1:
        raise ApiError(400, "only n=1 is simulated")
    max_tokens = _int_field(obj, "max_completion_tokens", "max_tokens") if chat else None
    if not chat:
        max_tokens = _int_field(obj, "max_tokens") or DEFAULT_COMPLETION_MAX_TOKENS
    return Completion(
        model=str(model),
        chat=chat,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        prompt_tokens=_prompt_tokens(obj, chat),
        max_tokens=max_tokens,
    )


def check_length(c: Completion, max_model_len: int) -> None:
    """vLLM's 400 for a prompt (plus ``max_tokens``) over the context length."""
    if c.prompt_tokens >= max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {c.prompt_tokens} input tokens. Please reduce the length of the "
            "input messages.",
        )
    if c.max_tokens is not None and c.prompt_tokens + c.max_tokens > max_model_len:
        raise ApiError(
            400,
            f"'max_tokens' is too large: {c.max_tokens}. This model's maximum context length "
            f"is {max_model_len} tokens and your request has {c.prompt_tokens} input tokens "
            f"({c.max_tokens} > {max_model_len} - {c.prompt_tokens}).",
        )


def token_text(k: int) -> str:
    """The text of the k-th generated token (one common word each)."""
    return " " + WORDS[k % len(WORDS)]


class Shapes:
    """The JSON of one request's answer, as vLLM writes it."""

    def __init__(self, c: Completion, rid: int):
        self.c = c
        self.id = f"{'chatcmpl' if c.chat else 'cmpl'}-servediag-{rid}"
        self.created = int(time.time())

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": self.c.object,
            "created": self.created,
            "model": self.c.model,
        }

    def _choice(self, text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
        if self.c.chat:
            delta: dict[str, Any] = (
                {"role": "assistant", "content": text} if first else {"content": text}
            )
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}

    def role_chunk(self) -> bytes:
        """Chat's opening chunk (the role, no text), sent before the first token."""
        return sse({**self._head(), "choices": [self._choice("", None, first=True)]})

    def chunk(self, text: str, finish: str | None) -> bytes:
        return sse({**self._head(), "choices": [self._choice(text, finish)]})

    def usage(self, completion_tokens: int) -> dict[str, int]:
        p = self.c.prompt_tokens
        return {
            "prompt_tokens": p,
            "completion_tokens": completion_tokens,
            "total_tokens": p + completion_tokens,
        }

    def usage_chunk(self, completion_tokens: int) -> bytes:
        return sse({**self._head(), "choices": [], "usage": self.usage(completion_tokens)})

    def whole(self, text: str, finish: str, completion_tokens: int) -> bytes:
        """The non-streamed answer."""
        if self.c.chat:
            msg = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": msg, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        doc = {**self._head(), "choices": [choice], "usage": self.usage(completion_tokens)}
        return json.dumps(doc).encode()


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class ProxyBuffer:
    """A buffering proxy in front of the API: flush every ``seconds``, or only at the end."""

    seconds: float = 0.0  # simulated seconds between flushes
    full: bool = False  # hold the whole stream until it is complete

    @classmethod
    def parse(cls, text: str) -> ProxyBuffer:
        if text.strip().lower() == "full":
            return cls(full=True)
        from diagnoser.plumbing.durations import parse_duration

        try:
            seconds = float(text) if _is_number(text) else parse_duration(text.strip())
        except ValueError:
            raise ValueError(f"{text!r} is neither 'full' nor seconds like 2 or 2s") from None
        if not (0 < seconds < math.inf):
            raise ValueError("must be a number of seconds above zero")
        return cls(seconds=seconds)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


class Relay:
    """Writes a stream's chunks at their due wall time, through an optional buffering proxy.

    ``due`` maps simulated time to wall time; without a proxy each chunk leaves when it was
    produced. A proxy with ``seconds`` releases what it holds at every multiple of that
    interval after the request began; ``full`` releases everything when the stream ends.
    """

    def __init__(
        self,
        write: Callable[[bytes], None],
        due: Callable[[float], float],
        begin: float,
        proxy: ProxyBuffer | None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ):
        self.write, self.due, self.begin, self.proxy = write, due, begin, proxy
        self.sleep, self.clock = sleep, clock
        self.held: list[bytes] = []
        self.last = begin

    def send(self, data: bytes, at: float) -> None:
        """``data`` was produced at simulated time ``at``."""
        self.last = max(self.last, at)
        if self.proxy is not None and self.proxy.full:
            self.held.append(data)
            return
        when = self.due(at)
        if self.proxy is not None:
            start = self.due(self.begin)
            period = self.due(self.begin + self.proxy.seconds) - start
            when = start + math.ceil(max(0.0, when - start) / period - 1e-9) * period
        self._wait_until(when)
        self.write(data)

    def close(self) -> None:
        """The stream is complete: a full proxy now releases it, in one piece."""
        if self.held:
            self._wait_until(self.due(self.last))
            self.write(b"".join(self.held))
            self.held = []

    def _wait_until(self, when: float) -> None:
        wait = when - self.clock()
        if wait > 0:
            self.sleep(wait)
