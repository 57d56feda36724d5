"""A ``--ca-file`` is checked before anything connects: one that is not a PEM bundle of
certificates, is missing, or is not a regular file is one line naming the option and the file,
exit status 2, in ``diagnose``, ``kv-budget`` and ``probe`` (it used to end in ssl.SSLError or
FileNotFoundError tracebacks at the first request). A real bundle still verifies a real TLS
server on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from clitest import cli, proc_one_line, run
from loopback import EMPTY

BROKEN_PEM = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"


def with_ca(command: str, ca: str) -> list[str]:
    """``command`` pointed at an https:// address nothing listens on, with ``--ca-file``."""
    url = "https://127.0.0.1:9"
    if command == "probe":
        return ["probe", "--target", url, "--model", "m", "--once", "--ca-file", ca]
    return [command, "--prometheus-url", url, "--timeout", "5", "--ca-file", ca]


@pytest.mark.parametrize("command", ["diagnose", "kv-budget", "probe"])
@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"not a certificate at all\n", "not a PEM bundle (no BEGIN CERTIFICATE line)"),
        (b"", "not a PEM bundle (no BEGIN CERTIFICATE line)"),
        (bytes(range(256)) * 8, "not a PEM bundle (it holds binary data)"),
        (BROKEN_PEM.encode(), "not a PEM bundle of CA certificates"),
    ],
    ids=["text", "empty", "binary", "broken-pem"],
)
def test_a_ca_file_that_is_not_a_pem_bundle_is_one_line(tmp_path, command, content, says):
    ca = tmp_path / "ca.pem"
    ca.write_bytes(content)
    res = run(*with_ca(command, str(ca)))
    assert res.exit_code == 2, (res.exit_code, res.stderr[-2000:])
    (line,) = res.stderr.splitlines()
    assert f"--ca-file {ca}: {says}" in line, line


@pytest.mark.parametrize("command", ["diagnose", "kv-budget", "probe"])
def test_a_missing_ca_file_is_one_line(tmp_path, command):
    res = run(*with_ca(command, str(tmp_path / "nowhere.pem")))
    assert res.exit_code == 2, (res.exit_code, res.stderr[-2000:])
    (line,) = res.stderr.splitlines()
    assert "--ca-file" in line and "nowhere.pem" in line, line


def test_a_fifo_as_ca_file_is_refused_at_once(tmp_path):
    fifo = tmp_path / "ca.pem"
    os.mkfifo(fifo)
    for command in ("diagnose", "kv-budget", "probe"):
        proc = cli(*with_ca(command, str(fifo)), timeout=30)
        proc_one_line(proc, f"--ca-file {fifo}: is a FIFO (named pipe), not a regular file")


@pytest.fixture
def tls_prometheus(tmp_path):
    """A Prometheus-shaped HTTPS server on loopback with a self-signed certificate for
    127.0.0.1, and that certificate's file (the CA to trust)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    request = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    names = ["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*request, "-keyout", str(key), "-out", str(cert), *names],
        check=True,
        capture_output=True,
    )
    body = json.dumps(EMPTY).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", str(cert)
    finally:
        server.shutdown()
        server.server_close()
        with contextlib.suppress(Exception):
            thread.join(5)


def test_a_real_ca_bundle_verifies_a_real_tls_server(tls_prometheus):
    url, ca = tls_prometheus
    args = ["diagnose", "--prometheus-url", url, "--until", "1700000000", "--timeout", "20"]
    res = run(*args, "--ca-file", ca)
    assert res.exit_code == 0, res.stderr[-2000:]
    res = run(*args)  # without it, the self-signed certificate is refused: exit 3, one line
    assert res.exit_code == 3 and "TLS failed" in res.stderr, res.stderr[-2000:]
