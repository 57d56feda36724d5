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
"""

from __future__ import annotations

import time
from typing import Any

from diagnoser.plumbing import http
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
        self._session = _without_retries(connect._session, requests)
        self._requests = requests

    def _send(
        self,
        url: str,
        at: float,
        headers: dict[str, str],
        form: bytes | None = None,
        lease: http.Lease | None = None,
    ) -> http.Response:
        """One try with the ``PrometheusConnect``'s session, headers and auth (to its own
        origin only: a redirect elsewhere goes without them), finished by ``at``: a GET, or a
        POST of ``form`` for a query too long for a URL; the answer's bytes are drawn from
        ``lease`` as they arrive, as the command line's client draws them."""
        requests = self._requests
        c = self.connect
        own = http.origin(url) == http.origin(self.base)
        left = at - time.monotonic()
        if left <= 0:
            raise http.TimedOut("no time left")
        try:
            resp = self._session.request(
                "POST" if form else "GET",
                url,
                data=form,
                headers={**headers, **(c.headers or {})} if own else headers,
                auth=c.auth if own else None,
                timeout=(left, left),
                allow_redirects=False,
                stream=True,
            )
        except requests.exceptions.Timeout:
            raise http.TimedOut("no answer in time") from None
        except requests.exceptions.SSLError as exc:
            raise http.ConnectError(_root(exc), tls=True) from None
        except requests.exceptions.ConnectionError as exc:
            raise http.ConnectError(_root(exc)) from None
        except requests.exceptions.RequestException as exc:
            raise http.HttpError(_root(exc)) from None
        try:
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
            except requests.exceptions.RequestException as exc:
                if time.monotonic() >= at:
                    raise http.TimedOut("no complete answer in time") from None
                raise http.HttpError(_root(exc)) from None
            return http.Response(resp.status_code, got, body)
        finally:
            resp.close()

    def _secrets(self) -> tuple[str, ...]:
        """The ``PrometheusConnect``'s secrets too, blanked out in any encoding a server
        echoes them in, as the command line's are."""
        return (*self._held, *super()._secrets())


def _secrets_of(connect: Any) -> list[str]:
    """What must never be shown: the auth tuple's password, every header's value that
    carries a credential, and the URL's password."""
    from urllib.parse import urlsplit

    found: list[str] = []
    auth = getattr(connect, "auth", None)
    if isinstance(auth, tuple) and len(auth) == 2 and auth[1]:
        found.append(str(auth[1]))
    session = getattr(connect, "_session", None)
    for headers in (getattr(connect, "headers", None), getattr(session, "headers", None)):
        for name, value in (headers or {}).items():
            if str(name).lower() in ("authorization", "proxy-authorization", "cookie", "x-api-key"):
                text = str(value)
                found.append(text)
                found += [part for part in text.split() if len(part) >= 8]
    password = urlsplit(str(connect.url)).password
    if password:
        found.append(password)
    return sorted(set(found), key=len, reverse=True)


def _without_retries(session: Any, requests: Any) -> Any:
    """A session like ``session`` (headers, auth, cookies, proxies, TLS settings, hooks and
    its adapters) whose plain ``HTTPAdapter``s do not retry: the library mounts one that
    retries three times and sleeps whatever ``Retry-After`` says, past any deadline; retries
    are ``PrometheusSource``'s, under the deadline. An adapter of the user's own kind is
    kept as it is."""
    from requests.adapters import HTTPAdapter

    mine = requests.Session()
    for name in ("headers", "auth", "proxies", "hooks", "params", "stream", "verify", "cert"):
        setattr(mine, name, getattr(session, name))
    mine.cookies = session.cookies
    mine.trust_env = session.trust_env
    mine.max_redirects = session.max_redirects
    mine.adapters.clear()
    for prefix, adapter in session.adapters.items():
        if type(adapter) is HTTPAdapter:
            adapter = HTTPAdapter(max_retries=0)
        mine.mount(prefix, adapter)
    return mine


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
