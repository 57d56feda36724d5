"""The live simulator serving a scenario on a free loopback port, in a thread of the test's
process."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from diagnoser.lab.promserver import free_port
from diagnoser.sim.live import serve
from diagnoser.sim.scenario import Scenario


@contextlib.contextmanager
def live_simulator(sc: Scenario, **options: Any) -> Iterator[str]:
    """``sc`` served live (``options`` as ``sim.live.serve`` takes them): its host:port once
    it listens. On leaving, it stops and its thread must have ended."""
    port, ready, stop = free_port(), threading.Event(), threading.Event()
    thread = threading.Thread(
        target=serve,
        args=(sc, "127.0.0.1", port),
        kwargs={"ready": ready, "stop": stop, **options},
        daemon=True,
    )
    thread.start()
    try:
        assert ready.wait(10)
        yield f"127.0.0.1:{port}"
    finally:
        stop.set()
        thread.join(10)
    assert not thread.is_alive()
