"""A bounded queue of diagnosis jobs, at most one running per alert group, run by a small
pool of worker threads."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from diagnoser.webhook.payload import FiringAlert

log = logging.getLogger("servediag.webhook")


@dataclass
class Job:
    group_key: str
    alerts: list[FiringAlert]


class Dispatcher:
    """A bounded queue of jobs, at most one running per alert group, run by a worker pool."""

    def __init__(self, run: Callable[[Job], None], workers: int = 2, max_pending: int = 32):
        self.run = run
        self.max_pending = max_pending
        self.pending: OrderedDict[str, Job] = OrderedDict()
        self.running: set[str] = set()
        self.cond = threading.Condition()
        self.stopping = False
        self.threads = [
            threading.Thread(target=self._work, name=f"diagnose-{i}", daemon=True)
            for i in range(workers)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def submit(self, job: Job) -> bool:
        """Queue ``job``; a queued job of the same group takes its alerts. False when full."""
        with self.cond:
            queued = self.pending.get(job.group_key)
            if queued is not None:
                names = {_identity(a) for a in job.alerts}
                queued.alerts = [a for a in queued.alerts if _identity(a) not in names]
                queued.alerts += job.alerts
                return True
            if len(self.pending) >= self.max_pending:
                return False
            self.pending[job.group_key] = job
            self.cond.notify()
            return True

    def depth(self) -> int:
        with self.cond:
            return len(self.pending)

    def _next(self) -> Job | None:
        with self.cond:
            while True:
                if self.stopping:
                    return None
                for key in self.pending:
                    if key not in self.running:
                        self.running.add(key)
                        return self.pending.pop(key)
                self.cond.wait()

    def _work(self) -> None:
        while (job := self._next()) is not None:
            try:
                self.run(job)
            except Exception:  # a worker never dies: log and take the next job
                log.exception("unexpected error while diagnosing group %s", job.group_key)
            finally:
                with self.cond:
                    self.running.discard(job.group_key)
                    self.cond.notify_all()

    def stop(self, timeout: float = 5.0) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))


def _identity(a: FiringAlert) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(a.labels.items()))
