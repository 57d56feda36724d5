"""The probe's schedule: rounds of one request per prompt class, within a budget.

A round sends one small streamed request per prompt length class, one after another (so the
probe's own requests never queue behind each other), starting with a different class each
round. Rounds start every ``every`` seconds. Two limits keep the probe light on the server:
at most ``budget`` requests start in any 60 seconds, and at most ``max_in_flight`` run at
once (rounds overlap only when the server is slow). A request either limit stops is not sent;
it is counted in ``llm_probe_skipped_total`` by reason.
"""

from __future__ import annotations

import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from diagnoser.metrics.buckets import prompt_bucket_label
from diagnoser.metrics.exposition import Recorder, text_exposition
from diagnoser.plumbing import listener
from diagnoser.probe.metrics import ProbeMetrics
from diagnoser.probe.prompts import Approximation, TokenCounter
from diagnoser.probe.stream import Endpoint, ProbeError, Result, get_json, stream

DEFAULT_CLASSES = (128, 1024, 4096, 16384)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
METRICS_CONNECTIONS = 16  # /metrics served at once


@dataclass
class ProbeConfig:
    endpoint: Endpoint
    model: str
    api: str = "chat"
    classes: tuple[int, ...] = DEFAULT_CLASSES
    every: float = 30.0
    budget: int = 12  # requests started per 60 s
    max_in_flight: int = 2
    max_tokens: int = 16
    timeout: float = 30.0
    target_label: str = ""
    counter: TokenCounter = field(default_factory=Approximation)

    def __post_init__(self) -> None:
        self.target_label = self.target_label or self.endpoint.netloc

    def needed_per_minute(self) -> float:
        return len(self.classes) * 60.0 / self.every


def discover_model(ep: Endpoint, timeout: float) -> str:
    """The first model of ``/v1/models`` that has an id."""
    doc = get_json(ep, "/v1/models", timeout)
    data = doc.get("data") if isinstance(doc, dict) else None
    ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
    named = [i for i in ids if isinstance(i, str) and i.strip()]
    if not named:
        raise ProbeError(f"{ep.shown}: /v1/models lists no model with an id; pass --model")
    return named[0]


class Budget:
    """At most ``per_minute`` requests started in any 60 seconds."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic):
        self.per_minute, self.clock = per_minute, clock
        self.starts: deque[float] = deque()
        self.lock = threading.Lock()

    def take(self) -> bool:
        with self.lock:
            now = self.clock()
            while self.starts and self.starts[0] <= now - 60.0:
                self.starts.popleft()
            if len(self.starts) >= self.per_minute:
                return False
            self.starts.append(now)
            return True


@dataclass
class Attempt:
    """One class of one round: what was sent and what came back (or why nothing was sent)."""

    bucket: str
    tokens: int
    result: Result | None = None
    skipped: str = ""


class Prober:
    def __init__(self, cfg: ProbeConfig, rng: random.Random | None = None):
        self.cfg = cfg
        self.rng = rng or random.Random()
        self.metrics = ProbeMetrics()
        self.lock = threading.Lock()
        self.budget = Budget(cfg.budget)
        self.slots = threading.BoundedSemaphore(cfg.max_in_flight)
        self.rounds = 0
        for tokens in cfg.classes:
            self.metrics.bucket(prompt_bucket_label(tokens))

    def body(self, prompt: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.cfg.model,
            "max_tokens": self.cfg.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.cfg.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        return body

    def probe_one(self, tokens: int) -> Attempt:
        label = prompt_bucket_label(tokens)
        if not self.budget.take():
            return self._skip(label, tokens, "budget")
        if not self.slots.acquire(blocking=False):
            return self._skip(label, tokens, "in_flight")
        try:
            with self.lock:
                prompt, counted = self.cfg.counter.prompt(tokens, self.rng)
            res = self._request(prompt)
        finally:
            self.slots.release()
        with self.lock:
            self.metrics.prompt_tokens[(label, self.cfg.counter.source)] = float(counted)
            if res.prompt_tokens is not None:
                self.metrics.prompt_tokens[(label, "server")] = float(res.prompt_tokens)
            if res.outcome == "ok" and res.e2e is not None:
                self.metrics.observe_ok(label, res.ttft, res.e2e, res.gaps)
            else:
                self.metrics.count(label, res.outcome)
        return Attempt(label, counted, res)

    def _request(self, prompt: str) -> Result:
        """``stream``, whose failures are outcomes; what it raises all the same (an answer
        no one foresaw) is one too, so the request is counted, not lost with its round's
        thread: ``connection_error`` when the connection failed, else ``http_error``."""
        ep = self.cfg.endpoint
        try:
            return stream(ep, self.cfg.api, self.body(prompt), self.cfg.timeout)
        except Exception as exc:
            outcome = "connection_error" if isinstance(exc, OSError) else "http_error"
            detail = ep.clean(f"the request failed: {type(exc).__name__}: {exc}")
            return Result(outcome, detail=" ".join(detail.split())[:300])

    def _skip(self, label: str, tokens: int, reason: str) -> Attempt:
        with self.lock:
            self.metrics.skip(label, reason)
        return Attempt(label, tokens, skipped=reason)

    def round(self) -> list[Attempt]:
        """One request per class, one at a time, starting with the next class in turn."""
        classes = list(self.cfg.classes)
        with self.lock:
            k = self.rounds % len(classes)
            self.rounds += 1
        return [self.probe_one(n) for n in classes[k:] + classes[:k]]

    def render(self) -> str:
        rec = Recorder(history=False)
        with self.lock:
            self.metrics.record(rec, time.time(), self.cfg.model, self.cfg.target_label)
        return text_exposition(rec)

    def run(self, stop: threading.Event, log: Callable[[str], None]) -> None:
        """A round every ``every`` seconds until ``stop``; each round in its own thread."""
        next_at = time.monotonic()
        while not stop.is_set():
            threading.Thread(target=self._logged_round, args=(log,), daemon=True).start()
            next_at += self.cfg.every
            stop.wait(max(0.0, next_at - time.monotonic()))

    def _logged_round(self, log: Callable[[str], None]) -> None:
        try:
            attempts = self.round()
        except Exception as exc:  # one line, not the thread's traceback; the next round runs
            log(f"a round failed: {type(exc).__name__}: {exc}")
            return
        for a in attempts:
            log(describe(a))


def describe(a: Attempt) -> str:
    """One line for a log."""
    if a.result is None:
        return f"{a.bucket}: not sent ({a.skipped})"
    r = a.result
    parts = [f"{a.bucket}: {r.outcome}"]
    if r.ttft is not None:
        parts.append(f"ttft {r.ttft:.3f}s")
    if r.e2e is not None:
        parts.append(f"e2e {r.e2e:.3f}s")
    if r.detail:
        parts.append(r.detail)
    return ", ".join(parts)


def table(attempts: list[Attempt]) -> str:
    """The ``--once`` report: one row per class, in class order."""
    rows = [("class", "prompt", "server", "outcome", "ttft", "itl p50", "e2e", "out", "detail")]
    order = sorted(attempts, key=lambda a: a.tokens)
    for a in order:
        r = a.result
        if r is None:
            rows.append((a.bucket, str(a.tokens), "-", "not sent", "-", "-", "-", "-", a.skipped))
            continue
        rows.append(
            (
                a.bucket,
                str(a.tokens),
                str(r.prompt_tokens) if r.prompt_tokens is not None else "-",
                r.outcome,
                _secs(r.ttft),
                _secs(median(r.gaps)) if r.gaps else "-",
                _secs(r.e2e),
                str(r.tokens),
                r.detail,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = []
    for row in rows:
        cells = [cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def _secs(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}s"


class MetricsServer(listener.Server):
    """The probe's ``/metrics``: a scraper or two, so few connections at once."""

    max_connections = METRICS_CONNECTIONS


def serve_metrics(prober: Prober, host: str, port: int) -> MetricsServer:
    """``/metrics`` on HOST:PORT in a background thread; ``shutdown()`` stops it. Bounded as
    the webhook's listener is (``plumbing.listener``): connections at once, a timeout for each
    read (an idle connection is closed), a deadline per connection, a bounded request head."""

    class Handler(listener.Handler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = prober.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = MetricsServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
