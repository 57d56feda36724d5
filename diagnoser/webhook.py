"""Alerts that arrive diagnosed: an Alertmanager webhook receiver that runs ``diagnose``.

For each firing alert that names a detectable playbook (its ``playbook`` label), the diagnosis
of that alert's model (or target) over the last ``since`` is emitted as one JSON line, with
the alert's playbook id and ``runbook_url`` beside the diagnosis's findings, and optionally
forwarded to a Slack-compatible incoming webhook.

The work is bounded: notifications become jobs in a queue of fixed size (a full queue answers
503, so Alertmanager retries later), one job per alert group runs at a time (a newer
notification for a queued group replaces the queued one), a small pool of workers runs them,
and an alert already diagnosed within ``dedupe_window`` is skipped. A failing diagnosis or
forward is logged and the receiver keeps running. The HTTP side is in ``webhook_http``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from diagnoser.catalog import Catalog
from diagnoser.config import RulesConfig
from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.source import MetricSource, SourceError

log = logging.getLogger("servediag.webhook")


class PayloadError(ValueError):
    """A request body that is not an Alertmanager webhook notification; one line."""


@dataclass(frozen=True)
class FiringAlert:
    name: str
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: str = ""


@dataclass
class Notification:
    group_key: str
    alerts: list[FiringAlert]


def _strings(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise PayloadError(f"{where}: must map names to strings")
    return dict(raw)


def parse_notification(body: bytes) -> Notification:
    """Alertmanager's webhook JSON (version 4) -> ``Notification``; ``PayloadError`` if not."""
    try:
        raw = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PayloadError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise PayloadError("must be a JSON object")
    alerts = raw.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: must be a list")
    out = []
    for i, a in enumerate(alerts):
        if not isinstance(a, dict):
            raise PayloadError(f"alerts[{i}]: must be an object")
        labels = _strings(a.get("labels"), f"alerts[{i}].labels")
        if a.get("status") not in ("firing", "resolved"):
            raise PayloadError(f"alerts[{i}].status: must be firing or resolved")
        out.append(
            FiringAlert(
                name=labels.get("alertname", ""),
                status=str(a["status"]),
                labels=labels,
                annotations=_strings(a.get("annotations", {}), f"alerts[{i}].annotations"),
                starts_at=str(a.get("startsAt", "")),
            )
        )
    group = raw.get("groupKey")
    if group is None:
        group = json.dumps(raw.get("groupLabels") or {}, sort_keys=True)
    if not isinstance(group, str):
        raise PayloadError("groupKey: must be a string")
    return Notification(group, out)


def scope_of(alert: FiringAlert, cfg: RulesConfig) -> dict[str, str]:
    """The labels a diagnosis is scoped to: the model (with the site's group labels), or
    the scrape target for an alert about a server rather than a model."""
    keys = (
        [*cfg.group_labels, "model_name"] if "model_name" in alert.labels else ["job", "instance"]
    )
    return {k: alert.labels[k] for k in keys if k in alert.labels}


def matchers_for(scope: dict[str, str]) -> tuple[str, ...]:
    def quoted(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return tuple(f'{k}="{quoted(v)}"' for k, v in scope.items())


def plan_window(
    since: float, end: float, baseline_offset: float | None = None, step: float | None = None
) -> Window:
    """``Window.plan``; with ``step``, that resolution and rates over four steps (for fast
    scrapes and windows of minutes, where the planned 15 s step and 5 m rates are too coarse)."""
    window = Window.plan(since, end, baseline_offset)
    if step is None:
        return window
    return dataclasses.replace(window, step=step, rate_window=f"{max(2, round(4 * step))}s")


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


class Forwarder(Protocol):
    def send(self, record: dict[str, Any]) -> None: ...


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
        catalog: Catalog,
        emit: Callable[[dict[str, Any]], None],
        cfg: RulesConfig | None = None,
        since: float = 3600.0,
        baseline_offset: float | None = None,
        step: float | None = None,
        forwarder: Forwarder | None = None,
        dedupe_window: float = 3600.0,
        workers: int = 2,
        max_pending: int = 32,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
    ):
        self.source, self.catalog, self.emit = source, catalog, emit
        self.cfg = cfg or RulesConfig()
        self.since, self.baseline_offset, self.step = since, baseline_offset, step
        self.forwarder = forwarder
        self.dedupe_window = dedupe_window
        self.clock, self.now = clock, now
        self.playbooks = {pb.id for pb in catalog.detectable()}
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
                if a.status != "firing":
                    self.counters.add("alerts", "resolved")
                elif a.labels.get("playbook") not in self.playbooks:
                    self.counters.add("alerts", "not_playbook")
                    log.info("%s: not a playbook alert, not diagnosed", a.name or "an alert")
                elif now - self.seen.get(self._key(a), -float("inf")) < self.dedupe_window:
                    self.counters.add("alerts", "duplicate")
                    log.info("%s %s: diagnosed recently, skipped", a.name, _scope_text(a, self))
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
                ", ".join(f"{a.name} {_scope_text(a, self)}" for a in fresh),
            )
        return True

    # --- diagnosing ---------------------------------------------------------------------

    def run(self, job: Job) -> None:
        by_scope: dict[tuple[tuple[str, str], ...], list[FiringAlert]] = {}
        for a in job.alerts:
            by_scope.setdefault(tuple(scope_of(a, self.cfg).items()), []).append(a)
        for scope_items, alerts in by_scope.items():
            scope = dict(scope_items)
            doc, error = None, None
            t0 = time.monotonic()
            try:
                window = plan_window(self.since, self.now(), self.baseline_offset, self.step)
                result = diagnose(self.source, self.catalog, window, matchers_for(scope), self.cfg)
                doc = to_json(result, self.cfg)
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
                self._deliver(self.record(a, job.group_key, scope, doc, error))

    def record(
        self,
        a: FiringAlert,
        group_key: str,
        scope: dict[str, str],
        doc: dict[str, Any] | None,
        error: str | None,
    ) -> dict[str, Any]:
        playbook = a.labels["playbook"]
        findings = doc["findings"] if doc else []
        ids = [f["id"] for f in findings]
        return {
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.now())),
            "alert": a.name,
            "severity": a.labels.get("severity"),
            "playbook": playbook,
            "runbook_url": a.annotations.get("runbook_url") or self.cfg.runbook_for(playbook),
            "summary": a.annotations.get("summary"),
            "scope": scope,
            "starts_at": a.starts_at,
            "group_key": group_key,
            "top_finding": ids[0] if ids else None,
            "playbook_rank": ids.index(playbook) + 1 if playbook in ids else None,
            "since_seconds": self.since,
            "diagnosis": doc,
            "error": error,
        }

    def _deliver(self, record: dict[str, Any]) -> None:
        self.emit(record)
        if self.forwarder is None:
            return
        try:
            self.forwarder.send(record)
            self.counters.add("forwards", "ok")
        except Exception as exc:  # a chat outage must not stop diagnoses
            self.counters.add("forwards", "error")
            log.error("forwarding %s failed: %s", record["alert"], exc)


def _fmt_scope(scope: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in scope.items()) or "every model"


def _scope_text(a: FiringAlert, w: Webhook) -> str:
    return f"({_fmt_scope(scope_of(a, w.cfg))})"
