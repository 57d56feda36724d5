"""A ``prometheus_api_client.PrometheusConnect`` as a metric source, with the guarantees of
the command line's own client.

A notebook's ``PrometheusConnect`` already knows how to reach the site's Prometheus: its URL,
headers, auth, TLS settings (``verify``, a client certificate), proxies, cookies and any
adapter mounted on its session. ``ConnectSource`` sends each query with all of that, but
not through the library's query methods, which drop a partial answer's ``warnings``, have
no deadline for a whole diagnosis, read any answer whole whatever its size, and sleep any
``Retry-After`` the session's default retry adapter is given. Instead each answer goes
through ``PrometheusSource``'s own loop: one deadline, retries and ``Retry-After`` under it,
a bound on the decompressed size, the answer's shape checked, warnings kept, and errors as
one ``SourceError`` line without a credential in it.

The command line's promises hold for every way a ``PrometheusConnect`` carries a secret:

- Every value its headers and its session's headers set, its ``auth`` and the session's (a
  tuple, ``HTTPBasicAuth``, ``HTTPDigestAuth``, an ``AuthBase`` of the site's own: whatever
  it put in the request sent), the session's cookies and ``params``, the proxies' user and
  password and the URL's are blanked out of every message, in every encoding a server
  echoes them in (``plumbing.redact``).
- A request to another origin (a redirect elsewhere) goes through a bare session: none of
  the user's headers, auth, cookies, params, hooks, adapters or client certificate. The
  proxies and the ``verify`` setting stay: the network may only be left through that proxy
  (its credentials go to the proxy, not to the origin), and ``verify`` says which
  certificates to trust, no secret of the user's.
- The deadline holds however a server drips its headers or its body: requests' read
  timeout starts again with every byte, so each socket a try uses (its connection's, also
  through a proxy) is shut down by ``http.REAPER`` when the deadline passes. An adapter that
  is not an ``HTTPAdapter`` is used as it is, with only its own timeouts.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import functools
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from http.cookiejar import DefaultCookiePolicy
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from diagnoser.plumbing import http
from diagnoser.plumbing.redact import MIN_SECRET, userinfo_secrets
from diagnoser.plumbing.source import Auth, PrometheusSource, redact_url

CHUNK = 1 << 16


class ConnectSource(PrometheusSource):
    """Queries sent with a ``PrometheusConnect``'s settings, answered as ``PrometheusSource``
    answers them (see the module's docstring)."""

    def __init__(self, connect: Any, timeout: float = 60.0, max_bytes: int = 64 << 20):
        import requests

        self.connect = connect
        held = _secrets_of(connect)
        super().__init__(connect.url, Auth(), timeout=timeout, max_bytes=max_bytes)
        self._held = tuple(held)
        self._session = _watching_session(connect._session, requests)
        self._bare = _bare_session(requests)
        self._requests = requests
        self._try = threading.local()  # what each thread's latest try sent (``_note``)

    def _send(
        self,
        url: str,
        at: float,
        headers: dict[str, str],
        form: bytes | None = None,
        lease: http.Lease | None = None,
    ) -> http.Response:
        """One try with the ``PrometheusConnect``'s session, headers and auth (to its own
        origin only: another goes through a bare session), finished by ``at``: a GET, or a
        POST of ``form`` for a query too long for a URL; the answer's bytes are drawn from
        ``lease`` as they arrive, as the command line's client draws them."""
        requests = self._requests
        c = self.connect
        own = http.origin(url) == http.origin(self.base)
        left = at - time.monotonic()
        if left <= 0:
            raise http.TimedOut("no time left")
        request = requests.Request(
            "POST" if form else "GET",
            url,
            data=form,
            headers={**headers, **(c.headers or {})} if own else headers,
            auth=c.auth if own else None,
        )
        session = self._session if own else self._bare
        self._try.noted = []
        with _watched(at):
            try:
                prepared = session.prepare_request(request)
                # The user's proxies and TLS settings (and the environment's, as requests
                # reads them), to any origin; a client certificate to its own only.
                settings = self._session.merge_environment_settings(
                    prepared.url, {}, True, None, None
                )
                if not own:
                    settings["cert"] = None
                self._note_proxies(settings.get("proxies") or {})
                if own:
                    self._note(prepared, headers, url)
                resp = session.send(
                    prepared, timeout=(left, left), allow_redirects=False, **settings
                )
            except requests.exceptions.RequestException as exc:
                raise _failure(exc, at, requests) from None
            try:
                if own:  # as sent: an auth's hook may have sent it again (HTTPDigestAuth)
                    for sent in (*resp.history, resp):
                        self._note(sent.request, headers, url)
                return self._read(resp, at, lease)
            finally:
                resp.close()

    def _read(self, resp: Any, at: float, lease: http.Lease | None) -> http.Response:
        """The answer's status, headers and body (decompressed, drawn from ``lease``), read
        by ``at``."""
        got = {k.lower(): v for k, v in resp.headers.items()}
        length = got.get("content-length", "").strip()
        plain = got.get("content-encoding", "identity") in ("", "identity")
        if plain and length.isdigit() and int(length) > self.max_bytes:
            raise http.TooLarge(f"{length} bytes")
        body = bytearray()
        try:
            for chunk in resp.iter_content(CHUNK):  # decompressed as it arrives
                if lease is not None:
                    lease.draw(len(chunk))
                body += chunk
                if len(body) > self.max_bytes:
                    raise http.TooLarge(f"more than {self.max_bytes} bytes")
                if time.monotonic() >= at:
                    raise http.TimedOut("no complete answer in time")
        except self._requests.exceptions.RequestException as exc:
            raise _failure(exc, at, self._requests) from None
        if time.monotonic() >= at:  # the reaper may have cut the body short
            raise http.TimedOut("no complete answer in time")
        return http.Response(resp.status_code, got, body)

    def _note(self, prepared: Any, ours: Mapping[str, str], url: str) -> None:
        """Keep as secrets what the user's settings put in a request sent: each header
        that is neither servediag's nor requests' default, and each query parameter that is
        not servediag's (a session's ``params``, an auth that signs the URL)."""
        found: list[str] = []
        mine = {k.lower(): v for k, v in ours.items()}
        for name, value in (getattr(prepared, "headers", None) or {}).items():
            key = str(name).lower()
            if key == "content-length" or value in (mine.get(key), _defaults().get(key)):
                continue
            found += header_secrets(str(name), value)
        asked = set(parse_qsl(urlsplit(url).query))
        sent = parse_qsl(urlsplit(str(getattr(prepared, "url", ""))).query)
        found += [value for key, value in sent if (key, value) not in asked]
        self._keep(found)

    def _note_proxies(self, proxies: Mapping[str, Any]) -> None:
        self._keep(s for url in proxies.values() if url for s in userinfo_secrets(str(url)))

    def _keep(self, found: Iterable[str]) -> None:
        """Hold ``found`` for the messages about this thread's try (an auth that signs each
        request makes new secrets each time: only the latest try's are kept)."""
        noted = self._try.noted
        for secret in found:
            if len(secret) >= MIN_SECRET and secret not in self._held and secret not in noted:
                noted.append(secret)

    def _secrets(self) -> tuple[str, ...]:
        """The ``PrometheusConnect``'s secrets too, blanked out in any encoding a server
        echoes them in, as the command line's are."""
        noted = sorted(getattr(self._try, "noted", ()), key=len, reverse=True)
        return (*self._held, *noted, *super()._secrets())


def _failure(exc: BaseException, at: float, requests: Any) -> http.HttpError:
    """A requests error as ``http``'s: past the deadline (the reaper shut the socket down, or
    a socket timeout), ``TimedOut``."""
    if time.monotonic() >= at or isinstance(exc, requests.exceptions.Timeout):
        return http.TimedOut("no complete answer in time")
    if isinstance(exc, requests.exceptions.SSLError):
        return http.ConnectError(_root(exc), tls=True)
    if isinstance(exc, requests.exceptions.ConnectionError):
        return http.ConnectError(_root(exc))
    return http.HttpError(_root(exc))


# --- secrets ------------------------------------------------------------------------------


@functools.cache
def _defaults() -> dict[str, str]:
    """The headers every requests session sends unless told otherwise: no secret of the
    user's."""
    from requests.utils import default_headers

    return {k.lower(): v for k, v in default_headers().items()}


def header_secrets(name: str, value: str | bytes) -> list[str]:
    """What a header the user set must never show: its whole value (a tenant id or an API key
    is as secret as a token, as the command line's ``--header``), the credentials after
    an auth scheme (``Bearer <token>``), a ``Basic`` pair decoded, a ``Digest`` response,
    each cookie's value."""
    text = _text(value)
    scheme, _, rest = text.strip().partition(" ")
    if scheme.lower() == "digest":  # only the hash made with the password is a secret
        return re.findall(r'response="?([^",\s]+)', rest)
    out = [text]
    if rest.strip():
        out.append(rest.strip())
    if scheme.lower() == "basic":
        out += _basic_pair(rest.strip())
    if name.lower() == "cookie":
        out += [part.partition("=")[2].strip() for part in text.split(";")]
    return out


def _basic_pair(encoded: str) -> list[str]:
    """``user:password`` and the password, from a ``Basic`` header's base64."""
    try:
        pair = base64.b64decode(encoded, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return []
    return [pair, pair.partition(":")[2]]


def _auth_secrets(auth: Any) -> list[str]:
    """A requests auth's password and ``user:password`` (a tuple, ``HTTPBasicAuth``,
    ``HTTPDigestAuth``, or any auth with ``username`` and ``password``); what any other auth
    puts in a request is read from the request (``ConnectSource._note``)."""
    if isinstance(auth, (tuple, list)) and len(auth) == 2:
        user, password = auth
    elif hasattr(auth, "password"):
        user, password = getattr(auth, "username", ""), auth.password
    else:
        return []
    user, password = (_text(v) for v in (user, password))
    return [password, f"{user}:{password}"] if password else []


def _text(value: Any) -> str:
    """A header's or a credential's value as text (requests takes bytes too)."""
    return value.decode("latin-1") if isinstance(value, bytes) else str(value or "")


def _param_values(params: Any) -> list[str]:
    """The values of a session's ``params`` (a mapping, pairs, or a query string)."""
    if not params:
        return []
    if isinstance(params, (str, bytes)):
        return [v for _, v in parse_qsl(_text(params))]
    pairs = params.items() if isinstance(params, Mapping) else params
    out: list[str] = []
    for _, value in pairs:
        values = value if isinstance(value, (list, tuple)) else [value]
        out += [str(v) for v in values if v is not None]
    return out


def _secrets_of(connect: Any) -> list[str]:
    """What must never be shown, as configured: every header value the user set (on the
    ``PrometheusConnect`` or its session), the auths' passwords, the session's cookies and
    ``params``, the proxies' and the URL's user and password."""
    session = getattr(connect, "_session", None)
    found: list[str] = []
    for name, value in (getattr(connect, "headers", None) or {}).items():
        found += header_secrets(str(name), value)
    for name, value in (getattr(session, "headers", None) or {}).items():
        if value != _defaults().get(str(name).lower()):
            found += header_secrets(str(name), value)
    found += _auth_secrets(getattr(connect, "auth", None))
    found += _auth_secrets(getattr(session, "auth", None))
    found += [c.value for c in getattr(session, "cookies", None) or () if c.value]
    found += _param_values(getattr(session, "params", None))
    for url in (getattr(session, "proxies", None) or {}).values():
        found += userinfo_secrets(str(url)) if url else []
    found += userinfo_secrets(str(connect.url))
    return sorted({s for s in found if len(s) >= MIN_SECRET}, key=len, reverse=True)


# --- sessions whose sockets close at the deadline -----------------------------------------

_WATCH = threading.local()


class _Watch:
    """The sockets one try uses, each shut down by ``http.REAPER`` at the try's deadline."""

    def __init__(self, at: float):
        self.at = at
        self.keys: list[int] = []

    def add(self, target: Any) -> None:
        if target is not None:
            self.keys.append(http.REAPER.watch(target, self.at))

    def close(self) -> None:
        for key in self.keys:
            http.REAPER.forget(key)


@contextlib.contextmanager
def _watched(at: float) -> Iterator[None]:
    """Every connection this thread takes from a watching pool until the end is watched."""
    watch = _WATCH.current = _Watch(at)
    try:
        yield
    finally:
        _WATCH.current = None
        watch.close()


def _watch(target: Any) -> None:
    watch = getattr(_WATCH, "current", None)
    if watch is not None:
        watch.add(target)


@functools.cache
def _watching_pool(pool_cls: Any) -> Any:
    """A urllib3 pool class like ``pool_cls`` whose connections are watched while a try
    (``_watched``) uses them: the connection (its socket at the deadline, while it connects,
    also through a proxy's tunnel), then its socket itself (which the response keeps when
    the connection lets go of it, on an answer that closes the connection)."""
    if getattr(pool_cls, "watching", False):
        return pool_cls

    class Connection(pool_cls.ConnectionCls):  # type: ignore[misc]
        def connect(self) -> None:
            super().connect()
            _watch(self.sock)

    class Pool(pool_cls):  # type: ignore[misc]
        watching = True
        ConnectionCls = Connection

        def _get_conn(self, timeout: float | None = None) -> Any:
            conn = super()._get_conn(timeout)
            _watch(conn)
            _watch(getattr(conn, "sock", None))  # a kept-alive connection's
            return conn

    Pool.__name__ = Pool.__qualname__ = f"Watching{pool_cls.__name__}"
    return Pool


def _hook(manager: Any) -> Any:
    """``manager`` (a urllib3 pool or proxy manager) making watching pools."""
    classes = manager.pool_classes_by_scheme
    manager.pool_classes_by_scheme = {k: _watching_pool(v) for k, v in classes.items()}
    return manager


@functools.cache
def _watching_adapter(adapter_cls: Any) -> Any:
    """An ``HTTPAdapter`` class like ``adapter_cls`` whose pools, direct or through a proxy,
    are watching pools."""

    class Adapter(adapter_cls):  # type: ignore[misc]
        def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
            super().init_poolmanager(*args, **kwargs)
            _hook(self.poolmanager)

        def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
            return _hook(super().proxy_manager_for(proxy, **kwargs))

    Adapter.__name__ = Adapter.__qualname__ = f"Watching{adapter_cls.__name__}"
    return Adapter


def _watching_copy(adapter: Any, retries: Any = None) -> Any:
    """A copy of an ``HTTPAdapter`` (or of a subclass: a site's adapter with its own TLS
    context) with its own watching pools, and ``retries`` where given; the adapter itself as
    it is if it cannot be copied so."""
    try:
        twin = copy.copy(adapter)
        twin.__class__ = _watching_adapter(adapter.__class__)
        twin.proxy_manager = {}
        if retries is not None:
            twin.max_retries = retries
        twin.init_poolmanager(
            adapter._pool_connections, adapter._pool_maxsize, block=adapter._pool_block
        )
    except Exception:  # an adapter of the site's own kind that cannot be copied so
        return adapter
    return twin


def _watching_session(session: Any, requests: Any) -> Any:
    """A session like ``session`` (headers, auth, cookies, proxies, TLS settings, hooks and
    its adapters) whose ``HTTPAdapter``s close their sockets at each try's deadline, and do
    not retry where the plain ``HTTPAdapter`` would: the library mounts one that retries
    three times and sleeps whatever ``Retry-After`` says, past any deadline; retries are
    ``PrometheusSource``'s, under the deadline. An adapter of the user's own kind keeps its
    own retries."""
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    mine = requests.Session()
    for name in ("headers", "auth", "proxies", "hooks", "params", "stream", "verify", "cert"):
        setattr(mine, name, getattr(session, name))
    mine.cookies = session.cookies
    mine.trust_env = session.trust_env
    mine.max_redirects = session.max_redirects
    mine.adapters.clear()
    for prefix, adapter in session.adapters.items():
        if isinstance(adapter, HTTPAdapter):
            plain = type(adapter) is HTTPAdapter
            adapter = _watching_copy(adapter, Retry(0, read=False) if plain else None)
        mine.mount(prefix, adapter)
    return mine


def _bare_session(requests: Any) -> Any:
    """A session with nothing of the user's, for another origin: no headers beyond
    requests' own, no auth (nor ``~/.netrc``'s), a cookie jar that keeps none, watching
    adapters that do not retry."""
    from requests.adapters import HTTPAdapter

    bare = requests.Session()
    bare.trust_env = False
    bare.cookies.set_policy(DefaultCookiePolicy(allowed_domains=[]))
    for prefix in ("https://", "http://"):
        bare.mount(prefix, _watching_copy(HTTPAdapter(max_retries=0)))
    return bare


def _root(exc: BaseException) -> str:
    """The first cause of a requests error in a few words (``connection refused``), without
    the URL and query that the library's own message quotes."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    deepest: BaseException = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        deepest = cause
        nxt = cause.__cause__ or cause.__context__
        if nxt is None:
            reason = getattr(cause, "reason", None)
            nxt = reason if isinstance(reason, BaseException) else None
            if nxt is None and cause.args and isinstance(cause.args[0], BaseException):
                nxt = cause.args[0]
        cause = nxt
    if "refused" in str(deepest).lower():  # urllib3 wraps ECONNREFUSED in its own error
        return "connection refused"
    return http.describe(deepest) if isinstance(deepest, OSError) else type(deepest).__name__


__all__ = ["ConnectSource", "redact_url"]
