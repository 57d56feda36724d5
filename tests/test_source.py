"""Error paths of the metric source: each a clear line, exit 3, no secret in it."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from diagnoser.plumbing.source import Auth, PrometheusSource, SourceError, redact_url


class _Handler(BaseHTTPRequestHandler):
    body: bytes = b""
    status: int = 200
    delay: float = 0.0
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        type(self).seen.append(dict(self.headers))
        time.sleep(self.delay)
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def fake_api():
    """A real HTTP server on loopback answering whatever a test sets."""

    def start(body: bytes, status: int = 200, delay: float = 0.0):
        handler = type(
            "H", (_Handler,), {"body": body, "status": status, "delay": delay, "seen": []}
        )
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", handler

    servers: list[ThreadingHTTPServer] = []
    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def _range(url: str, **kw) -> list:
    return PrometheusSource(url, **kw).query_range("up", 1_700_000_000, 1_700_003_600, 15)


def test_refused_connection(fake_api):
    from lab.promserver import free_port

    with pytest.raises(
        SourceError, match=r"cannot reach http://127\.0\.0\.1:\d+: connection refused"
    ):
        _range(f"http://127.0.0.1:{free_port()}")


def test_timeout(fake_api):
    url, _ = fake_api(b'{"status":"success","data":{"result":[]}}', delay=3)
    with pytest.raises(SourceError, match="did not answer a query_range within 1 s"):
        _range(url, timeout=1)


def test_http_500_says_the_status_and_prometheus_error(fake_api):
    url, _ = fake_api(
        b'{"status":"error","error":"expanding series: storage unavailable"}', status=500
    )
    with pytest.raises(SourceError, match="answered HTTP 500 to a query_range: expanding series"):
        _range(url)


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (422, "query processing would load too many samples into memory in query execution"),
        (
            422,
            "cannot select more than -search.maxSamplesPerQuery=1000000000 samples; possible "
            "solutions: to reduce time range for the query",
        ),
        (
            422,
            "the query exceeded the maximum number of series (limit: 1000 series) "
            "(err-mimir-max-series-per-query)",
        ),
    ],
)
def test_a_query_over_the_stores_limits_says_how_to_narrow_it(fake_api, status, error):
    """Prometheus's, VictoriaMetrics's and Mimir's words for a query that reads too much."""
    import json

    url, _ = fake_api(json.dumps({"status": "error", "error": error}).encode(), status=status)
    with pytest.raises(SourceError) as info:
        _range(url)
    text = str(info.value)
    assert "more than its query limits allow" in text and "--model or --match" in text, text
    assert "--since" in text and error[:40] in text and "\n" not in text


def test_a_real_prometheus_sample_limit_names_the_query_and_exits_3(scenario_library, tmp_path):
    """``--query.max-samples`` on a real Prometheus: one line naming the signal whose query
    went over, what to narrow, exit 3 (a fleet too large for the server's limits)."""
    import shutil

    from lab.promserver import Prometheus

    prepared = scenario_library["batch-slot-limit"]
    data = tmp_path / "tsdb"
    shutil.copytree(prepared.data_dir, data)
    with Prometheus(data, extra_args=["--query.max-samples=20000"]) as prom:
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "diagnoser",
                "diagnose",
                "--prometheus-url",
                prom.url,
                "--until",
                str(int(prepared.end)),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert run.returncode == 3, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    assert "refused the query_range for " in lines[0] and "(vllm:" in lines[0], lines[0]
    assert "too many samples" in lines[0] and "--model or --match" in lines[0]


def test_a_body_that_is_not_prometheus_json(fake_api):
    url, _ = fake_api(b"<html>login required</html>")
    with pytest.raises(SourceError, match="not Prometheus API JSON"):
        _range(url)


def test_an_answer_without_series_shape(fake_api):
    url, _ = fake_api(b'{"status":"success","data":{"result":[{"values":"x"}]}}')
    with pytest.raises(SourceError, match="not in Prometheus's format"):
        _range(url)


def test_too_many_points_are_refused_before_asking():
    with pytest.raises(SourceError, match="exceed Prometheus's 11000"):
        PrometheusSource("http://127.0.0.1:1").query_range("up", 0, 200_000, 15)


def test_auth_headers_are_sent_and_never_shown(fake_api):
    url, handler = fake_api(b"nope", status=401)
    auth = Auth(bearer_token="tok-123", headers={"X-Scope-OrgID": "tenant-a"})
    with pytest.raises(SourceError) as err:
        _range(url, auth=auth)
    assert handler.seen[0]["Authorization"] == "Bearer tok-123"
    assert handler.seen[0]["X-Scope-OrgID"] == "tenant-a"
    assert "tok-123" not in str(err.value) and "HTTP 401" in str(err.value)


def test_urls_lose_their_credentials_in_messages():
    assert redact_url("https://bob:pw@prom.example.com:9090/x") == "https://prom.example.com:9090/x"


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"<html>oops</html>", 200, "not Prometheus API JSON"),
        (b'{"status":"error","error":"boom"}', 500, "HTTP 500"),
    ],
)
def test_the_cli_exits_3_on_garbage(fake_api, body, status, says):
    url, _ = fake_api(body, status=status)
    proc = subprocess.run(
        [sys.executable, "-m", "diagnoser", "diagnose", "--since", "1h", "--prometheus-url", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3
    assert says in proc.stderr and proc.stderr.count("\n") == 1


def test_an_empty_prometheus_is_said_plainly(fake_api):
    url, _ = fake_api(b'{"status":"success","data":{"resultType":"matrix","result":[]}}')
    proc = subprocess.run(
        [sys.executable, "-m", "diagnoser", "diagnose", "--since", "1h", "--prometheus-url", url],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0
    assert "No vLLM series in the window" in proc.stdout
