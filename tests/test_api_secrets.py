"""The Python API with a ``PrometheusConnect``, on real loopback servers: no secret it or its
session carries is shown in a ``SourceError`` in any encoding a server echoes it in, none goes
to another origin, and the deadline holds however a server drips."""

from __future__ import annotations

import base64
import html
import json
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import pytest
import requests
from loopback import EMPTY, Faulty, answer, drip, elapsed, serve
from prometheus_api_client import PrometheusConnect
from requests.auth import AuthBase, HTTPBasicAuth, HTTPDigestAuth

import diagnoser
from diagnoser.plumbing.source import SourceError

END = 1_700_000_000.0
# What every request carries that is servediag's or requests' own: not echoed.
OWN_HEADERS = {"host", "user-agent", "accept", "accept-encoding", "connection", "content-length"}
OWN_PARAMS = {"query", "start", "end", "step", "time"}

ENCODE: dict[str, Callable[[str], str]] = {
    "plain": lambda t: t,
    "url": lambda t: quote(t, safe=""),
    "json": lambda t: json.dumps(t)[1:-1].replace("/", "\\/"),
    "html": html.escape,
    "base64": lambda t: base64.b64encode(t.encode()).decode(),
}


def _echoed(h: Any) -> str:
    """What of a request an error page quotes: each header and query parameter the user's
    settings added (a Digest header by its response, which is what a long one is cut to)."""
    said = []
    for name, value in h.headers.items():
        if name.lower() in OWN_HEADERS:
            continue
        if value.startswith("Digest "):
            value = "Digest " + re.search(r'response="[^"]*"', value).group(0)
        said.append(f"{name}: {value}")
    query = urlsplit(h.path).query
    said += [f"{k}={v}" for k, v in parse_qsl(query) if k not in OWN_PARAMS]
    return " | ".join(said)


def _echo(encoding: str) -> Callable[[Any, Faulty], None]:
    """A server (or proxy) that refuses every request with a page quoting it in one encoding;
    a Digest challenge first where no credential came."""

    def respond(h: Any, f: Faulty) -> None:
        if not h.headers.get("Authorization") and "digest" in h.path:
            challenge = 'Digest realm="prom", nonce="n0nce", qop="auth"'
            answer(h, b"", 401, {"WWW-Authenticate": challenge})
            return
        page = f"denied: {ENCODE[encoding](_echoed(h))}"
        answer(h, page.encode(), 401, {"Content-Type": "text/plain"})

    return respond


def _shown(text: str, secret: str) -> list[str]:
    """The encodings in which ``secret`` shows in ``text``: the five, and base64 inside a
    longer base64 text at any alignment."""
    forms = {name: encode(secret) for name, encode in ENCODE.items()}
    found = [name for name, form in forms.items() if form in text]
    for run in re.findall(r"[A-Za-z0-9+/]{6,}", text):
        for shift in range(4):
            padded = "A" * shift + run
            padded = padded[: len(padded) - len(padded) % 4]
            if secret.encode() in base64.b64decode(padded):
                found.append("base64-inside")
    return found


class Signed(AuthBase):
    """A site's own auth: a header of its own on every request."""

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        r.headers["X-Signature"] = "sig-custom-2468"
        return r


def _session(**settings: Any) -> requests.Session:
    s = requests.Session()
    for name, value in settings.items():
        if name == "cookie":
            s.cookies.set("sid", value)
        elif name == "header":
            s.headers["X-Api-Key"] = value
        else:
            setattr(s, name, value)
    return s


# Each way a secret reaches a PrometheusConnect: (its settings for the echo server's URL,
# the secrets that must not show).
WAYS: dict[str, Callable[[str], tuple[dict[str, Any], list[str]]]] = {
    "connect-header": lambda u: (
        {"url": u, "headers": {"X-Scope-OrgID": "tenant-secret-77"}},
        ["tenant-secret-77"],
    ),
    "connect-bearer": lambda u: (
        {"url": u, "headers": {"Authorization": "Bearer tok/en+98765"}},
        ["tok/en+98765"],
    ),
    "session-header": lambda u: (
        {"url": u, "session": _session(header="key-sess-4321")},
        ["key-sess-4321"],
    ),
    "connect-auth-tuple": lambda u: (
        {"url": u, "auth": ("alice", "pw-tuple-123")},
        ["pw-tuple-123", "alice:pw-tuple-123"],
    ),
    "connect-basic-auth": lambda u: (
        {"url": u, "auth": HTTPBasicAuth("alice", "pw-basic-456")},
        ["pw-basic-456", "alice:pw-basic-456"],
    ),
    "connect-digest-auth": lambda u: (
        {"url": u + "/digest", "auth": HTTPDigestAuth("alice", "pw-digest-321")},
        ["pw-digest-321"],  # and the response made with it, as the server saw it
    ),
    "connect-custom-auth": lambda u: ({"url": u, "auth": Signed()}, ["sig-custom-2468"]),
    "session-auth": lambda u: (
        {"url": u, "session": _session(auth=("bob", "pw-sess-789"))},
        ["pw-sess-789", "bob:pw-sess-789"],
    ),
    "session-cookie": lambda u: (
        {"url": u, "session": _session(cookie="cookie-secret-55")},
        ["cookie-secret-55"],
    ),
    "session-params": lambda u: (
        {"url": u, "session": _session(params={"api_key": "param-secret-66"})},
        ["param-secret-66"],
    ),
    "url-userinfo": lambda u: (
        {"url": u.replace("://", "://carol:pw-url-8642@")},
        ["pw-url-8642", "carol:pw-url-8642"],
    ),
    "connect-proxy": lambda u: (
        {
            "url": "http://prometheus.example:9090",
            "proxy": {"http": u.replace("://", "://puser:ppass-1357@")},
        },
        ["ppass-1357", "puser:ppass-1357"],
    ),
    "session-proxy": lambda u: (
        {
            "url": "http://prometheus.example:9090",
            "session": _session(proxies={"http": u.replace("://", "://suser:spass-9753@")}),
        },
        ["spass-9753", "suser:spass-9753"],
    ),
}


def _query(pc: PrometheusConnect, timeout: float = 5.0) -> Any:
    source = diagnoser.connect(pc, timeout=timeout).operation()
    return source.query_range("up", END - 600, END, 60)


@pytest.mark.parametrize("encoding", sorted(ENCODE))
@pytest.mark.parametrize("way", sorted(WAYS))
def test_no_secret_is_shown_in_any_encoding_a_server_echoes_it_in(way, encoding, monkeypatch):
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    with serve(_echo(encoding)) as srv:
        settings, secrets = WAYS[way](srv.url)
        out = elapsed(lambda: _query(PrometheusConnect(**settings)))[1]
    assert srv.seen, "no request arrived"
    last = srv.seen[-1]
    if way == "connect-digest-auth":  # the password itself never goes out
        secrets = [re.search(r'response="([^"]+)"', last.headers["Authorization"]).group(1)]
    for secret in secrets:
        assert secret in _sent(last.headers, last.path), (way, secret)
    text = str(out)
    assert isinstance(out, SourceError) and "HTTP 401" in text, text
    assert "***" in text, text  # the echo is in the message, blanked out
    for secret in secrets:
        assert not _shown(text, secret), (secret, _shown(text, secret), text)


def _sent(headers: dict[str, str], path: str) -> str:
    """What a request carried, a Basic pair decoded."""
    out = [path, *headers.values()]
    for value in headers.values():
        if value.startswith("Basic "):
            out.append(base64.b64decode(value.split()[1]).decode())
    return " ".join(out)


def test_a_redirect_to_another_origin_carries_nothing_of_the_users():
    """A 307 to another port: none of the session's auth, headers, cookies or params, nor the
    connect's headers and auth, arrive there; the query is answered from there."""
    with serve(lambda h, f: answer(h, EMPTY)) as other:
        target = f"{other.url}/api/v1/query_range?query=up&start=1&end=2&step=60s"
        with serve(lambda h, f: answer(h, b"", 307, {"Location": target})) as first:
            session = _session(
                auth=("bob", "pw-sess-789"),
                header="key-sess-4321",
                cookie="cookie-secret-55",
                params={"api_key": "param-secret-66"},
            )
            session.headers["X-Scope-OrgID"] = "tenant-sess-11"
            pc = PrometheusConnect(
                url=first.url, headers={"X-Tenant": "tenant-connect-22"}, session=session
            )
            assert _query(pc) == []
    sent = first.seen[0]
    assert sent.headers["Authorization"].startswith("Basic ")
    assert sent.headers["X-Tenant"] == "tenant-connect-22"
    assert "sid=cookie-secret-55" in sent.headers["Cookie"] and "param-secret-66" in sent.path
    assert len(other.seen) == 1
    arrived = other.seen[0]
    names = {k.lower() for k in arrived.headers}
    assert not names & {"authorization", "cookie", "x-api-key", "x-scope-orgid", "x-tenant"}
    assert not re.search("sess|secret|tenant|pw-", json.dumps([arrived.headers, arrived.path]))


def test_a_custom_auth_goes_to_its_origin_only():
    with serve(lambda h, f: answer(h, EMPTY)) as other:
        target = f"{other.url}/api/v1/query_range?query=up&start=1&end=2&step=60s"
        with serve(lambda h, f: answer(h, b"", 307, {"Location": target})) as first:
            assert _query(PrometheusConnect(url=first.url, auth=Signed())) == []
    assert first.seen[0].headers["X-Signature"] == "sig-custom-2468"
    assert "X-Signature" not in other.seen[0].headers


# --- the deadline -----------------------------------------------------------------------

BODY = json.dumps(EMPTY).encode() + b" " * 40  # ~110 bytes: ~22 s at 0.2 s a byte


def _slow_headers(h: Any, f: Faulty) -> None:
    """The status line and headers a byte every 0.2 s (~20 s), then an answer."""
    head = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + b"p" * 40
    for i in range(len(head)):
        if f.release.wait(0.2):
            return
        h.wfile.write(head[i : i + 1])
        h.wfile.flush()
    h.wfile.write(b"\r\n\r\n" + json.dumps(EMPTY).encode())


@pytest.mark.parametrize(
    ("respond", "proxied"),
    [
        (lambda h, f: drip(h, f, BODY, 0.2), False),
        (_slow_headers, False),
        (lambda h, f: drip(h, f, BODY, 0.2), True),
    ],
    ids=["body", "headers", "body-through-a-proxy"],
)
def test_a_server_that_drips_is_cut_at_the_deadline(respond, proxied, monkeypatch):
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with serve(respond) as srv:
        if proxied:
            pc = PrometheusConnect(url="http://prometheus.example:9090", proxy={"http": srv.url})
        else:
            pc = PrometheusConnect(url=srv.url)
        took, out = elapsed(lambda: _query(pc, timeout=2))
    assert srv.seen, "no request arrived"
    assert isinstance(out, SourceError), out
    assert "did not answer a query_range within 2 s" in str(out)
    assert took < 3, took  # ~22 s (the whole drip) before
