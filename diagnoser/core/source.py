"""Where series come from: a Prometheus-compatible HTTP API, behind one small interface.

Only ``/api/v1/query`` and ``/api/v1/query_range`` are used, so Prometheus, Thanos, Mimir,
Cortex and VictoriaMetrics all work. Failures become ``SourceError`` with a one-line
message that never contains a credential; the CLI exits 3 on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import numpy as np

# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS = 11_000


class SourceError(Exception):
    """The metric source cannot be reached or answered something unusable."""


@dataclass
class Series:
    labels: dict[str, str]
    t: np.ndarray
    v: np.ndarray


class MetricSource(Protocol):
    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]: ...

    def query(self, expr: str, at: float) -> list[Series]: ...


def redact_url(url: str) -> str:
    """The URL without user:password@ (safe for messages)."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        parts = parts._replace(netloc=host)
    return urlunsplit(parts)


@dataclass
class Auth:
    bearer_token: str | None = None
    basic: tuple[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ca_file: str | None = None
    insecure: bool = False

    def secrets(self) -> list[str]:
        out = [v for v in self.headers.values() if v]
        if self.bearer_token:
            out.append(self.bearer_token)
        if self.basic:
            out.append(self.basic[1])
        return out


class PrometheusSource:
    """A Prometheus HTTP API, through ``prometheus-api-client``."""

    def __init__(self, url: str, auth: Auth | None = None, timeout: float = 30.0):
        import requests
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        self.url = url.rstrip("/")
        self.shown = redact_url(self.url)
        self.auth = auth or Auth()
        self.timeout = timeout
        headers = dict(self.auth.headers)
        if self.auth.bearer_token:
            headers["Authorization"] = f"Bearer {self.auth.bearer_token}"
        session = requests.Session()
        session.verify = self.auth.ca_file or not self.auth.insecure
        self._client = PrometheusConnect(
            url=self.url,
            headers=headers or None,
            auth=self.auth.basic,
            session=session,
            timeout=timeout,
            retry=Retry(
                total=2,
                connect=1,
                read=0,
                status=1,
                backoff_factor=0.2,
                status_forcelist=(502, 503, 504),
            ),
        )

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        points = (end - start) / step
        if points > MAX_POINTS:
            raise SourceError(
                f"{points:.0f} points per series exceed Prometheus's "
                f"{MAX_POINTS}; use a larger step"
            )
        result = self._call(
            "query_range",
            self._client.custom_query_range,
            expr,
            datetime.fromtimestamp(start, timezone.utc),
            datetime.fromtimestamp(end, timezone.utc),
            f"{step:g}s",
        )
        return [_series(r, expr) for r in result]

    def query(self, expr: str, at: float) -> list[Series]:
        result = self._call("query", self._client.custom_query, expr, params={"time": at})
        return [_series(r, expr) for r in result]

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException

        try:
            result = fn(*args, **kwargs)
        except requests.exceptions.Timeout:
            raise self._timed_out(what) from None
        except requests.exceptions.SSLError as exc:
            raise SourceError(
                self._clean(f"TLS failed talking to {self.shown}: {_first_line(exc)}")
            ) from None
        except requests.exceptions.ConnectionError as exc:
            if "timed out" in str(exc).lower():  # a read timeout, wrapped by urllib3's retry
                raise self._timed_out(what) from None
            reason = "connection refused" if "refused" in str(exc).lower() else _first_line(exc)
            raise SourceError(self._clean(f"cannot reach {self.shown}: {reason}")) from None
        except PrometheusApiClientException as exc:
            m = re.search(r"HTTP Status Code (\d+)", str(exc))
            code = m.group(1) if m else "?"
            raise SourceError(
                self._clean(
                    f"{self.shown} answered HTTP {code} to a {what}: {_body_hint(str(exc))}"
                )
            ) from None
        except (ValueError, KeyError, TypeError):
            raise SourceError(
                f"{self.shown} answered a {what} with something that is not Prometheus API JSON"
            ) from None
        except requests.exceptions.RequestException as exc:
            raise SourceError(
                self._clean(f"request to {self.shown} failed: {_first_line(exc)}")
            ) from None
        if not isinstance(result, list):
            raise SourceError(f"{self.shown} answered a {what} without a result list")
        return result

    def _timed_out(self, what: str) -> SourceError:
        return SourceError(f"{self.shown} did not answer a {what} within {self.timeout:g} s")

    def _clean(self, text: str) -> str:
        for secret in self.auth.secrets():
            text = text.replace(secret, "***")
        return text.replace(self.url, self.shown)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _body_hint(text: str) -> str:
    m = re.search(r'"error":\s*"([^"]+)"', text)
    if m:
        return m.group(1)[:200]
    body = re.sub(r"\s+", " ", text.split("(", 1)[-1]).strip(" )'b")
    return body[:120] or "no body"


def _series(raw: Any, expr: str) -> Series:
    try:
        metric = raw["metric"]
        pts = raw["values"] if "values" in raw else [raw["value"]]
        if not isinstance(metric, dict) or not isinstance(pts, list):
            raise TypeError
        labels = {str(k): str(v) for k, v in metric.items()}
        t = np.array([float(p[0]) for p in pts], dtype=np.float64)
        v = np.array([float(p[1]) for p in pts], dtype=np.float64)
    except (KeyError, TypeError, ValueError, IndexError):
        raise SourceError("the answer's series are not in Prometheus's format") from None
    return Series(labels, t, v)
