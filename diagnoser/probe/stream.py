"""One streamed request to an OpenAI-compatible server, timed as the user sees it.

The clock starts before the connection is opened (a user's request pays for it too). The
first token is the first server-sent event that carries text (``choices[0].text``, or
``delta.content`` / ``delta.reasoning_content`` in chat); chat's opening role-only chunk is not
a token. Gaps are measured between such events as they arrive, so a proxy that holds the
stream back shows as a late first token followed by gaps near zero.

Outcomes:

- ``ok``: HTTP 200 and the stream ended properly (``data: [DONE]`` or a ``finish_reason``);
- ``http_error``: any other status, an answer that is not an event stream (an HTML login
  page with status 200, say), or an error object or invalid JSON inside the stream;
- ``timeout``: the whole request took longer than its timeout (connect, wait and stream: a
  deadline, however slowly the server drips its bytes);
- ``truncated``: the stream was cut before its end (no ``[DONE]``, no ``finish_reason``);
- ``connection_error``: no connection (refused, DNS, TLS) or no response at all.

Only ``ok`` requests are timed in the histograms; every request is counted by outcome.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from diagnoser.plumbing.errors import UserError
from diagnoser.plumbing.http import REAPER, describe, tls_context
from diagnoser.plumbing.redact import redactor
from diagnoser.plumbing.source import read_token, redact_url
from diagnoser.plumbing.tls import check_ca_file

OUTCOMES = ("ok", "http_error", "timeout", "truncated", "connection_error")
API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
USER_AGENT = "servediag-probe"
MAX_LINE = 1 << 20  # longest server-sent event line read whole
MAX_ERROR_BODY = 1 << 16
MAX_TOKENS = 10**9  # more prompt tokens than any context window holds
# Answers with status 200 that are not a stream: a login page, a JSON error from a gateway.
NOT_A_STREAM = ("text/html", "application/json", "application/xhtml+xml")
SSE_FIELDS = ("", "event", "id", "retry")  # "" is a comment (":..."), besides "data"

Clock = Callable[[], float]


class ProbeError(Exception):
    """The target cannot be reached or answers something unusable (exit status 3)."""


@dataclass
class Endpoint:
    """Where and how to send: the API's base URL, TLS, and the request headers."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    bearer_token_file: Path | None = None
    ca_file: str | None = None

    def __post_init__(self) -> None:
        try:
            parts = urlsplit(self.url)
        except ValueError as exc:  # "http://[::1": an unclosed IPv6 address
            raise UserError(f"--target {redact_url(self.url)!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UserError(f"--target {redact_url(self.url)!r} is not an http(s):// URL")
        try:
            port = parts.port
        except ValueError:
            raise UserError(f"--target {redact_url(self.url)!r} has a bad port") from None
        self.scheme, self.host = parts.scheme, parts.hostname
        self.port = port or (443 if parts.scheme == "https" else 80)
        prefix = parts.path.rstrip("/")
        self.prefix = prefix[: -len("/v1")] if prefix.endswith("/v1") else prefix
        self.query = f"?{parts.query}" if parts.query else ""
        self.shown = redact_url(self.url)
        self._password = unquote(parts.password or "")
        if parts.username is not None:
            user_pass = f"{unquote(parts.username)}:{self._password}"
            self.headers.setdefault(
                "Authorization", "Basic " + base64.b64encode(user_pass.encode()).decode()
            )
        if self.ca_file is not None:
            check_ca_file(self.ca_file)
        self._token: str | None = None
        if self.bearer_token_file is not None:
            self._token = read_token(self.bearer_token_file, "--bearer-token-file") or None
            if self._token is None:
                raise UserError(f"--bearer-token-file {self.bearer_token_file}: empty")

    @property
    def netloc(self) -> str:
        default = 443 if self.scheme == "https" else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"

    def path(self, api_path: str) -> str:
        return f"{self.prefix}{api_path}{self.query}"

    def _read_token(self) -> str | None:
        assert self.bearer_token_file is not None
        try:
            return read_token(self.bearer_token_file, "--bearer-token-file") or None
        except UserError:
            return None

    def clean(self, text: str) -> str:
        """``text`` (from a server: an error body may echo the request) without credentials,
        in any encoding (``plumbing.redact``): header values, the token, the URL's password."""
        values = [*self.headers.values(), self._token or "", self._password]
        values += [v.split(" ", 1)[1] for v in self.headers.values() if " " in v.strip()]
        return redactor(tuple(sorted(set(values)))).clean(text)

    def request_headers(self, accept: str) -> dict[str, str]:
        """Headers for one request; a token file is read again each time (tokens rotate)."""
        out = {"User-Agent": USER_AGENT, "Accept": accept, **self.headers}
        if self.bearer_token_file is not None:
            self._token = self._read_token() or self._token  # keep the last good one
            out["Authorization"] = f"Bearer {self._token}"
        return out

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.scheme == "https":
            ctx = tls_context(self.ca_file)
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout, context=ctx)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


@dataclass
class Result:
    outcome: str
    ttft: float | None = None
    gaps: list[float] = field(default_factory=list)
    e2e: float | None = None
    tokens: int = 0  # events that carried text
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # as the server counted them (usage)
    detail: str = ""


def _error_message(body: bytes, clean: Callable[[str], str]) -> str:
    """The ``message`` of an OpenAI-style error body, or the start of the body; ``clean``
    (blanking credentials out) comes before it is cut short."""
    text = clean(body.decode("utf-8", "replace")).strip()
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return " ".join(text.split())[:200] or "(empty body)"
    return _message_of(obj) or text[:200]


def _message_of(obj: Any) -> str:
    if isinstance(obj, dict):
        err = obj.get("error", obj)
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return " ".join(err["message"].split())[:300]
        if isinstance(err, str):
            return err[:300]
    return ""


def _text_of(choice: dict[str, Any]) -> str:
    text = choice.get("text")
    if isinstance(text, str):
        return text
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                return value
    return ""


def stream(
    ep: Endpoint,
    api: str,
    body: dict[str, Any],
    timeout: float,
    clock: Clock = time.monotonic,
) -> Result:
    """POST ``body`` (with ``stream: true``) and read the server-sent events to the end."""
    res = _stream(ep, api, body, timeout, clock)
    res.detail = ep.clean(res.detail)
    return res


def _stream(ep: Endpoint, api: str, body: dict[str, Any], timeout: float, clock: Clock) -> Result:
    data = json.dumps({**body, "stream": True}).encode()
    headers = {**ep.request_headers("text/event-stream"), "Content-Type": "application/json"}
    t0 = clock()
    deadline = t0 + timeout
    conn = ep.connection(timeout)
    at = time.monotonic() + timeout
    try:
        # The socket is shut down at the deadline, however slowly the server sends: the
        # connection's while it connects, then the socket itself (the response keeps it).
        with REAPER.guard(conn, at):
            try:
                conn.connect()
            except TimeoutError:
                return Result("timeout", detail=f"no response within {timeout:g} s")
            except OSError as exc:
                if time.monotonic() >= at:
                    return Result("timeout", detail=f"no response within {timeout:g} s")
                return Result("connection_error", detail=_describe(exc))
            with REAPER.guard(conn.sock, at):
                return _exchange(conn, ep, api, data, headers, t0, deadline, timeout, clock)
    finally:
        conn.close()


def _exchange(
    conn: http.client.HTTPConnection,
    ep: Endpoint,
    api: str,
    data: bytes,
    headers: dict[str, str],
    t0: float,
    deadline: float,
    timeout: float,
    clock: Clock,
) -> Result:
    sock: object = None
    try:
        try:
            conn.request("POST", ep.path(API_PATHS[api]), body=data, headers=headers)
            sock = conn.sock
            if isinstance(sock, socket.socket):
                sock.settimeout(max(0.001, deadline - clock()))
            resp = conn.getresponse()
        except TimeoutError:
            return Result("timeout", detail=f"no response within {timeout:g} s")
        except (OSError, http.client.HTTPException) as exc:
            if clock() >= deadline:
                return Result("timeout", detail=f"no response within {timeout:g} s")
            return Result("connection_error", detail=_describe(exc))
        media = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if resp.status == 200 and media in NOT_A_STREAM:
            try:
                message = _error_message(resp.read(MAX_ERROR_BODY), ep.clean)
            except (OSError, http.client.HTTPException):
                message = "(body not read)"
            return Result("http_error", detail=f"HTTP 200 with {media}, not a stream: {message}")
        if resp.status != 200:
            try:
                if isinstance(sock, socket.socket):
                    sock.settimeout(max(0.001, deadline - clock()))
                message = _error_message(resp.read(MAX_ERROR_BODY), ep.clean)
            except (OSError, http.client.HTTPException):
                message = "(body not read)"
            return Result("http_error", detail=f"HTTP {resp.status}: {message}")
        return _read_events(resp, sock, t0, deadline, timeout, clock)
    finally:
        conn.close()


class _Lines:
    """The stream's lines, each ended by CRLF, LF or a lone CR: the server-sent events format
    allows all three, and ``readline`` knows only LF (a CR-only stream was one long line,
    read as invalid JSON). Each line comes with LF as its ending; a line longer than
    ``MAX_LINE`` comes in pieces of that size; ``b""`` is the end of the stream."""

    EOL = re.compile(rb"\r\n|\r|\n")

    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.resp = resp
        self.buf = bytearray()
        self.pos = 0  # where the next line starts in ``buf``
        self.scanned = 0  # ``buf`` up to here holds no line ending past ``pos``
        self.after_cr = False  # the last line ended with a CR at the end of what was read
        self.done = False

    def next(self) -> bytes:
        while True:
            if self.after_cr and len(self.buf) > self.pos:
                if self.buf[self.pos] == 0x0A:  # the LF of a CRLF split between two reads
                    self.pos += 1
                    self.scanned = max(self.scanned, self.pos)
                self.after_cr = False
            m = self.EOL.search(self.buf, max(self.pos, self.scanned))
            if m and m.start() - self.pos <= MAX_LINE:
                line = bytes(self.buf[self.pos : m.start()]) + b"\n"
                self.after_cr = m.group() == b"\r" and m.end() == len(self.buf)
                self.pos = self.scanned = m.end()
                return line
            if m is None:
                self.scanned = len(self.buf)
            if len(self.buf) - self.pos >= MAX_LINE:
                line = bytes(self.buf[self.pos : self.pos + MAX_LINE])
                self.pos += MAX_LINE
                return line
            if self.done:
                line = bytes(self.buf[self.pos :])
                self.pos = len(self.buf)
                return line
            if self.pos:  # drop what was read, before reading more
                del self.buf[: self.pos]
                self.scanned -= self.pos
                self.pos = 0
            chunk = self.resp.read1(1 << 16)
            if chunk:
                self.buf += chunk
            else:
                self.done = True


def _read_events(
    resp: http.client.HTTPResponse,
    sock: object,
    t0: float,
    deadline: float,
    timeout: float,
    clock: Clock,
) -> Result:
    res = Result("truncated")
    last = t0
    events, foreign = 0, ""
    lines = _Lines(resp)
    while True:
        remaining = deadline - clock()
        if remaining <= 0:
            return _timed_out(res, timeout)
        try:
            if isinstance(sock, socket.socket):
                sock.settimeout(remaining)
            raw = lines.next()
        except TimeoutError:
            return _timed_out(res, timeout)
        except (OSError, http.client.HTTPException) as exc:
            if clock() >= deadline:
                return _timed_out(res, timeout)
            res.detail = f"stream cut after {res.tokens} token(s): {_describe(exc)}"
            return res
        now = clock()
        if now >= deadline:  # the socket was shut at the deadline: the line may be cut
            return _timed_out(res, timeout)
        if not raw:
            break
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        name, _, value = line.partition(":")
        if name != "data":
            if line and name not in SSE_FIELDS and not events:
                foreign = foreign or line  # not server-sent events at all?
            continue  # blank lines end events; comments and other fields carry no tokens
        events += 1
        value = value[1:] if value.startswith(" ") else value
        if value.strip() == "[DONE]":
            res.outcome, res.e2e = "ok", now - t0
            return res
        try:
            obj = json.loads(value)
        except (ValueError, RecursionError):  # nested thousands deep is no chunk either
            res.outcome, res.detail = "http_error", "the stream carries invalid JSON"
            return res
        if not isinstance(obj, dict):
            continue
        if "error" in obj:
            res.outcome = "http_error"
            res.detail = f"error in the stream: {_message_of(obj) or 'no message'}"
            return res
        usage = obj.get("usage")
        if isinstance(usage, dict) and _token_count(usage.get("prompt_tokens")):
            res.prompt_tokens = usage["prompt_tokens"]
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            continue
        if _text_of(choices[0]):
            if res.ttft is None:
                res.ttft = now - t0
            else:
                res.gaps.append(now - last)
            last = now
            res.tokens += 1
        reason = choices[0].get("finish_reason")
        if isinstance(reason, str) and reason:
            res.finish_reason = reason
    if res.finish_reason is not None:  # ended properly, without [DONE]
        res.outcome, res.e2e = "ok", clock() - t0
    elif not events and foreign:
        res.outcome = "http_error"
        res.detail = f"the answer is not an event stream: {' '.join(foreign.split())[:120]}"
    else:
        res.detail = f"the stream ended after {res.tokens} token(s) without [DONE]"
    return res


def _token_count(value: object) -> bool:
    """Whether a server's ``usage`` count can be one: a whole number (not ``true``) from 0 to
    ``MAX_TOKENS``. Anything else is not shown or exported: a count of hundreds of digits
    cannot even become a float for the gauge."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS


def _timed_out(res: Result, timeout: float) -> Result:
    return Result(
        "timeout",
        ttft=res.ttft,
        tokens=res.tokens,
        detail=f"not finished within {timeout:g} s ({res.tokens} token(s) received)",
    )


def _describe(exc: BaseException) -> str:
    if isinstance(exc, http.client.IncompleteRead):
        return "the chunked stream was cut"
    return describe(exc)


def get_json(ep: Endpoint, api_path: str, timeout: float) -> Any:
    """GET a JSON document (``/v1/models``); failures raise :class:`ProbeError`."""
    conn = ep.connection(timeout)
    where = f"{ep.shown.rstrip('/')} ({api_path})"
    at = time.monotonic() + timeout
    try:
        with REAPER.guard(conn, at):
            conn.connect()
        with REAPER.guard(conn.sock, at):
            conn.request("GET", ep.path(api_path), headers=ep.request_headers("application/json"))
            resp = conn.getresponse()
            body = resp.read(MAX_ERROR_BODY * 16)
            if time.monotonic() >= at:
                raise TimeoutError
    except TimeoutError:
        raise ProbeError(f"{where}: no answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        if time.monotonic() >= at:
            raise ProbeError(f"{where}: no answer within {timeout:g} s") from None
        raise ProbeError(f"{where}: {_describe(exc)}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise ProbeError(ep.clean(f"{where}: HTTP {resp.status}: {_error_message(body, ep.clean)}"))
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise ProbeError(f"{where}: the answer is not JSON") from None
