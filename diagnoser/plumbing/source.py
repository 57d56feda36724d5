"""Where series come from: a Prometheus-compatible HTTP API, behind one small interface.

Only ``/api/v1/query`` and ``/api/v1/query_range`` are used, so Prometheus, Thanos, Mimir,
Cortex and VictoriaMetrics all work. Failures become ``SourceError`` with a one-line
message that never contains a credential; the CLI exits 3 on it. The HTTP itself is
``plumbing.http``: one deadline per query or per operation (a whole diagnosis), bounded answers.
"""

from __future__ import annotations

import base64
import copy
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlencode, urljoin, urlsplit, urlunsplit

import numpy as np

from diagnoser.plumbing import http
from diagnoser.plumbing.answer import Answer, BadAnswer, decode
from diagnoser.plumbing.durations import LATEST
from diagnoser.plumbing.errors import UserError, read_bytes
from diagnoser.plumbing.redact import MIN_SECRET, redactor

# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 11_000
MIB = 1 << 20
MAX_ANSWER_BYTES = 64 * MIB  # an answer, decompressed (--max-response-mb)
# What one answer may hold, its body and its series once read, in answers' bytes: its series
# take at most twice its body in points (16 bytes for a point of at least 8), more in labels.
ANSWER_SHARE = 5
MAX_TOKEN_BYTES = 64 * 1024  # a bearer token is a line, not a file of any size
MAX_WARNINGS = 20
# What of a server's text (an error page, an error or a warning) is read for the one line
# shown: the line is a few hundred characters, and every form of every secret is looked for
# in what is read (see ``plumbing.redact``).
MAX_SHOWN = 4096
MAX_REDIRECTS = 5
# A query longer than this goes in a POST form rather than the URL: servers refuse request
# lines of more than 8 to 64 KiB, and a lookback over thousands of models names them all.
MAX_URL = 8192
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
RETRIES = 2  # after a refused connection, or a 429, 502, 503 or 504
RETRY_STATUSES = (429, 502, 503, 504)
RETRY_PAUSE = 0.2  # doubled at each retry, unless the server says how long (Retry-After)
MIN_TRY = 0.05  # a retry is not started with less time than this left
BASE_HEADERS = {
    "Accept": "application/json",
    "Accept-Encoding": "gzip",
    "User-Agent": "servediag",
}


class SourceError(Exception):
    """The metric source cannot be reached or answered something unusable."""


# What stores say when a query would read more than they allow: Prometheus and Thanos
# (--query.max-samples), VictoriaMetrics (-search.maxSamplesPerQuery, -search.maxUniqueTimeseries,
# -search.maxSeries, -search.maxPointsPerTimeseries), Mimir and Cortex (per-query series, chunk
# and sample limits).
OVER_LIMIT = re.compile(
    r"too many samples|maxSamplesPerQuery|maxUniqueTimeseries|search\.maxSeries"
    r"|maxPointsPerTimeseries|exceeded the maximum number of|max number of series"
    r"|max-fetched-|err-mimir-max-|limit of \d+ (?:series|samples|chunks)",
    re.IGNORECASE,
)


class OverLimit(SourceError):
    """A store refused a query as reading more samples or series than it allows; the query
    that asked is named where it is known (``about``)."""

    def __init__(self, shown: str, what: str, said: str, about: str = ""):
        self.shown, self.what, self.said = shown, what, said
        subject = f"the {what} for {about}" if about else f"a {what}"
        super().__init__(
            f"{shown} refused {subject} as more than its query limits allow ({said}); "
            "narrow the diagnosis: --model or --match for fewer series, a shorter --since "
            "(or --lookback) for fewer samples"
        )

    def about(self, name: str) -> OverLimit:
        return OverLimit(self.shown, self.what, self.said, name)


@dataclass
class Series:
    labels: dict[str, str]
    t: np.ndarray
    v: np.ndarray


class MetricSource(Protocol):
    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]: ...

    def query(self, expr: str, at: float) -> list[Series]: ...


def bad_url(url: str) -> str | None:
    """What makes ``url`` no Prometheus URL, as the end of a message naming it (``'ftp://x'
    is not an http:// or https:// URL``, ``'http://h:99999': Port out of range 0-65535``),
    or None: the command line's options and ``diagnoser.connect`` say it alike."""
    shown = repr(redact_url(url))
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a port out of range)
    except ValueError as exc:
        return f"{shown}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{shown} is not an http:// or https:// URL"
    return None


def redact_url(url: str) -> str:
    """The URL without user:password@ (safe for messages), also when it does not parse."""
    try:
        parts = urlsplit(url)
    except ValueError:  # "http://u:p@[::1": cut the user info out of the text itself
        scheme, sep, rest = url.partition("://")
        if not sep:
            scheme, rest = "", url
        netloc, slash, path = rest.partition("/")
        return f"{scheme}{sep}{netloc.rpartition('@')[2]}{slash}{path}"
    if "@" in parts.netloc:
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    return urlunsplit(parts)


@dataclass
class Auth:
    bearer_token: str | None = None
    basic: tuple[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ca_file: str | None = None
    insecure: bool = False

    def credentials(self) -> dict[str, str]:
        """The request headers that carry credentials: ``Authorization`` and every custom
        header (a tenant id or an API key is as secret as a token)."""
        out = dict(self.headers)
        if self.basic:
            out["Authorization"] = "Basic " + _basic(*self.basic)
        elif self.bearer_token:
            out["Authorization"] = f"Bearer {self.bearer_token}"
        return out

    def secrets(self) -> list[str]:
        """What to blank out of any text shown, in any encoding (``plumbing.redact``): each
        secret of at least ``MIN_SECRET`` characters (shorter ones would blank out ordinary
        words; servediag's own messages never contain a credential), and the base64 form of
        basic credentials."""
        out = [*self.headers.values()]
        if self.bearer_token:
            out.append(self.bearer_token)
        if self.basic:
            out += [self.basic[1], _basic(*self.basic)]
        return sorted({s for s in out if len(s) >= MIN_SECRET}, key=len, reverse=True)


def _basic(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def one_operation(source: MetricSource, timeout: float | None = None) -> MetricSource:
    """``source`` with one deadline for every query made through it from now on (a
    Prometheus source's ``timeout``, or ``timeout`` where given); other sources as they are."""
    return source.operation(timeout) if isinstance(source, PrometheusSource) else source


def deadline_of(source: MetricSource) -> float | None:
    """The ``time.monotonic()`` by which the operation ``source`` is (``one_operation``)
    must be done, or None: the work on its answers (what-if's replays) keeps it too."""
    return source.deadline if isinstance(source, PrometheusSource) else None


def sharing_deadline(source: MetricSource) -> MetricSource:
    """``source`` for a further part of its operation: the same deadline, its warnings
    collected apart (what-if under a diagnosis: one ``--timeout`` for the whole command)."""
    if not isinstance(source, PrometheusSource) or source.deadline is None:
        return one_operation(source)
    op = source.operation()
    op.timeout, op.deadline = source.timeout, source.deadline
    return op


def in_time(source: MetricSource) -> None:
    """``SourceError`` once the operation's deadline (``one_operation``) has passed: it
    bounds the work on the answers too (the webhook's diagnosis of a fleet of thousands of
    models once wrote its record 55 s into a ``--timeout`` of 10 s)."""
    if not isinstance(source, PrometheusSource) or source.deadline is None:
        return
    if time.monotonic() > source.deadline:
        raise SourceError(
            f"the diagnosis did not finish within {source.timeout:g} s (--timeout: the time "
            "for all of a diagnosis's queries and the work on their answers)"
        )


def warnings_of(source: MetricSource) -> list[str]:
    """The warnings the source's answers carried (a partial answer from Thanos or Mimir)."""
    return list(source.warnings) if isinstance(source, PrometheusSource) else []


class PrometheusSource:
    """A Prometheus HTTP API over ``plumbing.http``: a deadline per query (``timeout``), or one
    for a whole operation (``operation()``), covering the connection, the answer, retries,
    ``Retry-After`` and the reading of the answer's series; answers at most ``max_bytes``
    long once decompressed; credentials sent only to the URL's origin (a redirect elsewhere
    goes without them).

    Memory is bounded across the queries that run at once, not only per answer: the bodies
    being read and the series being made of them draw from one ``http.Budget`` of
    ``max_bytes``, shared by every operation of the source (a diagnosis runs eight queries at
    once, the webhook several diagnoses). Past it, one answer goes on and the others wait
    for it, within their deadline (``plumbing.answer`` reads an answer's series into arrays with
    memory in proportion to its points, about its body's size, where ``json`` took ten
    times it)."""

    def __init__(
        self,
        url: str,
        auth: Auth | None = None,
        timeout: float = 30.0,
        max_bytes: int = MAX_ANSWER_BYTES,
    ):
        parts = urlsplit(url.rstrip("/"))
        self.auth = auth or Auth()
        if parts.username is not None and self.auth.basic is None and not self.auth.bearer_token:
            user_pass = (unquote(parts.username), unquote(parts.password or ""))
            self.auth = replace(self.auth, basic=user_pass)
        self.url = url.rstrip("/")
        self.base = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        self.shown = redact_url(self.url)
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.deadline: float | None = None
        self.warnings: list[str] = []
        self._lock = threading.Lock()
        self.budget = http.Budget(max_bytes)

    def operation(self, timeout: float | None = None) -> PrometheusSource:
        """A copy whose queries share one deadline, ``timeout`` seconds from now (this
        source's own where not given; the copy keeps it for its own operations), and collect
        their warnings apart."""
        op = copy.copy(self)
        if timeout is not None:
            op.timeout = timeout
        op.deadline = time.monotonic() + op.timeout
        op.warnings = []
        op._lock = threading.Lock()
        return op

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        points = (end - start) / step
        if points > MAX_POINTS:
            raise SourceError(
                f"{points:.0f} points per series exceed Prometheus's "
                f"{MAX_POINTS}; use a larger step"
            )
        params = {"query": expr, "start": round(start), "end": round(end), "step": f"{step:g}s"}
        return self._get("query_range", "/api/v1/query_range", params)

    def query(self, expr: str, at: float) -> list[Series]:
        return self._get("query", "/api/v1/query", {"query": expr, "time": at})

    def _get(self, what: str, path: str, params: dict[str, Any]) -> list[Series]:
        """The series of one query, its answer held in the budget until they are made."""
        leases: list[http.Lease] = []
        try:
            return self._ask(what, path, params, leases)
        finally:
            for lease in leases:
                lease.close()

    def _ask(
        self, what: str, path: str, params: dict[str, Any], leases: list[http.Lease]
    ) -> list[Series]:
        at = self.deadline if self.deadline is not None else time.monotonic() + self.timeout
        url, form = f"{self.base}{path}?{urlencode(params)}", None
        if len(url) > MAX_URL:
            url, form = f"{self.base}{path}", urlencode(params).encode()
        credentials = self.auth.credentials()
        retries = redirects = 0
        while True:
            lease = self._lease(at, leases)
            headers = {**BASE_HEADERS, **(FORM if form else {}), **credentials}
            try:
                resp = self._send(url, at, headers, form, lease)
            except http.TimedOut:
                raise self._timed_out(what) from None
            except http.TooLarge:
                raise SourceError(
                    f"{self.shown} answered a {what} with more than "
                    f"{self.max_bytes / MIB:g} MiB, the limit (--max-response-mb); narrow "
                    "the query (--since, --model) or raise the limit"
                ) from None
            except http.ConnectError as exc:
                if not exc.tls and retries < RETRIES and http.pause(RETRY_PAUSE, at, MIN_TRY):
                    retries += 1
                    continue
                head = "TLS failed talking to" if exc.tls else "cannot reach"
                raise SourceError(self._clean(f"{head} {self.shown}: {exc}")) from None
            except http.HttpError as exc:
                raise SourceError(self._clean(f"request to {self.shown} failed: {exc}")) from None
            if resp.status in http.REDIRECTS and resp.headers.get("location"):
                redirects += 1
                target = urljoin(url, resp.headers["location"])
                if redirects > MAX_REDIRECTS or urlsplit(target).scheme not in ("http", "https"):
                    raise SourceError(
                        f"{self.shown} answered a {what} with a redirect that was not followed "
                        f"({'too many' if redirects > MAX_REDIRECTS else 'not to http(s)'})"
                    )
                if http.origin(target) != http.origin(url):
                    credentials = {}  # credentials stay with the origin they were given for
                url = target
                continue
            note = ""
            if resp.status in RETRY_STATUSES and retries < RETRIES:
                asked = http.retry_after(resp.headers.get("retry-after"))
                pause = RETRY_PAUSE * 2**retries if asked is None else asked
                if http.pause(pause, at, MIN_TRY):
                    retries += 1
                    continue
                if asked is not None:
                    left = max(0.0, at - time.monotonic())
                    note = f" (it asked to retry after {asked:g} s; {left:.1f} s were left)"
            return self._result(what, resp, note, at, lease)

    def _send(
        self, url: str, at: float, headers: dict[str, str], form: bytes | None, lease: http.Lease
    ) -> http.Response:
        """One try, finished by ``at``, its answer held under ``lease``: a GET, or a POST of
        ``form`` for a query too long for a URL (``plumbing.connect`` sends with a
        ``PrometheusConnect``'s session instead)."""
        return http.request(
            "POST" if form else "GET",
            url,
            at,
            headers,
            form,
            max_bytes=self.max_bytes,
            ca_file=self.auth.ca_file,
            insecure=self.auth.insecure,
            lease=lease,
        )

    def _lease(self, at: float, leases: list[http.Lease]) -> http.Lease:
        """A lease for one try's answer, from the budget the queries running at once share,
        given back with the answer of the try before (left for a retry or a redirect)."""
        for held in leases:
            held.close()
        leases.append(self.budget.lease(at, ANSWER_SHARE * self.max_bytes))
        return leases[-1]

    def _result(
        self, what: str, resp: http.Response, note: str, at: float, lease: http.Lease
    ) -> list[Series]:
        bad: BadAnswer | None = None
        try:
            answer: Answer | None = decode(resp.body, at, lease)
        except BadAnswer as exc:
            answer, bad = None, exc
        except http.TimedOut:
            raise self._timed_out(what) from None
        except http.TooLarge:
            raise SourceError(
                f"{self.shown} answered a {what} whose series take more than "
                f"{lease.most / MIB:g} MiB once read ({ANSWER_SHARE} times --max-response-mb); "
                "narrow the query (--since, --model) or raise the limit"
            ) from None
        if resp.status != 200:
            hint = _error_text(answer, self._clean) or _body_hint(resp.body, self._clean)
            if OVER_LIMIT.search(hint):
                raise OverLimit(self.shown, what, self._clean(f"HTTP {resp.status}: {hint}"))
            raise SourceError(
                self._clean(f"{self.shown} answered HTTP {resp.status} to a {what}: {hint}{note}")
            )
        if bad is not None and bad.series:
            raise SourceError("the answer's series are not in Prometheus's format")
        if answer is None or answer.status not in ("success", "error"):
            raise SourceError(
                f"{self.shown} answered a {what} with something that is not Prometheus API JSON"
            )
        if answer.status == "error":
            text = _error_text(answer, self._clean) or "no error text"
            if OVER_LIMIT.search(text):
                raise OverLimit(self.shown, what, self._clean(text))
            raise SourceError(self._clean(f"{self.shown} answered a {what} with an error: {text}"))
        for w in answer.warnings:
            self._warn(_one_line(self._clean(w), 300))
        if answer.result is None:
            raise SourceError(f"{self.shown} answered a {what} without a result list")
        dated, undated = [], []
        for labels, t, v in answer.result:
            ok = (t >= 0) & (t <= LATEST)
            if ok.all():
                dated.append(Series(labels, t, v))
            else:
                undated.append(float(t[~ok][0]))
        if undated:  # a time of 1e18 s is no date: turned into one (an onset), it overflows
            self._warn(
                f"{self.shown} answered a {what} with {len(undated)} series whose times are "
                f"not dates between 1970 and 9999 (one at {undated[0]:g} s); they were left out"
            )
        return dated

    def _warn(self, line: str) -> None:
        """One warning for the operation's report, once, among the first ``MAX_WARNINGS``."""
        with self._lock:
            if line not in self.warnings and len(self.warnings) < MAX_WARNINGS:
                self.warnings.append(line)

    def _timed_out(self, what: str) -> SourceError:
        if self.deadline is not None:
            return SourceError(
                f"{self.shown} did not answer a {what} within {self.timeout:g} s "
                "(--timeout: the time for all of the operation's queries)"
            )
        return SourceError(f"{self.shown} did not answer a {what} within {self.timeout:g} s")

    def _clean(self, text: str, most: int = MAX_SHOWN) -> str:
        """At most ``most`` characters of ``text`` (from a server, or a message quoting one)
        without the URL's credentials and without any secret the process holds, in any
        encoding: the source's (token, basic credentials, headers) and the proxy's from the
        environment (``HTTP_PROXY``, ``HTTPS_PROXY``: a proxy's 407 page shows them)."""
        return redactor(self._secrets()).head(text.replace(self.url, self.shown), most)

    def _secrets(self) -> tuple[str, ...]:
        return (*self.auth.secrets(), *http.proxy_secrets())


def _one_line(text: str, most: int) -> str:
    """Text from a server as one printable line."""
    return " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())[:most]


def _error_text(answer: Answer | None, clean: Callable[[str], str]) -> str:
    """Prometheus's error text (``errorType: error``) from an answer, if it has one, with
    ``clean`` applied before it is cut short (so no part of a secret is left)."""
    if answer is None or answer.error is None:
        return ""
    kind = answer.error_type
    text = f"{kind}: {answer.error}" if kind else answer.error
    return _one_line(clean(text), 300)


def _body_hint(body: bytes | bytearray, clean: Callable[[str], str]) -> str:
    """The start of an answer's body as one line (a page of megabytes is not read whole:
    ``clean`` keeps what it shows of the text it is given)."""
    head = bytes(body[: 4 * MAX_SHOWN + (1 << 16)]).decode("utf-8", "replace")
    return _one_line(clean(head), 120) or "no body"


def read_token(path: Path, option: str) -> str:
    """A token file's first line; a file too big, binary, of several lines or not a regular
    file (a FIFO would block the read) is refused with ``UserError`` (bad usage: exit status
    2)."""

    def error(p: Path, where: str, message: str) -> UserError:
        unreadable = message.removeprefix("cannot read: ")  # said as "cannot read OPTION FILE"
        if unreadable != message:
            return UserError(f"cannot read {option} {p}: {unreadable}")
        return UserError(f"{option} {p}: {message}")

    raw = read_bytes(path, error, MAX_TOKEN_BYTES)
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise UserError(f"{option} {path}: not UTF-8 text") from None
    if "\n" in text or "\r" in text:
        raise UserError(f"{option} {path}: holds more than one line")
    return text
