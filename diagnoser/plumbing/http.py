"""HTTP with a deadline and a size limit, for the clients servediag runs (the Prometheus
source, the chat webhook, the probe).

The standard library's timeouts are per socket operation: a server that sends a byte every
0.9 s never trips a 2 s timeout, and a request can last as long as the server likes. Here
each request has a deadline (a ``time.monotonic()`` instant) that covers the connection, the
request, the status line, the headers and the body: the host's name is resolved in a thread
that is not waited for past the deadline (``getaddrinfo`` has no timeout of its own), and one
reaper thread shuts the connection's socket down when it passes, which ends any read blocked
on it. Bodies are read up to a number
of bytes, counted after decompression (a gzip answer that expands a thousandfold stops at the
limit), and, where the caller gives a ``Lease``, drawn from a ``Budget`` that the answers read
at once share (eight queries of a diagnosis run at once: each alone within the limit, together
they were not). Redirects are never followed here: the caller decides where its credentials
may go.

Proxies come from the environment (``HTTP_PROXY``, ``HTTPS_PROXY``, ``NO_PROXY``), as
``urllib`` and ``requests`` read them. Messages never contain the URL: callers add what they
may show. Nor do they contain the proxy's credentials, in any encoding: a proxy that refuses
them says so in its status line, and may quote them (``proxy_secrets``, ``plumbing.redact``).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import http.client
import itertools
import socket
import ssl
import threading
import time
import urllib.request
import zlib
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

from diagnoser.plumbing.redact import redactor, userinfo_secrets

CHUNK = 1 << 16
REDIRECTS = (301, 302, 303, 307, 308)


class HttpError(Exception):
    """A request that failed: ``str()`` is one line with neither URL nor credentials."""

    def __init__(self, message: str):
        super().__init__(scrub(message))


def proxy_secrets() -> list[str]:
    """The credentials of the proxies the environment names (``HTTP_PROXY=http://user:pass@
    proxy:3128``, ``HTTPS_PROXY``...): what a message must never show, in any encoding."""
    proxies = sorted(urllib.request.getproxies().values())
    return [secret for url in proxies for secret in userinfo_secrets(url)]


def scrub(message: str) -> str:
    """``message`` without the proxies' credentials."""
    secrets = proxy_secrets()
    return redactor(tuple(secrets)).clean(message) if secrets else message


class ConnectError(HttpError):
    """No answer began: the connection was refused, the host unknown, TLS failed..."""

    def __init__(self, message: str, tls: bool = False):
        super().__init__(message)
        self.tls = tls


class TimedOut(HttpError):
    """The deadline passed before the answer was complete."""


class TooLarge(HttpError):
    """The body (decompressed) is longer than the limit."""


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes | bytearray


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port): where credentials for ``url`` may be sent."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme.lower(), (parts.hostname or "").lower(), port


def retry_after(value: str | None) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP date)."""
    if not value:
        return None
    text = value.strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when.timestamp() - time.time())


def pause(seconds: float, at: float, least: float = 0.05) -> bool:
    """Sleep ``seconds`` if that leaves at least ``least`` seconds before ``at`` for another
    try; else return False at once."""
    if time.monotonic() + seconds + least >= at:
        return False
    time.sleep(seconds)
    return True


# --- the reaper ---------------------------------------------------------------------------


class Reaper:
    """One daemon thread that shuts down, at its deadline, each socket (or connection holding
    one as ``sock``) it watches and has not been told to forget."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Any]] = []
        self._live: set[int] = set()
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, target: Any, at: float) -> int:
        with self._cond:
            key = next(self._seq)
            heapq.heappush(self._heap, (at, key, target))
            self._live.add(key)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
                self._thread.start()
            self._cond.notify()
            return key

    def forget(self, key: int) -> None:
        with self._cond:
            self._live.discard(key)
            if len(self._heap) > 2 * len(self._live) + 64:  # drop what was forgotten
                self._heap = [e for e in self._heap if e[1] in self._live]
                heapq.heapify(self._heap)

    @contextlib.contextmanager
    def guard(self, target: Any, at: float) -> Iterator[None]:
        key = self.watch(target, at)
        try:
            yield
        finally:
            self.forget(key)

    def _run(self) -> None:
        with self._cond:
            while True:
                now, heap = time.monotonic(), self._heap
                while heap and (heap[0][0] <= now or heap[0][1] not in self._live):
                    _, key, target = heapq.heappop(heap)
                    if key in self._live:
                        self._live.discard(key)
                        shut(target)
                self._cond.wait(heap[0][0] - now if heap else None)


def shut(target: Any) -> None:
    """Shut a socket down (both ways) so that reads blocked on it return at once."""
    sock = getattr(target, "sock", target)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            # The plain socket's shutdown, also for a TLS socket: it ends a blocked read
            # without touching the TLS state another thread is using.
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


REAPER = Reaper()


# --- memory shared by concurrent answers --------------------------------------------------


class Budget:
    """Bytes that the answers of concurrent queries may hold at once, together: each body as
    it arrives, and what reading its series makes (``plumbing.answer``). A query draws from it
    through a ``Lease`` as it reads; when the budget is spent, the others wait, within their
    deadline, for the queries that hold it to finish. One lease at a time may draw past the
    total, so that an answer larger than what is left (or than the whole budget) still
    completes and the others wait for it rather than for each other: together, the answers
    hold at most the total and that one answer."""

    def __init__(self, total: int):
        self.total = total
        self.used = 0
        self.peak = 0  # the most ever held at once (for tests and measures)
        self._over: Lease | None = None
        self._cond = threading.Condition()

    def lease(self, at: float, most: int) -> Lease:
        """A lease that draws by ``at`` (monotonic) at most ``most`` bytes, or ``TooLarge``."""
        return Lease(self, at, most)


class Lease:
    """One answer's share of a ``Budget``, given back when it is closed."""

    def __init__(self, budget: Budget, at: float, most: int):
        self.budget, self.at, self.most = budget, at, most
        self.held = 0

    def draw(self, n: int) -> None:
        if self.held + n > self.most:
            raise TooLarge(f"more than {self.most} bytes once read")
        b = self.budget
        with b._cond:
            while b.used + n > b.total and b._over not in (None, self):
                left = self.at - time.monotonic()
                if left <= 0:
                    raise TimedOut("no room in time: other answers held the memory for answers")
                b._cond.wait(left)
            if b.used + n > b.total:
                b._over = self
            b.used += n
            b.peak = max(b.peak, b.used)
            self.held += n

    def close(self) -> None:
        b = self.budget
        with b._cond:
            b.used -= self.held
            self.held = 0
            if b._over is self:
                b._over = None
            b._cond.notify_all()

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- connections --------------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def tls_context(ca_file: str | None = None, insecure: bool = False) -> ssl.SSLContext:
    """One context per CA file, made once (``plumbing.tls`` has checked the file): OpenSSL does
    not read the bundle again for every request."""
    if insecure:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        return ctx
    return ssl.create_default_context(cafile=ca_file)


def _proxy_for(parts: SplitResult) -> SplitResult | None:
    host = parts.hostname or ""
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    found = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    return found if found.hostname else None


def connection(
    url: str, at: float, ca_file: str | None = None, insecure: bool = False
) -> tuple[http.client.HTTPConnection, str, dict[str, str]]:
    """A connection for ``url`` (through the environment's proxy, if any), the request
    target to send and the headers the proxy needs."""
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port
    timeout = max(0.001, at - time.monotonic())
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    proxy = _proxy_for(parts)
    if proxy is None:
        if parts.scheme == "https":
            ctx = tls_context(ca_file, insecure)
            return http.client.HTTPSConnection(host, port, timeout=timeout, context=ctx), target, {}
        return http.client.HTTPConnection(host, port, timeout=timeout), target, {}
    extra = {}
    if proxy.username is not None:
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        extra["Proxy-Authorization"] = "Basic " + b64encode(pair.encode()).decode()
    phost, pport = proxy.hostname or "", proxy.port or 80
    if parts.scheme == "https":  # a CONNECT tunnel, then TLS with the host itself
        ctx = tls_context(ca_file, insecure)
        conn = http.client.HTTPSConnection(phost, pport, timeout=timeout, context=ctx)
        conn.set_tunnel(host, port or 443, headers=extra)
        return conn, target, {}
    absolute = parts._replace(netloc=parts.netloc.rpartition("@")[2], fragment="").geturl()
    return http.client.HTTPConnection(phost, pport, timeout=timeout), absolute, extra


AddrInfo = list[tuple[Any, ...]]


def resolve(host: str, port: int, at: float) -> AddrInfo:
    """``host``'s addresses, or ``TimedOut`` if the resolver has not answered by ``at``.
    The lookup runs in a daemon thread: a resolver that hangs keeps only that thread."""
    found: list[AddrInfo] = []
    failed: list[BaseException] = []

    def lookup() -> None:
        try:
            found.append(socket.getaddrinfo(host, port, type=socket.SOCK_STREAM))
        except OSError as exc:
            failed.append(exc)

    worker = threading.Thread(target=lookup, name="servediag-resolve", daemon=True)
    worker.start()
    worker.join(max(0.0, at - time.monotonic()))
    if failed:
        raise failed[0]
    if not found:
        raise TimedOut("the host's name was not resolved in time")
    return found[0]


def _connect_to(addresses: AddrInfo) -> Any:
    """A replacement for ``HTTPConnection._create_connection`` that connects to addresses
    already resolved (TLS still checks the certificate against the host's name)."""

    def connect(address: tuple[str, int], timeout: Any = None, source: Any = None) -> socket.socket:
        last: OSError = OSError("no address")
        for family, kind, proto, _, sockaddr in addresses:
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                if source:
                    sock.bind(source)
                sock.connect(sockaddr)
                return sock
            except OSError as exc:
                sock.close()
                last = exc
        raise last

    return connect


def describe(exc: BaseException) -> str:
    """A connection failure in a few words, without the host's name."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS: {exc.verify_message or exc.reason or 'certificate not trusted'}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "the server closed the connection without a response"
    if isinstance(exc, http.client.IncompleteRead):
        return "the answer was cut short"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())[:200]


def request(
    method: str,
    url: str,
    at: float,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    max_bytes: int = 1 << 20,
    ca_file: str | None = None,
    insecure: bool = False,
    lease: Lease | None = None,
) -> Response:
    """One request, finished by ``at`` (monotonic) or ``TimedOut``; no redirect followed.
    The body is decompressed (gzip) and at most ``max_bytes`` long, or ``TooLarge``; with
    ``lease``, it is drawn from a ``Budget`` as it arrives."""
    if time.monotonic() >= at:
        raise TimedOut("no time left")
    conn, target, extra = connection(url, at, ca_file, insecure)
    started = False
    try:
        with contextlib.ExitStack() as guards:
            # The connection while it connects; then its socket, which the response keeps
            # when http.client lets go of it (an answer that closes the connection).
            guards.enter_context(REAPER.guard(conn, at))
            try:
                addresses = resolve(conn.host, conn.port, at)
                conn._create_connection = _connect_to(addresses)  # type: ignore[attr-defined]
                conn.connect()
                guards.enter_context(REAPER.guard(conn.sock, at))
                if time.monotonic() >= at:
                    raise TimedOut("no answer in time")
                conn.request(method, target, body=body, headers={**(headers or {}), **extra})
                resp = conn.getresponse()
                started = True
                got = {k.lower(): v for k, v in resp.getheaders()}
                data = read_body(resp, got, max_bytes, lease)
                if time.monotonic() >= at:  # the reaper may have cut the body short
                    raise TimedOut("no complete answer in time")
            except (TimedOut, TooLarge):
                raise
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if time.monotonic() >= at or isinstance(exc, TimeoutError):
                    raise TimedOut("no complete answer in time") from None
                if started:
                    raise HttpError(describe(exc)) from None
                raise ConnectError(describe(exc), isinstance(exc, ssl.SSLError)) from None
            finally:
                if started:
                    resp.close()
    finally:
        conn.close()
    return Response(resp.status, got, data)


def read_body(
    resp: http.client.HTTPResponse,
    headers: dict[str, str],
    max_bytes: int,
    lease: Lease | None = None,
) -> bytearray:
    """The body, decompressed, at most ``max_bytes`` long (``TooLarge``), each part drawn
    from ``lease`` (if any) as it arrives, so that the answers read at once fit in their
    budget. Inflated a piece of at most ``CHUNK`` bytes at a time: a gzip bomb's chunk does
    not become megabytes before the limit is seen."""
    length = headers.get("content-length", "").strip()
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding in ("", "identity") and length.isdigit() and int(length) > max_bytes:
        raise TooLarge(f"{int(length)} bytes")
    if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
        raise HttpError(f"the answer is encoded as {encoding!r}, which was not asked for")
    inflate = zlib.decompressobj(wbits=47) if encoding not in ("", "identity") else None
    out = bytearray()

    def add(part: bytes) -> None:
        if lease is not None:
            lease.draw(len(part))
        out.extend(part)
        if len(out) > max_bytes:
            raise TooLarge(f"more than {max_bytes} bytes")

    try:
        while chunk := resp.read(CHUNK):
            if inflate is None:
                add(chunk)
                continue
            add(inflate.decompress(chunk, CHUNK))
            while inflate.unconsumed_tail:
                add(inflate.decompress(inflate.unconsumed_tail, CHUNK))
        if inflate is not None:
            add(inflate.flush())
    except zlib.error:
        raise HttpError("the answer's gzip encoding is corrupt") from None
    return out
