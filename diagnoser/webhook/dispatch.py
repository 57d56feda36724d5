"""A bounded queue of diagnosis jobs, at most one running per alert group, run by a small
pool of worker threads. The bound counts alerts, not groups: one notification can carry
thousands of alerts."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from diagnoser.webhook.payload import FiringAlert

log = logging.getLogger("servediag.webhook")

CUT_POLL = 0.1  # seconds between two looks at whether a drain was cut short


@dataclass
class Job:
    group_key: str
    alerts: list[FiringAlert]
    # Indices of ``alerts`` whose record was emitted (set by the receiver as it goes).
    delivered: set[int] = field(default_factory=set)


class Dispatcher:
    """A queue of at most ``max_alerts`` waiting alerts, at most one job running per group,
    run by a worker pool."""

    def __init__(self, run: Callable[[Job], None], workers: int = 2, max_alerts: int = 100):
        self.run = run
        self.max_alerts = max_alerts
        self.pending: OrderedDict[str, Job] = OrderedDict()
        self.running: dict[str, Job] = {}
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
        """Queue ``job``; a queued job of the same group takes its alerts. False when the
        alerts waiting would be more than ``max_alerts``, or the dispatcher stopped."""
        with self.cond:
            if self.stopping:
                return False
            queued = self.pending.get(job.group_key)
            waiting = self._waiting()
            if queued is not None:
                names = {_identity(a) for a in job.alerts}
                kept = [a for a in queued.alerts if _identity(a) not in names]
                if waiting - len(queued.alerts) + len(kept) + len(job.alerts) > self.max_alerts:
                    return False
                queued.alerts = kept + job.alerts
                return True
            if waiting + len(job.alerts) > self.max_alerts:
                return False
            self.pending[job.group_key] = job
            self.cond.notify()
            return True

    def depth(self) -> int:
        """Alert groups waiting."""
        with self.cond:
            return len(self.pending)

    def waiting(self) -> int:
        """Alerts waiting."""
        with self.cond:
            return self._waiting()

    def _waiting(self) -> int:
        return sum(len(j.alerts) for j in self.pending.values())

    def _next(self) -> Job | None:
        with self.cond:
            while True:
                if self.stopping:
                    return None
                for key in self.pending:
                    if key not in self.running:
                        job = self.pending.pop(key)
                        self.running[key] = job
                        return job
                self.cond.wait()

    def _work(self) -> None:
        while (job := self._next()) is not None:
            try:
                self.run(job)
            except Exception:  # a worker never dies: log and take the next job
                log.exception("unexpected error while diagnosing group %s", job.group_key)
            finally:
                with self.cond:
                    if self.running.get(job.group_key) is job:
                        del self.running[job.group_key]
                    self.cond.notify_all()

    def wait_idle(self, timeout: float, cut: Callable[[], bool] = lambda: False) -> bool:
        """Wait until nothing waits or runs, for at most ``timeout`` seconds, or until
        ``cut()`` (asked every ``CUT_POLL`` seconds) says to stop waiting."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.pending or self.running:
                left = deadline - time.monotonic()
                if left <= 0 or cut():
                    return False
                self.cond.wait(min(left, CUT_POLL))
            return True

    def abandon(self) -> list[Job]:
        """Stop: no job starts from now on. The jobs still waiting or running are returned
        (the running ones go on in their threads; their records are the caller's concern)."""
        with self.cond:
            self.stopping = True
            left = [*self.running.values(), *self.pending.values()]
            self.pending.clear()
            self.cond.notify_all()
            return left

    def stop(self, timeout: float = 5.0) -> None:
        self.abandon()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))


def _identity(a: FiringAlert) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(a.labels.items()))
