"""The live simulator serving a scenario on a free loopback port, in a thread of the test's
process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from loopback import in_thread

from diagnoser.sim.live import serve
from diagnoser.sim.scenario import Scenario


@contextlib.contextmanager
def live_simulator(sc: Scenario, **options: Any) -> Iterator[str]:
    """``sc`` served live (``options`` as ``sim.live.serve`` takes them): its host:port once
    it listens. On leaving, it stops and its thread must have ended."""
    with in_thread(serve, sc, join=10, **options) as address:
        yield address
