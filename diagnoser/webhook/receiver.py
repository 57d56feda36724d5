"""Alerts that arrive diagnosed: an Alertmanager webhook receiver that runs ``diagnose``.

For each firing alert that names a detectable playbook (its ``playbook`` label), the diagnosis
of that alert's model (or target) over the last ``since`` is emitted as one JSON line, with
the alert's playbook id and ``runbook_url`` beside the diagnosis's findings, and optionally
forwarded to a Slack-compatible incoming webhook.

The work is bounded: notifications become jobs in a queue of fixed size (a full queue answers
503, so Alertmanager retries later), one job per alert group runs at a time (a newer
notification for a queued group replaces the queued one), a small pool of workers runs them,
and an alert already diagnosed within ``dedupe_window`` is skipped. A failing diagnosis or
forward is logged and the receiver keeps running. The HTTP side is in ``webhook.http``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from diagnoser.core.promql import matcher
from diagnoser.core.source import MetricSource, SourceError
from diagnoser.diagnose import Diagnosis, Window, diagnose, to_json
from diagnoser.site import Site, SiteConfig
from diagnoser.webhook.dispatch import Dispatcher, Job
from diagnoser.webhook.payload import FiringAlert, Notification

log = logging.getLogger("servediag.webhook")


def scope_of(alert: FiringAlert, cfg: SiteConfig) -> dict[str, str]:
    """The labels a diagnosis is scoped to: the model (with the site's group labels), or
    the scrape target for an alert about a server rather than a model; empty when the alert
    names neither (it cannot be diagnosed)."""
    keys = [*cfg.by] if "model_name" in alert.labels else ["job", "instance"]
    return {k: alert.labels[k] for k in keys if k in alert.labels}


def matchers_for(scope: dict[str, str]) -> tuple[str, ...]:
    return tuple(matcher(k, v) for k, v in scope.items())


def plan_window(
    since: float, end: float, baseline_offset: float | None = None, step: float | None = None
) -> Window:
    """``Window.plan``; with ``step``, that resolution and rates over four steps."""
    window = Window.plan(since, end, baseline_offset)
    return window if step is None else window.with_step(step)


class Forwarder(Protocol):
    def send(self, record: dict[str, Any], diagnosis: Diagnosis | None) -> None: ...


@dataclass
class Counters:
    values: dict[tuple[str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, family: str, outcome: str, n: int = 1) -> None:
        with self.lock:
            self.values[(family, outcome)] = self.values.get((family, outcome), 0) + n

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self.lock:
            return dict(self.values)


class Webhook:
    """Accepts notifications, queues their playbook alerts, diagnoses and emits records.

    ``emit`` receives one record per diagnosed alert (the CLI prints it as a JSON line);
    ``clock`` (monotonic seconds, for the dedupe window) and ``now`` (wall seconds, the end of
    each diagnosis window) are injectable.
    """

    def __init__(
        self,
        source: MetricSource,
        site: Site,
        emit: Callable[[dict[str, Any]], None],
        since: float = 3600.0,
        baseline_offset: float | None = None,
        step: float | None = None,
        forwarder: Forwarder | None = None,
        dedupe_window: float = 3600.0,
        lookback: float = 86400.0,
        workers: int = 2,
        max_pending: int = 32,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
    ):
        self.source, self.site, self.emit = source, site, emit
        self.cfg = site.config
        self.since, self.baseline_offset, self.step = since, baseline_offset, step
        self.forwarder = forwarder
        self.dedupe_window = dedupe_window
        self.lookback = lookback
        self.clock, self.now = clock, now
        self.playbooks = {pb.id for pb in site.catalog.detectable()}
        self.seen: dict[tuple[Any, ...], float] = {}
        self.seen_lock = threading.Lock()
        self.counters = Counters()
        self.dispatcher = Dispatcher(self.run, workers, max_pending)

    def start(self) -> None:
        self.dispatcher.start()

    def close(self, timeout: float = 5.0) -> None:
        self.dispatcher.stop(timeout)

    # --- accepting ----------------------------------------------------------------------

    def _key(self, a: FiringAlert) -> tuple[Any, ...]:
        return (a.name, a.labels.get("playbook"), tuple(sorted(scope_of(a, self.cfg).items())))

    def accept(self, n: Notification) -> bool:
        """Queue what needs a diagnosis; False only when the queue is full."""
        fresh: list[FiringAlert] = []
        now = self.clock()
        with self.seen_lock:
            for a in n.alerts:
                playbook = a.labels.get("playbook")
                if a.status != "firing":
                    self.counters.add("alerts", "resolved")
                elif playbook is not None and playbook not in self.playbooks:
                    self.counters.add("alerts", "unknown_playbook")
                    log.info(
                        "%s: playbook %r is not in the catalog", a.name or "an alert", playbook
                    )
                elif not scope_of(a, self.cfg):
                    self.counters.add("alerts", "no_scope")
                    log.info("%s: names no model or target, not diagnosed", a.name or "an alert")
                elif now - self.seen.get(self._key(a), -float("inf")) < self.dedupe_window:
                    self.counters.add("alerts", "duplicate")
                    log.info("%s %s: diagnosed recently, skipped", a.name, self._scope_text(a))
                else:
                    self.seen[self._key(a)] = now
                    fresh.append(a)
            if fresh and not self.dispatcher.submit(Job(n.group_key, fresh)):
                for a in fresh:
                    self.seen.pop(self._key(a), None)
                self.counters.add("alerts", "queue_full", len(fresh))
                log.warning(
                    "queue full (%d groups waiting): %d alert(s) of group %s refused",
                    self.dispatcher.max_pending,
                    len(fresh),
                    n.group_key,
                )
                return False
        if fresh:
            self.counters.add("alerts", "queued", len(fresh))
            log.info(
                "queued %s for diagnosis",
                ", ".join(f"{a.name} {self._scope_text(a)}" for a in fresh),
            )
        return True

    # --- diagnosing ---------------------------------------------------------------------

    def run(self, job: Job) -> None:
        by_scope: dict[tuple[tuple[str, str], ...], list[FiringAlert]] = {}
        for a in job.alerts:
            by_scope.setdefault(tuple(scope_of(a, self.cfg).items()), []).append(a)
        for scope_items, alerts in by_scope.items():
            scope = dict(scope_items)
            result, error = None, None
            t0 = time.monotonic()
            try:
                window = plan_window(self.since, self.now(), self.baseline_offset, self.step)
                result = diagnose(
                    self.source, self.site, window, matchers_for(scope), lookback=self.lookback
                )
                self.counters.add("diagnoses", "ok")
            except SourceError as exc:
                error = str(exc)
                self.counters.add("diagnoses", "error")
                log.error("diagnosis of %s failed: %s", _fmt_scope(scope), error)
            log.info(
                "diagnosed %s in %.1f s for %s",
                _fmt_scope(scope),
                time.monotonic() - t0,
                ", ".join(a.name for a in alerts),
            )
            for a in alerts:
                self._deliver(self.record(a, job.group_key, scope, result, error), result)

    def record(
        self,
        a: FiringAlert,
        group_key: str,
        scope: dict[str, str],
        result: Diagnosis | None,
        error: str | None,
    ) -> dict[str, Any]:
        playbook = a.labels.get("playbook")
        symptom = a.labels.get("symptom")
        page = playbook or symptom
        ids = [m.playbook.id for m in result.for_alert(playbook)] if result else []
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.now())),
            "alert": a.name,
            "severity": a.labels.get("severity"),
            "playbook": playbook,
            "symptom": symptom,
            "runbook_url": a.annotations.get("runbook_url")
            or (self.site.runbook(page) if page else None),
            "summary": a.annotations.get("summary"),
            "scope": scope,
            "starts_at": a.starts_at,
            "group_key": group_key,
            "top_finding": ids[0] if ids else None,
            "playbook_rank": ids.index(playbook) + 1 if playbook in ids else None,
            "since_seconds": self.since,
            "diagnosis": to_json(result) if result else None,
            "error": error,
        }

    def _deliver(self, record: dict[str, Any], result: Diagnosis | None) -> None:
        self.emit(record)
        if self.forwarder is None:
            return
        try:
            self.forwarder.send(record, result)
            self.counters.add("forwards", "ok")
        except Exception as exc:  # a chat outage must not stop diagnoses
            self.counters.add("forwards", "error")
            log.error("forwarding %s failed: %s", record["alert"], exc)

    def _scope_text(self, a: FiringAlert) -> str:
        return f"({_fmt_scope(scope_of(a, self.cfg))})"


def _fmt_scope(scope: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in scope.items()) or "every model"
