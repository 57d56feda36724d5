"""One incident on a real vLLM server, end to end: start the server and a Prometheus that
scrapes it every 5 s, drive the phases, diagnose the baseline and the incident, record, and
stop everything it started (also on failure or Ctrl-C).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from diagnoser.diagnosis import to_json
from diagnoser.plumbing.limits import Limit
from diagnoser.site import Site
from lab.promserver import Prometheus, free_port
from lab.real import host, model, record
from lab.real import venv as lab_venv
from lab.real.incident import Incident, Phase
from lab.real.load import Load
from lab.real.outcome import Outcome, diagnosed, summary
from lab.real.replayed import replayed
from lab.real.server import MODEL_NAME, START_TIMEOUT, VllmServer, base_args
from lab.real.venv import LabError

SCRAPE = "5s"
MAX_MODEL_LEN = 32768  # the model's position limit; the server's --max-model-len is lower
# What --scale may multiply a run's durations by: quicker and noisier, or slower and steadier.
SCALE = Limit(0.2, 10)
BACKOFF, MAX_BACKOFF = 10.0, 300.0  # the kubelet's restart back-off: 10 s, doubling to 5 min
LAST_START = 5.0  # no server is started again in a phase's last seconds


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def replica_cores(replicas: int) -> list[tuple[int, ...]]:
    """Each replica's cores: the machine's split evenly among them (a server alone keeps
    them all), or all of them for each where there are fewer cores than replicas."""
    allowed = sorted(os.sched_getaffinity(0))
    if replicas <= 1 or len(allowed) < replicas:
        return [()] * max(replicas, 1)
    share = len(allowed) // replicas
    return [tuple(allowed[i * share : (i + 1) * share]) for i in range(replicas)]


class Run:
    """The state of one run, so that ``close`` can stop whatever was started."""

    def __init__(self, incident: Incident, venv: Path, work: Path, log: Callable[[str], None]):
        self.incident, self.venv, self.work, self.say = incident, venv, work, log
        self.port = free_port()
        cores = replica_cores(incident.replicas)
        # The host as a platform sees it: the server's memory cgroup, node-exporter beside it.
        self.cgroup = (
            host.MemoryCgroup(f"servediag-real-{os.getpid()}") if incident.memory_headroom else None
        )
        self.node = (
            host.NodeExporter(work / "node-exporter.log") if incident.node_exporter else None
        )
        self.server = VllmServer(
            venv, work / "model", self.port, list(incident.server), work / "vllm.log", cores[0],
            cgroup=self.cgroup.procs if self.cgroup else None,
        )  # fmt: skip
        self.memory: dict[str, Any] = {}
        self.prom: Prometheus | None = None
        self.probe: subprocess.Popen[bytes] | None = None
        # More replicas of the same model (an incident's ``replicas``), each on its own port:
        # flags as the first's, no action of a phase touches them.
        self.others = [
            VllmServer(venv, work / "model", free_port(), list(incident.server),
                       work / f"vllm-{i}.log", cores[i])
            for i in range(1, incident.replicas)
        ]  # fmt: skip
        self.load = Load(self.server.url, MODEL_NAME, incident.seed)
        self.load.replicas = [s.url for s in self.others]
        self.times: list[dict[str, Any]] = []
        self.expositions: dict[str, str] = {}
        self.startups: list[float] = []
        self.began = 0.0  # when the phase under way began (epoch seconds)

    def close(self) -> None:
        """Stop the load, the probe, the server and Prometheus. A second Ctrl-C (or a
        SIGTERM) while this runs is ignored, so nothing is left running."""
        held = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._close()
        finally:
            for s, handler in held.items():
                signal.signal(s, handler)

    def _close(self) -> None:
        self.load.stop(drain=5.0)
        if self.probe is not None:
            self.probe.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.probe.wait(10)
            if self.probe.poll() is None:
                self.probe.kill()
                self.probe.wait()
        self.server.stop()
        for other in self.others:
            other.stop()
        if self.node is not None:
            self.node.stop()
        if self.cgroup is not None:
            self.cgroup.close()
        if self.prom is not None:
            self.prom.close()

    def start_server(self, args: list[str] | None = None, timeout: float = START_TIMEOUT) -> None:
        if args is not None:
            self.server.args = args
        took = self.server.start(timeout)
        self.startups.append(round(took, 1))
        self.say(f"      vLLM answered /health after {took:.1f} s ({self.server.url})")

    def limit_memory(self, cgroup: host.MemoryCgroup) -> None:
        """The server's memory limit: its footprint now (at the baseline's end, after ten
        minutes of its traffic) plus the incident's headroom, as a container's limit sized
        from the working set a server has under its usual traffic."""
        footprint = cgroup.footprint()
        cgroup.set_limit(footprint + self.incident.memory_headroom * 2**20)
        self.memory.update(
            footprint_bytes=footprint, limit_bytes=cgroup.limit,
            headroom_mib=self.incident.memory_headroom, host_oom_kills_before=host.host_oom_kills(),
        )  # fmt: skip
        self.say(
            f"      memory limit {cgroup.limit / 2**20:.0f} MiB: the server's "
            f"{footprint / 2**20:.0f} MiB + {self.incident.memory_headroom} MiB"
        )

    def targets(self) -> None:
        """The vLLM job's service discovery: the server's target, as a file Prometheus watches
        (written whole, then renamed, so it never reads half a file)."""
        path = self.work / "targets.json"
        part = path.with_suffix(".part")
        ports = [self.port, *(s.port for s in self.others)]
        part.write_text(json.dumps([{"targets": [f"127.0.0.1:{p}" for p in ports]}]))
        part.replace(path)

    def start_prometheus(self) -> None:
        self.targets()
        sd = {"files": [str(self.work / "targets.json")], "refresh_interval": "5s"}
        jobs: list[dict[str, Any]] = [{"job_name": "vllm", "file_sd_configs": [sd]}]
        if self.incident.probe:
            probe_port = free_port()
            cmd = [
                sys.executable, "-m", "diagnoser", "probe",
                "--target", self.server.url, "--model", MODEL_NAME, "--api", "completions",
                "--classes", "128,1k", "--every", "15s", "--max-tokens", "16",
                "--tokenizer", str(self.work / "model" / "tokenizer.json"),
                "--listen", f"127.0.0.1:{probe_port}",
            ]  # fmt: skip
            with (self.work / "probe.log").open("wb") as fh:
                self.probe = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
            jobs.append(
                {"job_name": "probe", "static_configs": [{"targets": [f"127.0.0.1:{probe_port}"]}]}
            )
        if self.node is not None:
            # The server's host's node-exporter: its instance's host part is the server's,
            # which is how the diagnosis joins a host's series to the model served there.
            self.node.start()
            jobs.append({"job_name": "node", "static_configs": [{"targets": [self.node.target]}]})
        self.prom = Prometheus(
            self.work / "tsdb",
            scrape_configs=jobs,
            config={"global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE}},
        ).start()
        self.say(f"      Prometheus {self.prom.url}, scraping every {SCRAPE}")

    def phase(self, phase: Phase) -> None:
        """Apply the phase's action, set its load, and wait its duration out."""
        t0 = time.time()
        entry: dict[str, Any] = {"name": phase.name, "start": utc(t0), "load": asdict(phase.load)}
        if phase.action:
            entry["action"] = phase.action
        if phase.args:
            entry["args"] = list(phase.args)
        self.times.append(entry)
        self.began = t0
        if self.cgroup is not None and phase is self.incident.incident:
            self.limit_memory(self.cgroup)
        self.load.set(phase.load)
        start = time.monotonic()
        end = start + phase.duration
        if phase.action == "restart":
            self.server.stop()
            self.start_server([*self.incident.server, *phase.args])
        elif phase.action == "kill":
            self.server.kill()
        elif phase.action == "freeze":
            n = self.server.freeze_engine()
            self.say(f"      SIGSTOP to {n} engine process(es)")
        elif phase.action == "thaw":
            self.server.thaw_engine()
            self.say("      SIGCONT to the engine")
        elif phase.action == "start":
            self.start_server()
        elif phase.action == "crash_loop":
            self._crash_loop(phase, end)
        elif phase.action == "replace":
            self._replace(phase, end)
        elif phase.action == "restart_on_exit":
            self._restart_on_exit(end)
        if phase is self.incident.incident:
            # Under load: halfway through (at once when a crash loop took longer than that).
            time.sleep(max(0.0, start + phase.duration / 2 - time.monotonic()))
            if self.server.proc is not None:
                with contextlib.suppress(OSError):
                    self.expositions["metrics-load.txt"] = record.fetch_text(
                        f"{self.server.url}/metrics"
                    )
        time.sleep(max(0.0, end - time.monotonic()))
        entry["end"] = utc(time.time())

    def _crash_loop(self, phase: Phase, end: float) -> None:
        kills = 0
        while time.monotonic() + 10 < end:
            self.server.kill()
            kills += 1
            self.say(f"      killed the server ({kills}); starting it again")
            self.start_server()
            next_kill = time.monotonic() + phase.every
            if next_kill >= end:
                break
            time.sleep(next_kill - time.monotonic())
        self.times[-1]["kills"] = kills

    def _restart_on_exit(self, end: float) -> None:
        """Leave the server to die on its own and start it again after each exit, with the
        kubelet's back-off (``restartPolicy: Always``), until the phase ends."""
        exits: list[dict[str, Any]] = []
        self.times[-1]["exits"] = exits
        backoff = BACKOFF
        while time.monotonic() + LAST_START < end:
            proc = self.server.proc
            if proc is not None and proc.poll() is None:
                time.sleep(0.5)
                continue
            exits.append({"at": utc(time.time()), "status": proc.returncode if proc else None})
            self.say(f"      the server exited ({len(exits)}, status {exits[-1]['status']})")
            self.server.stop()  # what is left of its process group
            time.sleep(max(0.0, min(backoff, end - time.monotonic())))
            backoff = min(2 * backoff, MAX_BACKOFF)
            if time.monotonic() + LAST_START >= end:
                break
            try:
                self.start_server(timeout=max(LAST_START, end - time.monotonic()))
            except LabError as exc:  # died while starting: the next back-off
                self.say(f"      the server did not start again: {exc}")

    def _replace(self, phase: Phase, end: float) -> None:
        """A rollout's new pod in place of the server: the old one stops and leaves service
        discovery, the new one (on a new port, with the phase's flags) is started again after
        each exit with the kubelet's back-off until the phase ends."""
        self.server.stop()
        self.port = free_port()
        log = self.work / "vllm-new.log"
        args = [*self.incident.server, *phase.args]
        self.server = VllmServer(self.venv, self.work / "model", self.port, args, log)
        self.targets()
        backoff, starts = BACKOFF, 0
        while time.monotonic() + 5 < end:
            starts += 1
            try:
                self.start_server(timeout=max(5.0, end - time.monotonic()))
            except LabError as exc:
                self.say(f"      the new server exited ({starts}): {exc}")
            else:
                break  # it came up: the rollout went through
            time.sleep(max(0.0, min(backoff, end - time.monotonic())))
            backoff = min(2 * backoff, MAX_BACKOFF)
        self.times[-1]["starts"] = starts


def windows(incident: Incident, began: float, end: float) -> dict[str, tuple[float, float]]:
    """(since, end) of the two diagnoses: the incident's last phase (which ``began`` at that
    time, and may have run over its duration while a server restarted), and the second half of
    the load before it, ending two scrapes before the incident's first action (its first half,
    warm-up included, is that window's baseline)."""
    loaded = incident.warmup + sum(p.duration for p in incident.phases[:-1])
    return {
        "incident": (incident.incident.duration, end),
        "baseline": (loaded / 2, float(int(began)) - 10.0),
    }


def run(
    incident: Incident,
    venv: Path,
    out: Path | None,
    say: Callable[[str], None],
    scale: float = 1.0,
    server_core: int | None = None,
) -> Outcome:
    """Run ``incident`` (its phases' durations times ``scale``); record into ``out`` when
    given; ``server_core`` pins the (one) server to that core. Raises ``LabError`` naming the
    failed step; nothing is left running."""
    from dataclasses import replace

    if scale != 1.0:
        incident = replace(
            incident,
            warmup=incident.warmup * scale,
            phases=tuple(replace(p, duration=p.duration * scale) for p in incident.phases),
        )
    outcome = Outcome(incident.name, incident.expect, incident.baseline_expect)
    outcome.expect_baseline_health = incident.baseline_health
    t_start = time.monotonic()
    site = Site.default()
    with tempfile.TemporaryDirectory(prefix="servediag-real-") as tmp:
        work = Path(tmp)
        model.make(work / "model", MAX_MODEL_LEN)
        if incident.adapters:
            made = model.make_adapters(work / "model" / "adapters", incident.adapters)
            lora = ("--enable-lora", "--max-lora-rank", str(model.ADAPTER_RANK))
            modules = ("--lora-modules", *(f"{name}={path}" for name, path in made.items()))
            incident = replace(incident, server=(*incident.server, *lora, *modules))
        r = Run(incident, venv, work, say)
        if server_core is not None:
            r.server.cpus = (server_core,)
        try:
            say(f"[{incident.name}] starting vLLM: {' '.join(incident.server) or 'lab defaults'}")
            r.start_server()
            for other in r.others:
                took = other.start()
                r.startups.append(round(took, 1))
                say(f"      replica answered /health after {took:.1f} s ({other.url})")
            r.expositions["metrics-idle.txt"] = record.fetch_text(f"{r.server.url}/metrics")
            r.start_prometheus()
            t0 = time.time()
            first = incident.phases[0]
            r.load.start(first.load)
            say(f"      warm-up {incident.warmup:.0f} s")
            time.sleep(incident.warmup)
            for phase in incident.phases:
                say(
                    f"      phase {phase.name}: {phase.duration:.0f} s at {phase.load.rate:g} req/s"
                    + (f", {phase.action}" if phase.action else "")
                )
                r.phase(phase)
            end = float(int(time.time()))
            assert r.prom is not None
            time.sleep(6)  # the last scrape lands
            got = {}
            for which, (since, until) in windows(incident, r.began, end).items():
                result, rec = diagnosed(r.prom.url, site, since, until)
                got[which] = (result, rec, until, since)
            outcome.first, outcome.confidence, outcome.health, outcome.reasons = summary(
                got["incident"][0]
            )
            outcome.baseline_first, _, outcome.baseline_health, _ = summary(got["baseline"][0])
            outcome.startup_seconds = r.startups
            if out is not None:
                raw = record.openmetrics(record.raw_samples(r.prom, t0 - 60, end + 5))
                files: dict[str, str | bytes] = {"raw.om.gz": raw, **r.expositions}
                meta = {}
                for which, (result, rec, until, since) in got.items():
                    name = f"{which}.json.gz"
                    files[name] = rec.dump(incident=incident.name, end=until, since=since)
                    meta[which] = {"end": until, "since": since, "json": _brief(to_json(result))}
                record.write(out / incident.name, files, _provenance(incident, r, venv, meta))
                _check_replay(out / incident.name, site, got, say)
        finally:
            r.close()
    outcome.wall_seconds = round(time.monotonic() - t_start, 1)
    return outcome


def _check_replay(
    directory: Path, site: Site, got: dict[str, Any], say: Callable[[str], None]
) -> None:
    """The answers just written must give the diagnosis made live: say so when they do not
    (an answer keyed by a query asked twice over different spans, say)."""
    for which, (result, *_rest) in got.items():
        again = summary(replayed(directory, which, site))[0]
        if again != summary(result)[0]:
            say(f"      warning: the {which} replay names {again}, live named {summary(result)[0]}")


def _brief(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "findings": [
            {"id": f["id"], "confidence": f["confidence"]} for f in doc.get("findings", [])
        ],
        "health": [
            {"verdict": h.get("verdict"), "reasons": h.get("reasons")}
            for h in doc.get("health", [])
        ],
    }


def _provenance(
    incident: Incident, r: Run, venv: Path, diagnosed: dict[str, Any]
) -> dict[str, Any]:
    return {
        "incident": incident.name,
        "expect": incident.expect or "none",
        "health": incident.health,
        "vllm": lab_venv.version(venv),
        "servediag_commit": _commit(),
        "vllm_args": [*base_args(), *incident.server],
        "model": {k: model.CONFIG[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size")},
        "scrape_interval": SCRAPE,
        "phases": r.times,
        "client_outcomes": dict(sorted(r.load.outcomes.items())),
        "startup_seconds": r.startups,
        **({"memory": _memory(r.cgroup, r.memory)} if r.cgroup else {}),
        **({"server_cores": list(r.server.cpus)} if r.server.cpus else {}),
        "diagnosed": diagnosed,
    }


def _memory(cgroup: host.MemoryCgroup, memory: dict[str, Any]) -> dict[str, Any]:
    """The server's memory limit and what came of it: its peak, the OOM killer's kills in
    its cgroup and on the host."""
    return {
        **memory,
        "peak_bytes": cgroup.peak(),
        "oom_kills_in_cgroup": cgroup.oom_kills(),
        "host_oom_kills_after": host.host_oom_kills(),
    }


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _commit() -> str:
    """The project's commit the run was made with ("unknown" outside a checkout)."""
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parent,
        check=False,
    )
    return out.stdout.strip() or "unknown"


@contextlib.contextmanager
def interrupted_cleanly() -> Iterator[None]:
    """Ctrl-C or SIGTERM (``timeout``, CI's end): the ``finally`` blocks above stop what was
    started; say so in one line, exit 130."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    except KeyboardInterrupt:
        print("real: interrupted; the server, Prometheus and the load stopped", file=sys.stderr)
        raise SystemExit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
