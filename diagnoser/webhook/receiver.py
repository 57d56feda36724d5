"""Alerts that arrive diagnosed: an Alertmanager webhook receiver that runs ``diagnose``.

For each firing alert that names a detectable playbook (its ``playbook`` label), the diagnosis
of that alert's model (or target) over the last ``since`` is emitted as one JSON line, with
the alert's playbook id and ``runbook_url`` beside the diagnosis's findings, and optionally
forwarded to a Slack-compatible incoming webhook.

The work is bounded: notifications become jobs in a queue of at most ``max_pending`` alerts
(a notification that would go beyond answers 503, so Alertmanager retries later), one job per
alert group runs at a time (a newer notification for a queued group joins the queued one), a
small pool of workers runs them, and an alert already diagnosed within ``dedupe_window`` is
skipped (the dedupe entries are dropped once their window has passed).

Every alert accepted gets a record: diagnosed, failed (the source failed, or the diagnosis
raised: the record carries the error, the failure is counted, and the alert is not remembered
as seen, so Alertmanager's next send is diagnosed), or undone (the receiver stopped before
its diagnosis ended: ``drain``, which a second signal ends early). A record that ``emit``
cannot write (stdout closed, its reader gone, a full disk) is logged whole instead, and the
chat post is sent all the same. The HTTP side is in ``webhook.http``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from diagnoser.diagnosis import Diagnosis, to_json
from diagnoser.plumbing.durations import iso, parse_time
from diagnoser.plumbing.source import MetricSource, SourceError
from diagnoser.request import Request, Scope, run
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


class Recent(Protocol):
    """A diagnosis already made that is as good as a new one (``watch.loop.Watch.recent``):
    that of ``scope`` from a cycle whose window ends at or after ``begun``, or None."""

    def __call__(self, scope: dict[str, str], begun: float | None) -> Diagnosis | None: ...


class Forwarder(Protocol):
    def send(self, record: dict[str, Any], diagnosis: Diagnosis | None) -> None: ...


class Stopping(Protocol):
    """What stopped the receiver (``webhook.stop.SignalStop``)."""

    def why(self) -> str: ...  # "on SIGTERM", or ""

    def cut(self) -> str | None: ...  # why the drain ends now ("a second signal (SIGINT)")


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
    each diagnosis window) are injectable. With ``recent`` (``servediag watch --alerts``), an
    alert's model is answered from the watch's last cycle when that is as good as a new
    diagnosis, and diagnosed anew only when it is not.
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
        recorded_rules: bool = False,
        max_pending: int = 100,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], float] = time.time,
        recent: Recent | None = None,
    ):
        self.site, self.emit = site, emit
        self.recent = recent
        self.cfg = site.config
        # Every alert's diagnosis: this, scoped to the alert and ending when it is diagnosed.
        self.request = Request(
            source,
            site,
            since,
            baseline=baseline_offset,
            lookback=lookback,
            step=step,
            recorded_rules=recorded_rules,
        )
        self.forwarder = forwarder
        self.dedupe_window = dedupe_window
        self.clock, self.now = clock, now
        self.playbooks = {pb.id for pb in site.catalog.detectable()}
        # When each alert was last accepted, oldest first (pruned past the dedupe window).
        self.seen: OrderedDict[tuple[Any, ...], float] = OrderedDict()
        self.seen_lock = threading.Lock()
        self.counters = Counters()
        self.dispatcher = Dispatcher(self.run, workers, max_pending)
        self.draining = False
        # Records are emitted under this lock's rule: never after ``drain`` gave up on them.
        self.delivery = threading.Condition()
        self.closed = False
        self.emitting = 0

    def start(self) -> None:
        self.dispatcher.start()

    def close(self, timeout: float = 5.0) -> None:
        self.drain(timeout)

    def drain(self, grace: float, stopping: Stopping | None = None) -> int:
        """Stop taking notifications, let the queue run for up to ``grace`` seconds (less if
        ``stopping`` says the drain was cut short), then emit every accepted alert still
        without a record as undone, with the reason. The count of those."""
        self.draining = True
        waiting = self.dispatcher.waiting()
        running = sum(len(job.alerts) for job in list(self.dispatcher.running.values()))
        if waiting or running:
            log.info(
                "up to %g s to finish %d alert(s) being diagnosed and %d waiting",
                grace,
                running,
                waiting,
            )
        cut = (lambda: stopping.cut() is not None) if stopping else (lambda: False)
        finished = self.dispatcher.wait_idle(grace, cut)
        left = self.dispatcher.abandon()
        with self.delivery:
            self.closed = True
            undone = [(job, i) for job in left for i in range(len(job.alerts))]
            undone = [(job, i) for job, i in undone if i not in job.delivered]
            for job, i in undone:
                job.delivered.add(i)
            while self.emitting:  # a worker writing its record: let it finish the line
                self.delivery.wait(1.0)
        forced = stopping.cut() if stopping else None
        if forced:
            why = f"not diagnosed: {forced} ended the receiver's drain"
        else:
            stopped = f"stopped {stopping.why()}".rstrip() if stopping else "stopped"
            why = (
                f"not diagnosed: the receiver {stopped} and its {grace:g} s to finish "
                "(--drain-timeout) ran out"
            )
        for job, i in undone:
            a = job.alerts[i]
            self._forget(a)
            record = self.record(a, job.group_key, scope_of(a, self.cfg), None, why)
            record["outcome"] = "undone"
            self._emit(record)
        if undone:
            self.counters.add("alerts", "undone", len(undone))
            log.warning(
                "stopped with %d alert(s) not diagnosed (emitted as undone)%s",
                len(undone),
                f": {forced} ended the drain" if forced else "",
            )
        elif not finished:
            log.warning("stopped before the last diagnosis ended")
        return len(undone)

    def _emit(self, record: dict[str, Any]) -> None:
        """``emit``, or, when it fails, the record logged whole: never lost silently."""
        try:
            self.emit(record)
            self.counters.add("records", "printed")
        except Exception as exc:
            self.counters.add("records", "logged")
            log.error(
                "%s (%s): its record could not be printed (%s), so it is logged instead: %s",
                record.get("alert"),
                _fmt_scope(record.get("scope") or {}),
                exc,
                json.dumps(record, separators=(",", ":")),
            )

    # --- accepting ----------------------------------------------------------------------

    def _key(self, a: FiringAlert) -> tuple[Any, ...]:
        return (a.name, a.labels.get("playbook"), tuple(sorted(scope_of(a, self.cfg).items())))

    def accept(self, n: Notification) -> str:
        """Queue what needs a diagnosis: ``accepted`` (also when nothing needed one),
        ``queue_full``, ``too_many`` (more new alerts than the queue holds at all) or
        ``draining`` (the receiver is stopping)."""
        if self.draining:
            return "draining"
        fresh: list[FiringAlert] = []
        now = self.clock()
        with self.seen_lock:
            self._prune(now)
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
                elif self._key(a) in self.seen:
                    self.counters.add("alerts", "duplicate")
                    log.info("%s %s: diagnosed recently, skipped", a.name, self._scope_text(a))
                else:
                    self.seen[self._key(a)] = now
                    fresh.append(a)
            if fresh and not self.dispatcher.submit(Job(n.group_key, fresh)):
                for a in fresh:
                    self.seen.pop(self._key(a), None)
                limit = self.dispatcher.max_alerts
                too_many = len(fresh) > limit
                outcome = "too_many" if too_many else "queue_full"
                self.counters.add("alerts", outcome, len(fresh))
                log.log(
                    logging.ERROR if too_many else logging.WARNING,
                    "%s: %d alert(s) of group %s refused (%d waiting, --queue-size %d)%s",
                    "too many alerts" if too_many else "queue full",
                    len(fresh),
                    n.group_key,
                    self.dispatcher.waiting(),
                    limit,
                    "; set max_alerts in Alertmanager's webhook_config" if too_many else "",
                )
                return outcome
        if fresh:
            self.counters.add("alerts", "queued", len(fresh))
            log.info(
                "queued %s for diagnosis",
                ", ".join(f"{a.name} {self._scope_text(a)}" for a in fresh),
            )
        return "accepted"

    def _prune(self, now: float) -> None:
        """Drop the dedupe entries whose window has passed (the oldest come first)."""
        while self.seen:
            key, at = next(iter(self.seen.items()))
            if now - at < self.dedupe_window:
                break
            del self.seen[key]

    def _forget(self, a: FiringAlert) -> None:
        """Not seen after all: Alertmanager's next send of this alert is diagnosed."""
        with self.seen_lock:
            self.seen.pop(self._key(a), None)

    # --- diagnosing ---------------------------------------------------------------------

    def run(self, job: Job) -> None:
        by_scope: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for i, a in enumerate(job.alerts):
            by_scope.setdefault(tuple(scope_of(a, self.cfg).items()), []).append(i)
        for scope_items, indices in by_scope.items():
            if self.closed:
                return
            scope = dict(scope_items)
            names = ", ".join(job.alerts[i].name for i in indices)
            result, error, cycle = None, None, None
            t0 = time.monotonic()
            try:
                cycle = self._recent(scope, [job.alerts[i] for i in indices])
                if cycle is not None:
                    result = cycle
                    self.counters.add("diagnoses", "from_watch_cycle")
                else:
                    within = Scope(labels=tuple(scope.items()))
                    result = run(replace(self.request, until=self.now(), scope=within))
                    self.counters.add("diagnoses", "ok")
            except SourceError as exc:
                error = str(exc)
                self.counters.add("diagnoses", "error")
                log.error("diagnosis of %s failed: %s", _fmt_scope(scope), error)
            except Exception as exc:  # a bug, or an answer nothing expected: still a record
                error = f"internal error: {type(exc).__name__}: {exc}"[:500]
                self.counters.add("diagnoses", "internal_error")
                log.error("diagnosis of %s failed with an %s", _fmt_scope(scope), error)
                log.debug("the internal error's traceback", exc_info=True)
            log.info(
                "diagnosed %s in %.1f s for %s%s",
                _fmt_scope(scope),
                time.monotonic() - t0,
                names,
                " (the watch's last cycle)" if cycle is not None else "",
            )
            for i in indices:
                self._deliver(job, i, scope, result, error, cycle is not None)

    def _recent(self, scope: dict[str, str], alerts: list[FiringAlert]) -> Diagnosis | None:
        """The watch's last cycle of ``scope``, when it saw the newest of ``alerts`` begin."""
        if self.recent is None:
            return None
        begun = [_started(a) for a in alerts]
        known = [b for b in begun if b is not None]
        return self.recent(scope, max(known) if len(known) == len(begun) else None)

    def record(
        self,
        a: FiringAlert,
        group_key: str,
        scope: dict[str, str],
        result: Diagnosis | None,
        error: str | None,
        from_cycle: bool = False,
    ) -> dict[str, Any]:
        playbook = a.labels.get("playbook")
        symptom = a.labels.get("symptom")
        page = playbook or symptom
        ids = [m.playbook.id for m in result.for_alert(playbook)] if result else []
        ended = result.resolved_of(playbook) if result else None
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
            "explained_by": _explained_by(result, playbook, ids),
            # The alert's own pattern, when it stopped holding in the window (no cause now).
            "playbook_resolved_at": iso(ended.end) if ended is not None else None,
            "since_seconds": self.request.since,
            # The watch cycle this diagnosis is (its window's end), or None: run for the alert.
            "from_cycle": iso(result.window.end) if result is not None and from_cycle else None,
            "diagnosis": to_json(result) if result else None,
            "error": error,
            "outcome": "failed" if error else "diagnosed",
        }

    def _deliver(
        self,
        job: Job,
        i: int,
        scope: dict[str, str],
        result: Diagnosis | None,
        error: str | None,
        from_cycle: bool = False,
    ) -> None:
        a = job.alerts[i]
        try:
            record = self.record(a, job.group_key, scope, result, error, from_cycle)
        except Exception as exc:  # the record of a diagnosis that went wrong, without it
            error = f"internal error: {type(exc).__name__}: {exc}"[:500]
            self.counters.add("diagnoses", "internal_error")
            log.error("the record of %s failed with an %s", _fmt_scope(scope), error)
            result = None
            record = self.record(a, job.group_key, scope, None, error)
        if error:
            self._forget(a)
        with self.delivery:
            if self.closed or i in job.delivered:
                return  # given up on by drain, which emitted it as undone
            job.delivered.add(i)
            self.emitting += 1
        try:
            self._emit(record)
        finally:
            with self.delivery:
                self.emitting -= 1
                self.delivery.notify_all()
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


def _started(a: FiringAlert) -> float | None:
    """When the alert began (its ``startsAt``), or None when it does not say."""
    try:
        return parse_time(a.starts_at) if a.starts_at else None
    except ValueError:
        return None


def _explained_by(result: Diagnosis | None, playbook: str | None, ids: list[str]) -> str | None:
    """The finding ranked ahead of the alert's playbook because it is the cause of it (a
    replica's imbalance behind the model's queue), or None."""
    if result is None or not ids or ids[0] == playbook:
        return None
    top = next(m for m in result.findings if m.playbook.id == ids[0])
    return top.playbook.id if top.playbook.explains(playbook) else None
