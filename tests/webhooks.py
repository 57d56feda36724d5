"""The webhook receiver on a free loopback port for a test: served in a thread of the test's
process, or a real ``servediag webhook`` process started and waited for until it answers."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO, Any

import loopback

from diagnoser.webhook import http as webhook_http
from diagnoser.webhook.receiver import Webhook
from lab.promserver import free_port


@contextlib.contextmanager
def running(
    hook: Webhook,
    drain: float = webhook_http.DRAIN_TIMEOUT,
    stop: threading.Event | None = None,
) -> Iterator[str]:
    """``hook`` served in a thread of this process: its URL. On leaving, or once the test
    sets ``stop``, the server stops, draining for up to ``drain`` seconds; its thread must
    have ended."""
    with loopback.in_thread(webhook_http.serve, hook, stop, drain=drain) as address:
        yield f"http://{address}"


def health(url: str) -> int:
    """The status of the webhook's ``/healthz`` at ``url``; 0 when nothing answers."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return int(exc.code)
    except OSError:
        return 0


def start(
    prom_url: str,
    *args: str,
    stdout: int | IO[Any] = subprocess.PIPE,
    preexec: Callable[[], None] | None = None,
) -> tuple[subprocess.Popen[str], str]:
    """``servediag webhook`` reading ``prom_url`` with ``args``, once it answers: the
    process and its URL. A process that ends first fails the test with its stderr; one that
    does not answer in time is killed."""
    port = free_port()
    cmd = [sys.executable, "-m", "diagnoser", "webhook", "--listen", f"127.0.0.1:{port}"]
    cmd += ["--prometheus-url", prom_url, *args]
    proc = subprocess.Popen(
        cmd, stdout=stdout, stderr=subprocess.PIPE, text=True, preexec_fn=preexec
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        return health(url) == 200

    try:
        loopback.wait_for(up, 60)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=30)
        raise
    return proc, url
