"""Run a scenario: traffic in, servers simulated, samples recorded at every scrape."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np

from diagnoser.metrics import engines
from diagnoser.metrics.exposition import Recorder, labels_of, text_exposition
from diagnoser.probe.metrics import ProbeMetrics
from diagnoser.sim.engine import Request
from diagnoser.sim.scenario import Change, ModelScenario, Probe, Scenario, resolve
from diagnoser.sim.server import Server, ServerSpec

TICK = 1.0  # seconds of simulated time per step of the outer loop


class ModelRun:
    """One served model: its servers, its traffic, its timeline."""

    def __init__(self, m: ModelScenario, start: float, rng: np.random.Generator):
        self.m, self.rng = m, rng
        # A disaggregated model's prefill entry names its servers apart from its decode one's
        slug = _slug(m.name) + ("-prefill" if m.engine.kv_producer else "")
        self.servers = [
            Server(
                ServerSpec(
                    model_name=m.name,
                    spec=m.spec,
                    gpu=m.gpu,
                    engine=dataclasses.replace(m.engine),
                    api=m.api,
                    engines=m.engines,
                    version=m.version,
                    runtime=m.runtime,
                    job=m.runtime,
                    instance=(
                        f"{slug}-{i}:{engines.get(m.runtime).port}"
                        if m.platform == "kubernetes"
                        else f"gpu-node-{slug}-{i}:{engines.get(m.runtime).port}"
                    ),
                    ordinal=i,
                    pod=f"{slug}-{i}",
                    node=f"gpu-node-{slug}-{i}",
                    dcgm=m.dcgm,
                    kubernetes=m.platform == "kubernetes",
                    rollout=m.rollout,
                    kube_exporters=m.kube_exporters,
                ),
                start=start,
                fault=m.fault,
            )
            for i in range(m.instances)
        ]
        self.start = start
        self.next_id = 0
        self.probe = ProbeMetrics()
        self.next_probe = start
        self.injected: list[tuple[Request, bool]] = []
        self._ramps: list[tuple[Change, dict[str, float]]] = []
        self._applied = 0

    # --- timeline -------------------------------------------------------------------------

    def apply_timeline(self, t: float) -> None:
        rel = t - self.start
        timeline = self.m.timeline
        while self._applied < len(timeline) and timeline[self._applied].at <= rel:
            change = timeline[self._applied]
            self._applied += 1
            engine_before = dataclasses.replace(self.m.engine)
            if change.over > 0:
                begin = {k: float(getattr(*resolve(self.m, k))) for k in change.set}
                self._ramps.append((change, begin))
            else:
                for knob, value in change.set.items():
                    obj, attr = resolve(self.m, knob)
                    setattr(obj, attr, value)
            if change.restart or self.m.engine != engine_before:
                self._rolling_restart(t)
        for change, begin in list(self._ramps):
            frac = min(1.0, (rel - change.at) / change.over)
            for knob, v0 in begin.items():
                obj, attr = resolve(self.m, knob)
                ramped: Any = v0 + (float(change.set[knob]) - v0) * frac
                current = getattr(obj, attr)
                if isinstance(current, int) and not isinstance(current, bool):
                    ramped = round(ramped)
                setattr(obj, attr, ramped)
            if frac >= 1.0:
                self._ramps.remove((change, begin))

    def _rolling_restart(self, t: float) -> None:
        # One server at a time: the next goes down once the previous is back.
        stagger = self.m.fault.restart_seconds + 30.0
        for i, server in enumerate(self.servers):
            server.schedule_restart(t + stagger * i, dataclasses.replace(self.m.engine))

    # --- traffic --------------------------------------------------------------------------

    def _arrivals(self, t: float, dt: float) -> list[tuple[Request, bool]]:
        w, rng = self.m.workload, self.rng
        rate = w.rate.at(t - self.start, w.step_noise(rng, dt))
        n = int(rng.poisson(rate * dt))
        if n == 0:
            return []
        times = t + np.sort(rng.random(n)) * dt
        prompts = w.prompt.sample(rng, n)
        outs = w.output.sample(rng, n)
        broken = rng.random(n) < w.stop_failure_share
        overlong = rng.random(n) < w.overlong_share
        adapters = _adapters(rng, n, w.adapters, w.adapter_skew)
        limit = self.m.engine.max_model_len
        prompts = np.where(overlong, limit + 1 + (prompts % max(1, limit // 10)), prompts)
        out = []
        # As Python numbers: one conversion per array, not per element.
        for arrival, prompt, drawn, stops_not, adapter in zip(
            times.tolist(),
            prompts.tolist(),
            outs.tolist(),
            broken.tolist(),
            adapters.tolist(),
            strict=True,
        ):
            target = w.max_tokens if stops_not else int(min(drawn, w.max_tokens))
            # The server also refuses prompts that leave no room for one output token.
            too_long = prompt >= limit
            target = max(1, min(target, limit - prompt)) if not too_long else target
            req = Request(
                self.next_id,
                arrival,
                prompt,
                target,
                w.max_tokens,
                length_stop=target >= w.max_tokens or target >= limit - prompt,
                shared=w.prefix_share,
                accept=w.draft_acceptance,
                adapter=adapter,
            )
            self.next_id += 1
            out.append((req, too_long))
        return out

    def _probes(self, t: float, dt: float) -> list[tuple[Request, bool]]:
        p = self.m.probe
        out: list[tuple[Request, bool]] = []
        while p.enabled and self.next_probe < t + dt:
            for tokens in p.buckets:
                label = Probe.bucket_label(tokens)
                self.probe.bucket(label)
                req = Request(
                    self.next_id,
                    self.next_probe,
                    tokens,
                    p.max_tokens,
                    p.max_tokens,
                    length_stop=True,
                    probe=label,
                )
                self.next_id += 1
                out.append((req, tokens >= self.m.engine.max_model_len))
            self.next_probe += p.every
        return out

    # --- requests from real clients (the live server's OpenAI-compatible API) --------------

    def serving(self) -> bool:
        return any(s.up for s in self.servers)

    def inject(self, req: Request, too_long: bool = False) -> None:
        """Hand a client's request to the servers at the next step, like the scenario's own.

        ``too_long`` ones were already answered 400; the API server still tokenized them.
        """
        req.rid = self.next_id
        self.next_id += 1
        self.injected.append((req, too_long))

    def progress(self, req: Request) -> tuple[int, float]:
        """Tokens generated so far and the time of the latest one."""
        if not req.outcome:
            for server in self.servers:
                for engine in server.engines:
                    found = engine.running.progress(req)
                    if found is not None:
                        return found
        return req.generated, req.last_token

    # --- one step -------------------------------------------------------------------------

    def step(self, t: float, dt: float) -> None:
        self.apply_timeline(t)
        for server in self.servers:
            for lost in server.maintain(t):
                lost.outcome = "aborted"
                if lost.probe is not None:
                    self._probe_failed(lost.probe)
        # Tokenization is first come, first served: keep the tick's requests in arrival order.
        incoming = self._arrivals(t, dt) + self._probes(t, dt)
        if self.injected:
            incoming += self.injected
            self.injected = []
        incoming.sort(key=lambda x: x[0].arrival)
        up = [s for s in self.servers if s.up]
        if incoming:
            if not up:
                for req, _ in incoming:
                    req.outcome = "aborted"
                    if req.probe is not None:
                        self._probe_failed(req.probe)
            else:
                pick = self._route(len(up), len(incoming))
                for k, server in enumerate(up):
                    batch = [incoming[i] for i in np.flatnonzero(pick == k)]
                    if batch:
                        reqs, overlong = zip(*batch, strict=True)
                        server.accept(list(reqs), np.array(overlong))
                        for req, too_long in batch:
                            if too_long and req.probe is not None:
                                self._probe_failed(req.probe)
        for server in self.servers:
            server.advance(t + dt, dt)

    def _route(self, servers: int, n: int) -> np.ndarray:
        """Which live server each of ``n`` requests goes to: evenly at random, or the first
        takes ``hot_share`` of them and the rest share what is left."""
        hot = self.m.workload.hot_share
        if hot <= 0 or servers < 2:
            return self.rng.integers(0, servers, n)
        rest = (1.0 - hot) / (servers - 1)
        return self.rng.choice(servers, n, p=[hot, *([rest] * (servers - 1))])

    def _probe_failed(self, label: str) -> None:
        self.probe.count(label, "http_error")

    def _probe_done(self, req: Request) -> None:
        c = self.m.client
        label = req.probe or ""
        ttft = req.first_token - req.arrival + 2 * c.network_seconds
        e2e = req.last_token - req.arrival + 2 * c.network_seconds
        if c.buffering_proxy:
            ttft = e2e  # the proxy releases the stream only when it is complete
        gaps = req.generated - 1
        gap = 0.0005 if c.buffering_proxy else (req.last_token - req.first_token) / max(1, gaps)
        self.probe.observe_ok(
            label, ttft, e2e, [gap] if gaps > 0 else [], [float(gaps)] if gaps > 0 else None
        )

    # --- scrape ---------------------------------------------------------------------------

    PROBE_TARGET: ClassVar[dict[str, str]] = {"job": "llm-probe", "instance": "llm-probe:9464"}

    def _collect(self) -> None:
        for server in self.servers:
            for req in server.collect():
                if req.probe is not None and req.outcome == "error":
                    self._probe_failed(req.probe)  # its KV load failed: an HTTP 500
                elif req.probe is not None:
                    self._probe_done(req)

    def record(self, rec: Recorder, t: float, interval: float) -> None:
        """A scrape of every target, as Prometheus stores it (target labels and ``up``)."""
        self._collect()
        for server in self.servers:
            server.record(rec, t, interval)
        if not self.m.probe.enabled:
            return
        target = self.PROBE_TARGET
        rec.sample("up", "gauge", "Scrape health.", labels_of(**target), t, 1.0)
        self.probe.record(rec, t, self.m.name, self.m.probe.target, **target)

    def expose(self, t: float, interval: float) -> dict[str, str | None]:
        """Each target's ``/metrics`` body at a scrape, by path, as the targets themselves
        serve it: no target labels; ``None`` while the server is down."""
        self._collect()
        pages: dict[str, str | None] = {}
        for server in self.servers:
            rec = Recorder(history=False)
            server.record_metrics(rec, t, {})
            pages[f"/servers/{server.s.pod}/metrics"] = text_exposition(rec) if server.up else None
            if server.s.dcgm:
                rec = Recorder(history=False)
                server.record_dcgm(rec, t, interval, target=False)
                pages[f"/dcgm/{server.s.node}/metrics"] = text_exposition(rec)
        if self.m.probe.enabled:
            rec = Recorder(history=False)
            self.probe.record(rec, t, self.m.name, self.m.probe.target)
            pages[f"/probe/{_slug(self.m.name)}/metrics"] = text_exposition(rec)
        return pages

    def targets(self) -> list[tuple[str, dict[str, str]]]:
        """Each target's path and the labels service discovery gives it."""
        out = []
        for server in self.servers:
            out.append((f"/servers/{server.s.pod}/metrics", server.target_labels()))
            if server.s.dcgm:
                out.append((f"/dcgm/{server.s.node}/metrics", server.dcgm_target()))
        if self.m.probe.enabled:
            out.append((f"/probe/{_slug(self.m.name)}/metrics", dict(self.PROBE_TARGET)))
        return out


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in name.lower()).strip("-")


def simulate(sc: Scenario, end: float, rec: Recorder | None = None) -> Recorder:
    """Simulate ``sc`` so that its last scrape is at ``end`` (a Unix timestamp)."""
    rec = rec or Recorder()
    for _t in run_iter(sc, end, rec):
        pass
    return rec


def run_iter(sc: Scenario, end: float, rec: Recorder) -> Iterator[float]:
    """The simulation of ``sc.duration`` up to ``end``, as a generator of scrape times."""
    end = math.floor(end / sc.scrape_interval) * sc.scrape_interval
    yield from Simulation(sc, rec, end - sc.duration).run(end)


class Simulation:
    """Every model of a scenario, stepped together and recorded at every scrape."""

    def __init__(self, sc: Scenario, rec: Recorder, start: float, live: bool = False):
        self.rec = rec
        self.live = live
        self.pages: dict[str, str | None] = {}  # live: each target's latest /metrics
        self.interval = sc.scrape_interval
        rng = np.random.default_rng(sc.seed)
        self.runs = [
            ModelRun(m, start, np.random.default_rng(rng.integers(2**32)))
            for m in _fresh(sc.models)
        ]
        self.t = start
        self.next_scrape = start

    def model(self, name: str) -> ModelRun | None:
        return next((r for r in self.runs if r.m.name == name), None)

    def run(self, end: float, exact: bool = False) -> Iterator[float]:
        """Step up to ``end``, yielding each scrape time once it is recorded.

        ``exact`` never steps past ``end`` (the live server follows the wall clock with it);
        otherwise the last step may overrun it, as the batch simulation always has.
        """
        while self.t < (end - 1e-9 if exact else end + 1e-9):
            if self.t >= self.next_scrape - 1e-9:
                for run in self.runs:
                    if self.live:
                        self.pages.update(run.expose(self.next_scrape, self.interval))
                    else:
                        run.record(self.rec, self.next_scrape, self.interval)
                yield self.next_scrape
                self.next_scrape += self.interval
            dt = min(TICK, self.next_scrape - self.t)
            if exact:
                dt = min(dt, end - self.t)
            for run in self.runs:
                run.step(self.t, dt)
            self.t += dt


def _fresh(models: list[ModelScenario]) -> list[ModelScenario]:
    """Deep copies, so a timeline run does not change the loaded scenario."""
    import copy

    return copy.deepcopy(models)


def _adapters(rng: np.random.Generator, n: int, adapters: int, skew: float) -> np.ndarray:
    """The LoRA adapter each of ``n`` requests names (-1: none), Zipf-weighted by ``skew``."""
    if adapters <= 0:
        return np.full(n, -1)
    weights = 1.0 / np.arange(1, adapters + 1) ** skew
    return rng.choice(adapters, n, p=weights / weights.sum())
