"""The Prometheus source against servers that misbehave, on real loopback sockets: a deadline
that holds however the server stalls, answers bounded once decompressed, credentials that
stay with their origin and out of every message, and Prometheus's own words on errors and
partial answers."""

from __future__ import annotations

import base64
import contextlib
import gzip
import html
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest
from loopback import EMPTY, answer, drip, elapsed, serve

from diagnoser.plumbing import http
from diagnoser.plumbing.source import Auth, PrometheusSource, SourceError


def _range(source: PrometheusSource) -> list:
    return source.query_range("up", 1_700_000_000, 1_700_003_600, 15)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "diagnoser", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )


# --- one deadline -----------------------------------------------------------------------


def test_a_server_that_drips_its_answer_is_cut_at_the_deadline():
    body = json.dumps(EMPTY).encode() + b" " * 40  # ~110 bytes: ~30 s at 0.25 s a byte
    with serve(lambda h, f: drip(h, f, body, 0.25)) as api:
        took, out = elapsed(lambda: _range(PrometheusSource(api.url, timeout=2)))
    assert isinstance(out, SourceError), out
    assert "did not answer a query_range within 2 s" in str(out)
    assert took < 10  # it took as long as the drip (~30 s) before


def test_a_resolver_that_hangs_is_cut_at_the_deadline(monkeypatch):
    # getaddrinfo has no timeout of its own; a DNS server that never answers held a query
    # for the resolver's own retries (tens of seconds). Only this error path is mocked.
    import socket
    import threading

    release = threading.Event()

    def hanging(*args, **kwargs):
        release.wait(30)
        raise socket.gaierror("released")

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    try:
        took, out = elapsed(
            lambda: _range(PrometheusSource("http://prometheus.invalid:9090", timeout=1))
        )
    finally:
        release.set()
    assert isinstance(out, SourceError), out
    assert "within 1 s" in str(out)
    assert took < 5


def test_retry_after_longer_than_the_time_left_is_not_waited_for():
    with serve(lambda h, f: answer(h, b"busy", 503, {"Retry-After": "40"})) as api:
        took, out = elapsed(lambda: _range(PrometheusSource(api.url, timeout=2)))
    assert isinstance(out, SourceError), out
    assert "HTTP 503" in str(out) and "asked to retry after 40 s" in str(out)
    assert took < 10  # 40 s (or 80 s with two retries) before
    assert len(api.seen) == 1


def test_a_short_retry_after_is_honoured_within_the_deadline():
    def respond(h, f):
        if len(f.seen) == 1:
            answer(h, b"busy", 503, {"Retry-After": "1"})
        else:
            answer(h, EMPTY)

    with serve(respond) as api:
        took, out = elapsed(lambda: _range(PrometheusSource(api.url, timeout=5)))
    assert out == [] and len(api.seen) == 2 and took >= 1


def test_a_diagnosis_has_one_deadline_for_all_its_queries():
    """Each query answers in 1.5 s, within --timeout 2; the ~60 queries of a diagnosis do not."""

    def slow(h, f):
        if not f.release.wait(1.5):
            answer(h, EMPTY)

    with serve(slow) as api:
        took, proc = elapsed(
            lambda: _cli("diagnose", "--since", "1h", "--timeout", "2", "--prometheus-url", api.url)
        )
    assert proc.returncode == 3, proc.stderr
    assert "did not answer" in proc.stderr and "within 2 s" in proc.stderr
    assert proc.stderr.count("\n") == 1
    assert took < 30  # the run itself; before, every query got its own 2 s


# --- bounded answers --------------------------------------------------------------------


def _bomb(size: int) -> bytes:
    head = b'{"status":"success","data":{"resultType":"matrix","result":[]}}'
    return gzip.compress(head + b" " * size, compresslevel=9)


def test_a_gzip_bomb_stops_at_the_limit():
    bomb = _bomb(40 << 20)  # 40 MiB of spaces in ~40 KB
    assert len(bomb) < 100_000
    with serve(lambda h, f: answer(h, bomb, headers={"Content-Encoding": "gzip"})) as api:
        out = elapsed(lambda: _range(PrometheusSource(api.url, max_bytes=1 << 20)))[1]
        assert isinstance(out, SourceError), out
        assert "more than 1 MiB" in str(out) and "--max-response-mb" in str(out)
        assert api.seen[0].headers.get("Accept-Encoding") == "gzip"
        proc = _cli("diagnose", "--max-response-mb", "1", "--prometheus-url", api.url)
    assert proc.returncode == 3 and "more than 1 MiB" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1


def test_a_compressed_answer_under_the_limit_is_read():
    small = gzip.compress(json.dumps(EMPTY).encode())
    with serve(lambda h, f: answer(h, small, headers={"Content-Encoding": "gzip"})) as api:
        assert _range(PrometheusSource(api.url)) == []


def test_a_query_too_long_for_a_url_goes_as_a_form():
    # A lookback over thousands of models names them all: the URL passed what servers take
    # in a request line (64 KiB here, 414), and the whole diagnosis failed.
    names = "|".join(f"model-{i:05d}" for i in range(8000))
    expr = f'up{{model_name=~"{names}"}}'
    with serve(lambda h, f: answer(h, EMPTY)) as api:
        assert PrometheusSource(api.url).query_range(expr, 1_700_000_000, 1_700_003_600, 15) == []
        assert PrometheusSource(api.url).query("up", 1_700_000_000) == []
    long, short = api.seen
    assert long.method == "POST" and long.path == "/api/v1/query_range"
    assert urllib.parse.parse_qs(long.body.decode())["query"] == [expr]
    assert long.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert short.method == "GET" and "query=up" in short.path


# --- memory across the answers read at once --------------------------------------------


def _matrix(megabytes: float, model_name: bool = False) -> bytes:
    """A valid matrix of about ``megabytes`` MB, of series of 481 points (two hours at 15 s);
    without ``model_name``, a diagnosis drops its series once read."""
    values = [[1_699_992_800 + 15 * k, f"{k % 97 / 7:.6g}"] for k in range(481)]
    each = len(json.dumps({"metric": {"pod": "pod-000000"}, "values": values}))
    result = []
    for i in range(int(megabytes * 1e6 / each) + 1):
        metric = {"model_name": f"m-{i}"} if model_name else {"pod": f"pod-{i:06d}"}
        result.append({"metric": metric, "values": values})
    doc = {"status": "success", "data": {"resultType": "matrix", "result": result}}
    return json.dumps(doc, separators=(",", ":")).encode()


def _peak_rss_kb(*args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """Run the CLI; its exit status and output, and its peak resident memory in KiB."""
    code = (
        "import atexit, resource, sys, runpy\n"
        "atexit.register(lambda: sys.stderr.write("
        "f'\\npeak-rss-kb {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\\n'))\n"
        f"sys.argv = ['diagnoser', *{list(args)!r}]\n"
        "runpy.run_module('diagnoser', run_name='__main__')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=600
    )
    peak = int(proc.stderr.rsplit("peak-rss-kb ", 1)[1].split()[0])
    return proc, peak


@pytest.mark.slow
def test_eight_large_answers_at_once_share_one_memory_budget():
    # Eight queries of a diagnosis run at once. Each answer alone is under the limit, and
    # each grew tenfold when parsed: eight 15 MB answers took 1.4 GB. The first eight
    # queries are held until all eight have arrived, then answered together; the rest get
    # no series.
    # The queries held are the signals' range queries, which a diagnosis runs eight at a
    # time; its one-point query of the histograms' bounds goes first and alone.
    big = _matrix(15)
    arrived = threading.Barrier(8, timeout=60)
    held = iter(range(8))
    lock = threading.Lock()

    def respond(h, f):
        asked = urllib.parse.parse_qs(
            h.request_body.decode() or urllib.parse.urlsplit(h.path).query
        )
        with lock:
            hold = asked.get("start") != asked.get("end") and next(held, None) is not None
        if hold:
            arrived.wait()  # broken (an error) if eight never arrive together
            answer(h, big)
        else:
            answer(h, EMPTY)

    with serve(respond) as api:
        proc, peak = _peak_rss_kb(
            "diagnose", "--prometheus-url", api.url, "--until", "1700000000", "--timeout", "300"
        )
    assert proc.returncode == 0, proc.stderr
    assert peak < 450_000, f"{peak} KiB"  # 969 MB before; 180 MB after


def test_reading_an_answer_stops_at_the_deadline():
    # 120 MB of series in a small gzip body: the bytes arrive at once, and parsing them took
    # many seconds more, past the deadline, which nothing then checked. Reading it takes
    # about 1.2 s on a fast two-core machine: the deadline is well inside that.
    body = gzip.compress(_matrix(120), compresslevel=6)
    assert len(body) < 12_000_000
    with serve(lambda h, f: answer(h, body, headers={"Content-Encoding": "gzip"})) as api:
        source = PrometheusSource(api.url, timeout=0.4, max_bytes=256 << 20)
        took, out = elapsed(lambda: _range(source))
    assert isinstance(out, SourceError), type(out)
    assert "did not answer a query_range within 0.4 s" in str(out)
    assert took < 5, took
    assert source.budget.used == 0  # what it held is given back


def test_a_budget_lets_one_answer_past_it_and_the_others_wait_their_turn():
    budget = http.Budget(100)
    at = time.monotonic() + 5
    first, second = budget.lease(at, 1000), budget.lease(at, 1000)
    first.draw(60)
    second.draw(40)  # the budget is spent
    first.draw(200)  # one answer may go past it, and finish
    assert budget.used == 300
    done = threading.Event()

    def more() -> None:
        second.draw(10)  # waits until the one past the budget is done
        done.set()

    waiter = threading.Thread(target=more)
    waiter.start()
    assert not done.wait(0.3)
    first.close()
    assert done.wait(5)
    waiter.join()
    assert budget.used == 50
    second.close()
    late = budget.lease(time.monotonic() + 0.2, 1000)
    late.draw(100)
    other = budget.lease(time.monotonic() + 0.2, 1000)
    other.draw(50)  # past the budget: the one lease allowed past it
    with pytest.raises(http.TimedOut):
        late.draw(1)  # another lease is past it: wait, and the deadline comes first
    with pytest.raises(http.TooLarge):
        other.draw(2000)


# --- credentials ------------------------------------------------------------------------


def test_credentials_stay_with_their_origin_across_a_redirect():
    """Same origin: every header follows. Another origin (localhost is another host than
    127.0.0.1): neither Authorization nor any --header does."""
    with serve(lambda h, f: answer(h, EMPTY), host="127.0.0.1") as other:
        port = other.url.rsplit(":", 1)[1]
        elsewhere = f"http://localhost:{port}/api/v1/query_range"

        def respond(h, f):
            if h.path.startswith("/moved"):
                answer(h, b"", 302, {"Location": elsewhere})
            elif len(f.seen) == 1:
                answer(h, b"", 307, {"Location": "/moved" + h.path})
            else:
                answer(h, b"", 302, {"Location": elsewhere})

        with serve(respond) as first:
            auth = Auth(bearer_token="tok-1234", headers={"X-Scope-OrgID": "tenant-secret"})
            assert _range(PrometheusSource(first.url, auth=auth)) == []
            auth = Auth(basic=("bob", "pw-5678"), headers={"X-Api-Key": "key-secret"})
            assert _range(PrometheusSource(first.url, auth=auth)) == []
    moved = first.seen[1]
    assert moved.path.startswith("/moved/api/v1/query_range")
    assert moved.headers["Authorization"] == "Bearer tok-1234"
    assert moved.headers["X-Scope-OrgID"] == "tenant-secret"
    assert len(other.seen) == 2
    for arrived in other.seen:
        assert "Authorization" not in arrived.headers
        assert "X-Scope-OrgID" not in arrived.headers and "X-Api-Key" not in arrived.headers


def test_a_401_that_echoes_the_request_shows_no_credential():
    def echo(h, f):  # as some proxies do: what was sent, credentials first
        sent = f"{h.headers.get('Authorization')} {h.headers.get('X-Api-Key')} {dict(h.headers)}"
        answer(h, f"unauthorized: {sent}".encode(), 401, {"Content-Type": "text/plain"})

    with serve(echo) as api:
        auth = Auth(basic=("bob", "hunter22"), headers={"X-Api-Key": "key-9876"})
        out = elapsed(lambda: _range(PrometheusSource(api.url, auth=auth)))[1]
    text = str(out)
    assert isinstance(out, SourceError) and "HTTP 401" in text
    assert base64.b64encode(b"bob:hunter22").decode() not in text
    assert "hunter22" not in text and "key-9876" not in text


def test_no_part_of_a_credential_is_left_where_an_error_text_is_cut_short():
    def echo(h, f):  # padding moves the credential across the cut, one request at a time
        pad = "." * (80 + 3 * len(f.seen))
        answer(h, f"no {pad} {h.headers.get('Authorization')}".encode(), 401)

    b64 = base64.b64encode(b"bob:hunter22").decode()
    with serve(echo) as api:
        for _ in range(20):
            out = elapsed(
                lambda: _range(PrometheusSource(api.url, auth=Auth(basic=("bob", "hunter22"))))
            )[1]
            assert isinstance(out, SourceError) and "HTTP 401" in str(out)
            assert b64[:6] not in str(out), str(out)


@pytest.mark.parametrize("auth", [Auth(basic=("bob", "")), Auth(headers={"X-Org": "a"})])
def test_short_secrets_do_not_garble_messages(auth):
    body = b'{"status":"error","errorType":"bad_data","error":"parse error at char 5"}'
    with serve(lambda h, f: answer(h, body, 400)) as api:
        out = elapsed(lambda: _range(PrometheusSource(api.url, auth=auth)))[1]
    assert isinstance(out, SourceError)
    assert "answered HTTP 400 to a query_range: bad_data: parse error at char 5" in str(out)


TOKEN = "tok/en+key=9876&x<y>"


def _encodings(secret: str) -> dict[str, str]:
    """The forms a server's error page gives a credential it echoes."""
    json_escaped = json.dumps(secret)[1:-1].replace("/", "\\/")  # as PHP and Jackson write
    return {
        "url": urllib.parse.quote(secret, safe=""),
        "url-lower": urllib.parse.quote(secret, safe="").lower(),
        "url-plus": urllib.parse.quote_plus(f"{secret} {secret}"),
        "url-twice": urllib.parse.quote(urllib.parse.quote(secret, safe=""), safe=""),
        "json": json_escaped,
        "json-unicode": "".join(f"\\u{ord(c):04x}" for c in secret),
        "html": html.escape(secret),
        "html-numeric": "".join(f"&#{ord(c)};" for c in secret),
        "html-hex": "".join(f"&#x{ord(c):X};" for c in secret),
        "base64": base64.b64encode(secret.encode()).decode(),
        "base64-inside": base64.b64encode(f"Bearer {secret}".encode()).decode(),
    }


@pytest.mark.parametrize("encoding", sorted(_encodings(TOKEN)))
def test_a_token_echoed_in_another_encoding_is_not_shown(encoding):
    def echo(h, f):  # an error page that quotes the request its own way
        answer(h, f"denied for {_encodings(TOKEN)[encoding]} here".encode(), 401)

    with serve(echo) as api:
        out = elapsed(lambda: _range(PrometheusSource(api.url, auth=Auth(bearer_token=TOKEN))))[1]
    text = str(out)
    assert isinstance(out, SourceError) and "HTTP 401 to a query_range: denied for " in text
    assert "*** here" in text, text
    for form in _encodings(TOKEN).values():
        assert form not in text
    assert "9876" not in text


def test_a_proxys_credentials_are_never_shown(monkeypatch):
    def refuse(h, f):  # a proxy's 407 page, quoting what it was sent
        got = h.headers.get("Proxy-Authorization", "")
        answer(h, f"bad {got} (user proxyuser, password pass/word-5678)".encode(), 407)

    pair = "proxyuser:pass/word-5678"
    with serve(refuse) as proxy:
        netloc = proxy.url.removeprefix("http://")
        monkeypatch.setenv("HTTP_PROXY", f"http://proxyuser:pass%2Fword-5678@{netloc}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        out = elapsed(lambda: _range(PrometheusSource("http://prometheus.example:9090")))[1]
        assert proxy.seen, "the request did not go through the proxy"
        assert (
            proxy.seen[0]
            .headers["Proxy-Authorization"]
            .endswith(base64.b64encode(pair.encode()).decode())
        )
    text = str(out)
    assert isinstance(out, SourceError) and "query_range: bad Basic *** (user" in text, text
    assert "5678" not in text and "pass%2Fword" not in text
    assert base64.b64encode(pair.encode()).decode() not in text


def test_a_proxy_that_refuses_a_tunnel_shows_no_credential(monkeypatch):
    """HTTPS goes through a CONNECT tunnel; a refusal's status line is in the error."""
    pair = "proxyuser:pass/word-5678"
    server = socket.create_server(("127.0.0.1", 0))
    said = base64.b64encode(pair.encode()).decode()

    def refuse() -> None:
        with contextlib.suppress(OSError):  # until the server is closed
            while True:
                conn, _ = server.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(f"HTTP/1.1 407 no for {said} {pair}\r\n\r\n".encode())

    threading.Thread(target=refuse, daemon=True).start()
    port = server.getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://proxyuser:pass%2Fword-5678@127.0.0.1:{port}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    try:
        out = elapsed(lambda: _range(PrometheusSource("https://prometheus.example:9090")))[1]
    finally:
        server.close()
    text = str(out)
    assert isinstance(out, SourceError) and "407 no for ***" in text, text
    assert "5678" not in text and said not in text


# --- Prometheus's own words -------------------------------------------------------------


def test_an_error_answered_with_status_200_shows_prometheus_error_text():
    body = {"status": "error", "errorType": "execution", "error": "query timed out in eval"}
    with serve(lambda h, f: answer(h, body)) as api:
        out = elapsed(lambda: _range(PrometheusSource(api.url)))[1]
    assert isinstance(out, SourceError)
    assert "with an error: execution: query timed out in eval" in str(out)


def test_a_series_with_a_null_metric_is_a_source_error():
    body = {"status": "success", "data": {"result": [{"metric": None, "values": [[1, "1"]]}]}}
    with serve(lambda h, f: answer(h, body)) as api:
        out = elapsed(lambda: _range(PrometheusSource(api.url)))[1]
    assert isinstance(out, SourceError) and "not in Prometheus's format" in str(out)


@pytest.mark.parametrize(
    "point",
    [b"[" + b"9" * 400 + b',"1"]', b"[1," + b"9" * 400 + b"]", b'[true,"1"]', b"[1,false]"],
    ids=["time-of-400-digits", "value-of-400-digits", "true", "false"],
)
def test_a_point_no_float_can_hold_is_one_line_and_exit_3(point):
    body = b'{"status":"success","data":{"result":[{"metric":{"model_name":"m"},"values":['
    body += point + b"]}]}}"
    with serve(lambda h, f: answer(h, body)) as api:
        proc = _cli("diagnose", "--prometheus-url", api.url, "--until", "1700000000")
    assert proc.returncode == 3, proc.stderr
    assert "not in Prometheus's format" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_partial_answer_is_said_in_the_report_and_the_json():
    warned = {**EMPTY, "warnings": ["partial response: store eu-1 unreachable\nforged"]}
    with serve(lambda h, f: answer(h, warned)) as api:
        text = _cli("diagnose", "--prometheus-url", api.url)
        doc = _cli("diagnose", "--format", "json", "--prometheus-url", api.url)
    assert text.returncode == 0, text.stderr
    assert "PARTIAL ANSWER: partial response: store eu-1 unreachable forged" in text.stdout
    stats = json.loads(doc.stdout)["stats"]
    assert stats["warnings"] == ["partial response: store eu-1 unreachable forged"]
    assert {"queries", "query_seconds", "traffic_floor_rps"} <= set(stats)


# --- local option errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--prometheus-url", "http://[::1"], "--prometheus-url 'http://[::1'"),
        (["--prometheus-url", "http://bob:pw-77@[::1"], "--prometheus-url 'http://[::1'"),
        (["--prometheus-url", ""], "is not an http:// or https:// URL"),
        (["--prometheus-url", "prometheus:9090"], "is not an http:// or https:// URL"),
        (["--prometheus-url", "ftp://prometheus"], "is not an http:// or https:// URL"),
        (["--prometheus-url", "http://prometheus:99999"], "Port out of range"),
        (["--timeout", "nan"], "--timeout: 'nan' is not a finite number"),
        (["--header", "X-Org: a\rb"], "holds a line break"),
        (["--max-response-mb", "0"], "--max-response-mb"),
    ],
)
@pytest.mark.parametrize("command", ["diagnose", "webhook", "kv-budget"])
def test_bad_source_options_are_one_line_and_exit_2(command, args, says):
    extra = {"webhook": ["--listen", "127.0.0.1:9"], "kv-budget": []}.get(command, [])
    if command == "kv-budget" and "--prometheus-url" not in args:
        args = [*args, "--prometheus-url", "http://127.0.0.1:9"]
    proc = _cli(command, *extra, *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert says in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "pw-77" not in proc.stderr


def test_a_token_file_of_several_lines_or_too_large_is_exit_2(tmp_path):
    lines = tmp_path / "lines"
    lines.write_text("a\nb\n")
    big = tmp_path / "big"
    big.write_bytes(b"x" * (200 * 1024))
    for path, says in ((lines, "holds more than one line"), (big, "larger than 64 KiB")):
        proc = _cli("diagnose", "--bearer-token-file", str(path), timeout=60)
        assert proc.returncode == 2 and says in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1
