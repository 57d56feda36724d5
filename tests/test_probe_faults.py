"""The probe against targets that misbehave, on real loopback sockets: a stream dripped a
byte at a time ends at --timeout, a login page answered 200 is an HTTP error, a model list
without ids and a token file that is not a token are said in one line."""

from __future__ import annotations

import base64
import html
import json
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from click.testing import CliRunner
from loopback import answer, drip, elapsed, serve, wait_for

from diagnoser.cli import main
from diagnoser.probe.runner import ProbeConfig, Prober
from diagnoser.probe.stream import Endpoint, stream
from lab.promserver import free_port


def _probe(url: str, timeout: float = 5.0):
    return stream(Endpoint(url), "completions", {"model": "m", "prompt": "hi"}, timeout)


def test_a_dripped_stream_ends_at_the_timeout():
    event = b'data: {"choices":[{"index":0,"text":" hello","finish_reason":null}]}\n\n' * 2
    with serve(lambda h, f: drip(h, f, event, 0.25, "text/event-stream")) as target:
        took, res = elapsed(lambda: _probe(target.url, timeout=2))
    assert res.outcome == "timeout", res.detail
    assert "not finished within 2 s" in res.detail
    assert took < 10  # the whole drip (~35 s) before


def test_headers_dripped_before_any_status_end_at_the_timeout():
    def slow_status(h, f):
        for ch in b"HTTP/1.0 200 OK\r\nX-Slow: " + b"y" * 60:
            if f.release.wait(0.25):
                return
            h.wfile.write(bytes([ch]))
            h.wfile.flush()

    with serve(slow_status) as target:
        took, res = elapsed(lambda: _probe(target.url, timeout=2))
    assert res.outcome == "timeout", res.detail
    assert took < 10


def test_a_login_page_answered_200_is_an_http_error():
    page = b"<html><body>Sign in to continue</body></html>"
    with serve(lambda h, f: answer(h, page, headers={"Content-Type": "text/html"})) as target:
        res = _probe(target.url)
    assert res.outcome == "http_error", res.detail
    assert "HTTP 200 with text/html, not a stream: <html><body>Sign in" in res.detail


def test_a_body_that_is_not_an_event_stream_is_an_http_error():
    with serve(lambda h, f: answer(h, b"Service paused\n", headers={"Content-Type": ""})) as t:
        res = _probe(t.url)
    assert res.outcome == "http_error" and "not an event stream: Service paused" in res.detail


def test_a_model_list_without_ids_is_one_line_and_exit_3():
    listing = {"object": "list", "data": [{"object": "model"}, {"id": None}]}
    with serve(lambda h, f: answer(h, listing)) as target:
        res = CliRunner().invoke(main, ["probe", "--target", target.url, "--once"])
    assert res.exit_code == 3, res.output
    assert "lists no model with an id; pass --model" in res.stderr
    assert res.stderr.count("\n") == 1


def test_the_first_model_with_an_id_is_probed():
    from diagnoser.probe.runner import discover_model

    listing = {"data": [{"object": "model"}, {"id": "tiny"}]}
    with serve(lambda h, f: answer(h, listing)) as target:
        assert discover_model(Endpoint(target.url), 5.0) == "tiny"


def test_a_token_file_that_is_not_a_token_is_exit_2(tmp_path):
    big = tmp_path / "big"
    big.write_bytes(b"x" * (200 * 1024))
    lines = tmp_path / "lines"
    lines.write_text("one\ntwo\n")
    for path, says in ((big, "larger than 64 KiB"), (lines, "holds more than one line")):
        args = ["probe", "--target", "http://127.0.0.1:1", "--bearer-token-file", str(path)]
        res = CliRunner().invoke(main, [*args, "--once"])
        assert res.exit_code == 2, res.output
        assert says in res.stderr and res.stderr.count("\n") == 1


def test_a_target_that_is_not_a_url_is_one_line_and_exit_2():
    for target, says in (
        ("http://bob:pw-77@[::1", "--target 'http://[::1': Invalid IPv6 URL"),
        ("ftp://host", "is not an http(s):// URL"),
        ("http://host:99999", "has a bad port"),
    ):
        res = CliRunner().invoke(main, ["probe", "--target", target, "--once"])
        assert res.exit_code == 2, res.output
        assert says in res.stderr and res.stderr.count("\n") == 1 and "pw-77" not in res.stderr


def test_an_error_body_that_echoes_the_request_shows_no_credential(tmp_path):
    def echo(h, f):  # as some gateways do: the request's headers in the error
        answer(h, f"denied: {dict(h.headers)}".encode(), 401, {"Content-Type": "text/plain"})

    token = tmp_path / "token"
    token.write_text("tok-secret-1234\n")
    with serve(echo) as target:
        url = target.url.replace("http://", "http://bob:pw-5678@")
        ep = Endpoint(url, {"X-Api-Key": "key-9876"}, bearer_token_file=token)
        res = stream(ep, "completions", {"model": "m", "prompt": "hi"}, 5.0)
        ep_basic = Endpoint(url, {"X-Api-Key": "key-9876"})
        res_basic = stream(ep_basic, "completions", {"model": "m", "prompt": "hi"}, 5.0)
    assert res.outcome == res_basic.outcome == "http_error"
    assert "HTTP 401: denied:" in res.detail and "***" in res.detail
    for secret in ("tok-secret-1234", "key-9876", "pw-5678", "Ym9iOnB3LTU2Nzg="):
        assert secret not in res.detail and secret not in res_basic.detail


@pytest.mark.parametrize(
    "encode",
    [
        lambda t: urllib.parse.quote(t, safe=""),
        lambda t: json.dumps(t)[1:-1].replace("/", "\\/"),
        lambda t: html.escape(t),
        lambda t: base64.b64encode(f"Bearer {t}".encode()).decode(),
    ],
    ids=["url", "json", "html", "base64"],
)
def test_a_token_echoed_in_another_encoding_is_not_shown(tmp_path, encode):
    secret = "tok/en+key=9876&x<y>"

    def echo(h, f):  # a gateway's error page quotes the token its own way
        answer(h, f"denied: {encode(h.headers.get('Authorization'))}".encode(), 401)

    token = tmp_path / "token"
    token.write_text(secret + "\n")
    with serve(echo) as target:
        res = stream(Endpoint(target.url, bearer_token_file=token), "completions", {}, 5.0)
    assert res.outcome == "http_error" and "***" in res.detail, res.detail
    assert encode(secret) not in res.detail and "9876" not in res.detail


def test_no_part_of_a_token_is_left_where_an_error_body_is_cut_short(tmp_path):
    def echo(h, f):  # padding moves the token across the cut, one request at a time
        pad = "." * (170 + 3 * len(f.seen))
        answer(h, f"no {pad} {h.headers.get('Authorization')}".encode(), 401)

    token = tmp_path / "token"
    token.write_text("tok-secret-1234\n")
    with serve(echo) as target:
        ep = Endpoint(target.url, bearer_token_file=token)
        for _ in range(15):
            res = stream(ep, "completions", {"model": "m", "prompt": "hi"}, 5.0)
            assert res.outcome == "http_error" and "tok-s" not in res.detail, res.detail


# --- server-sent events with every line ending the format allows ---------------------------

EVENTS = [
    b'data: {"choices":[{"index":0,"text":" hello","finish_reason":null}]}',
    b'data: {"choices":[{"index":0,"text":" world","finish_reason":"stop"}]}',
    b"data: [DONE]",
]


@pytest.mark.parametrize(
    "eol", [b"\r", b"\r\n", b"\n", b"mixed"], ids=["CR", "CRLF", "LF", "mixed"]
)
def test_every_line_ending_of_server_sent_events_is_read(eol):
    """A stream with CR-only line endings (allowed by the format) was one long line, read as
    invalid JSON: an http_error for a server that answered well."""
    if eol == b"mixed":
        body = EVENTS[0] + b"\r\n\r\n" + EVENTS[1] + b"\r\r" + EVENTS[2] + b"\n\n"
    else:
        body = b"".join(e + eol + eol for e in EVENTS)
    with serve(lambda h, f: answer(h, body, headers={"Content-Type": "text/event-stream"})) as t:
        res = _probe(t.url)
    assert res.outcome == "ok", res.detail
    assert res.tokens == 2 and res.finish_reason == "stop"


def test_a_crlf_split_between_two_reads_is_one_line_ending():
    """The CR ends a line at once (the stream is timed as it arrives); the LF that follows in
    the next read is not a second, blank line."""

    def split(h, f):
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for part in (EVENTS[0] + b"\r", b"\n\r", b"\n" + EVENTS[1] + b"\r", b"\n\r\n", EVENTS[2]):
            h.wfile.write(part)
            h.wfile.flush()
            time.sleep(0.05)
        h.wfile.write(b"\r\n\r\n")

    with serve(split) as t:
        res = _probe(t.url)
    assert res.outcome == "ok", res.detail
    assert res.tokens == 2 and len(res.gaps) == 1 and res.gaps[0] > 0.05


# --- every request counted -------------------------------------------------------------------


def _deep(h, f):
    if h.path.endswith("/models"):
        answer(h, {"data": [{"id": "m"}]})
    else:
        body = b"data: " + b"[" * 100_000 + b"\n\n"
        answer(h, body, headers={"Content-Type": "text/event-stream"})


def test_a_request_whose_answer_no_one_foresaw_is_counted():
    """A request that raised (here JSON nested 100,000 deep in the stream) was not counted:
    the exception ended the round's thread before the count."""
    with serve(_deep) as t:
        prober = Prober(ProbeConfig(Endpoint(t.url), "m", classes=(128,), timeout=5))
        attempt = prober.probe_one(128)
    assert attempt.result is not None and attempt.result.outcome == "http_error"
    assert prober.metrics.outcomes[("128", "http_error")] == 1


def test_in_continuous_mode_every_failed_request_is_in_llm_probe_requests_total():
    with serve(_deep) as t:
        port = free_port()
        cmd = [sys.executable, "-m", "diagnoser", "probe", "--target", t.url, "--every", "1s"]
        cmd += ["--budget", "600/min", "--classes", "128,1k", "--listen", f"127.0.0.1:{port}"]
        proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        try:

            def counted() -> float:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as resp:
                        text = resp.read().decode()
                except OSError:
                    assert proc.poll() is None
                    return 0.0
                lines = [ln for ln in text.splitlines() if 'outcome="http_error"' in ln]
                return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)

            assert wait_for(lambda: counted() >= 4, 30)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "128: http_error" in err and "1k: http_error" in err
