"""Incident sequences (``fixtures/real/sequences/*.yaml``): one real vLLM server put through
several incidents back to back, each mitigated and followed by healthy minutes, as an evening
on call goes. Recorded into ``tests/data/real-sequences/<name>/`` and replayed by the tests.

A sequence file is an incident file (``lab.real.incident``) without the top-level ``expect``:
each phase says instead what ``diagnose`` must give over its own window (``expect``: the first
current finding, or ``none``; ``health``: the verdict at the window's end) and, after an
incident, which one ended (``resolved``): over that incident's phase and the phase after it
together, diagnose must report it as resolved and find nothing current.

    python -m lab.real.sequence evening --record --server-core 0

Exit status: 0 every window as expected, 1 a step failed or a window was not, 2 bad usage.
"""

from __future__ import annotations

import calendar
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from diagnoser.diagnosis import Diagnosis, Window, diagnose, to_json
from diagnoser.plumbing.errors import UserError, read_yaml_mapping
from diagnoser.site import Site
from lab.promserver import PrometheusError
from lab.real import model, record
from lab.real.incident import (
    ACTIONS,
    HEALTH,
    Incident,
    IncidentError,
    Phase,
    args_field,
    duration_field,
    incident_dir,
    load_spec,
    path_of,
)
from lab.real.load import LoadSpec
from lab.real.outcome import diagnosed
from lab.real.run import MAX_MODEL_LEN, Run, interrupted_cleanly
from lab.real.venv import LabError
from lab.replay import Replay

DATA = record.DATA.parent / "real-sequences"
# The lookback of the Prometheus the raw samples are backfilled into: a few scrapes, where a
# live one had staleness markers (OpenMetrics has none): a crashed server's last samples end
# there as they ended live, instead of lingering for five minutes.
RAW_LOOKBACK = "15s"


@dataclass(frozen=True)
class Expect:
    first: str | None  # the first current finding over the phase's own window (None: none)
    health: str  # the verdict at the window's end: healthy, unhealthy or any
    resolved: str | None = None  # the incident of the phase before, reported as resolved


@dataclass(frozen=True)
class Sequence:
    name: str
    description: str
    server: tuple[str, ...]
    warmup: float
    phases: tuple[Phase, ...]
    expects: tuple[Expect, ...]
    probe: bool = False
    seed: int = 1

    @property
    def duration(self) -> float:
        return self.warmup + sum(p.duration for p in self.phases)

    def as_incident(self) -> Incident:
        """The sequence as ``Run`` drives an incident (its phases in order)."""
        return Incident(self.name, self.description, None, "any", self.server, self.warmup,
                        self.phases, probe=self.probe, seed=self.seed)  # fmt: skip


def sequence_dir() -> Path:
    return incident_dir() / "sequences"


def names() -> list[str]:
    return sorted(p.stem for p in sequence_dir().glob("*.yaml"))


def find(name_or_path: str) -> Sequence:
    return load(path_of(name_or_path, sequence_dir(), "sequence"))


def _playbook(path: Path, where: str, raw: object) -> str | None:
    if not isinstance(raw, str) or not raw:
        raise IncidentError(path, where, "must name a playbook, or say none")
    return None if raw == "none" else raw


def load(path: Path) -> Sequence:
    doc = read_yaml_mapping(path, IncidentError, "a sequence")
    raw_phases = doc.get("phases")
    if not isinstance(raw_phases, list) or len(raw_phases) < 3:
        raise IncidentError(path, "phases", "must list a baseline and at least two phases")
    spec = LoadSpec(rate=0.0)
    phases, expects = [], []
    for i, raw in enumerate(raw_phases):
        where = f"phases[{i}]"
        if not isinstance(raw, dict):
            raise IncidentError(path, where, "must be a mapping")
        spec = load_spec(path, f"{where}.load", raw.get("load"), spec)
        action = raw.get("action")
        if action is not None and action not in ACTIONS:
            raise IncidentError(path, f"{where}.action", f"must be one of {', '.join(ACTIONS)}")
        health = raw.get("health", "any")
        if health not in HEALTH:
            raise IncidentError(path, f"{where}.health", f"must be one of {', '.join(HEALTH)}")
        resolved = raw.get("resolved")
        if resolved is not None and i == 0:
            raise IncidentError(path, f"{where}.resolved", "the first phase follows no incident")
        phases.append(
            Phase(
                name=str(raw.get("name", f"phase {i + 1}")),
                duration=duration_field(path, f"{where}.duration", raw.get("duration")),
                load=spec,
                action=action,
                args=args_field(path, f"{where}.args", raw.get("args")),
            )
        )
        expects.append(
            Expect(
                _playbook(path, f"{where}.expect", raw.get("expect")),
                health,
                None if resolved is None else _playbook(path, f"{where}.resolved", resolved),
            )
        )
    seed = doc.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise IncidentError(path, "seed", "must be an integer")
    return Sequence(
        name=path.stem,
        description=" ".join(str(doc.get("description", "")).split()),
        server=args_field(path, "server", doc.get("server")),
        warmup=duration_field(path, "warmup", doc.get("warmup", "1m")),
        phases=tuple(phases),
        expects=tuple(expects),
        probe=bool(doc.get("probe", False)),
        seed=seed,
    )


def windows(seq: Sequence, times: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """(since, end) of each window diagnosed: ``phase-<i>``, each phase's own; ``after-<i>``,
    an incident's phase and the phase after it that says it ``resolved``."""
    out = {}
    for i, (t, e) in enumerate(zip(times, seq.expects, strict=True)):
        end = float(int(t["end"]))
        out[f"phase-{i}"] = (end - t["start"], end)
        if e.resolved is not None:
            out[f"after-{i}"] = (end - times[i - 1]["start"], end)
    return out


@dataclass
class Said:
    """What one window's diagnosis said: its first current finding, the verdict, the
    findings it reports as resolved."""

    first: str | None
    health: str
    resolved: list[str]

    def ok(self, which: str, e: Expect) -> bool:
        health = e.health in ("any", self.health)
        if which.startswith("after-"):
            return self.first is None and e.resolved in self.resolved and health
        return self.first == e.first and health

    def line(self, which: str, e: Expect) -> str:
        want = f"resolved {e.resolved}" if which.startswith("after-") else (e.first or "none")
        gone = f"  resolved {', '.join(self.resolved)}" if self.resolved else ""
        return (
            f"{'ok  ' if self.ok(which, e) else 'MISS'} {which:<9} expect {want:<38} "
            f"first {self.first or 'none':<28} health {self.health:<9}{gone}"
        )


def said(result: Diagnosis) -> Said:
    first = result.findings[0].playbook.id if result.findings else None
    health = result.health[0].verdict if result.health else "unknown"
    return Said(first, health, [m.playbook.id for m in result.resolved])


def expectation(seq: Sequence, which: str) -> Expect:
    return seq.expects[int(which.split("-")[1])]


def run(seq: Sequence, venv: Path, out: Path | None, say: Callable[[str], None],
        server_core: int | None = None) -> dict[str, Said]:  # fmt: skip
    """Run ``seq``; record into ``out`` when given. Raises ``LabError`` naming the failed
    step; nothing is left running."""
    site = Site.default()
    incident = seq.as_incident()
    with tempfile.TemporaryDirectory(prefix="servediag-sequence-") as tmp:
        work = Path(tmp)
        model.make(work / "model", MAX_MODEL_LEN)
        r = Run(incident, venv, work, say)
        if server_core is not None:
            r.server.cpus = (server_core,)
        try:
            say(f"[{seq.name}] starting vLLM: {' '.join(seq.server)}")
            r.start_server()
            r.start_prometheus()
            t0 = time.time()
            r.load.start(seq.phases[0].load)
            say(f"      warm-up {seq.warmup:.0f} s")
            time.sleep(seq.warmup)
            for phase in seq.phases:
                action = f", {phase.action}" if phase.action else ""
                rate = f"{phase.load.rate:g} req/s{action}"
                say(f"      phase {phase.name}: {phase.duration:.0f} s at {rate}")
                r.phase(phase)
            end = float(int(time.time()))
            time.sleep(6)  # the last scrape lands
            assert r.prom is not None
            times = [_epochs(t) for t in r.times]
            got: dict[str, Said] = {}
            files: dict[str, str | bytes] = {}
            meta: dict[str, Any] = {}
            for which, (since, until) in windows(seq, times).items():
                result, rec = diagnosed(r.prom.url, site, since, until)
                got[which] = said(result)
                say(got[which].line(which, expectation(seq, which)))
                files[f"{which}.json.gz"] = rec.dump(sequence=seq.name, end=until, since=since)
                meta[which] = {"end": until, "since": since, "json": _brief(to_json(result))}
            if out is not None:
                raw = record.openmetrics(record.raw_samples(r.prom, t0 - 60, end + 5))
                files["raw.om.gz"] = raw
                prov = {"sequence": seq.name, "phases": r.times, "diagnosed": meta,
                        "client_outcomes": dict(sorted(r.load.outcomes.items())),
                        "startup_seconds": r.startups, "server_core": server_core}  # fmt: skip
                record.write(out / seq.name, files, prov)
        finally:
            r.close()
    return got


def _epochs(entry: dict[str, Any]) -> dict[str, float]:
    def epoch(s: str) -> float:
        return float(calendar.timegm(time.strptime(s, "%Y-%m-%dT%H:%M:%SZ")))

    return {"start": epoch(entry["start"]), "end": epoch(entry["end"])}


def _brief(doc: dict[str, Any]) -> dict[str, Any]:
    return {
        "findings": [{"id": f["id"], "confidence": f["confidence"]} for f in doc["findings"]],
        "resolved": [f["id"] for f in doc.get("resolved", [])],
        "health": [h.get("verdict") for h in doc.get("health", [])],
    }


def recorded() -> list[Path]:
    return sorted(p.parent for p in DATA.glob("*/provenance.json"))


def replayed(directory: Path, which: str, site: Site) -> Diagnosis:
    replay = Replay(directory / f"{which}.json.gz")
    return diagnose(replay, site, Window.plan(replay.meta["since"], replay.meta["end"]))


def replay_all(site: Site | None = None) -> list[tuple[str, str, Said, Expect]]:
    """(sequence, window, what was said, what was expected) of every recorded window."""
    site = site or Site.default()
    out = []
    for directory in recorded():
        seq = find(directory.name)
        for path in sorted(directory.glob("*.json.gz"), key=_order):
            which = path.name.removesuffix(".json.gz")
            out.append((seq.name, which, said(replayed(directory, which, site)),
                        expectation(seq, which)))  # fmt: skip
    return out


def _order(path: Path) -> tuple[int, str]:
    kind, _, i = path.name.removesuffix(".json.gz").partition("-")
    return (int(i), kind) if i.isdigit() else (-1, kind)


def rerecord(name: str) -> str:
    """Record every window's answers of ``name`` again from its raw samples."""
    directory = DATA / name
    site = Site.default()
    with (
        tempfile.TemporaryDirectory(prefix="servediag-rerecord-") as tmp,
        record.raw_prometheus(directory, Path(tmp), RAW_LOOKBACK) as prom,
    ):
        n = 0
        for path in sorted(directory.glob("*.json.gz")):
            meta = Replay(path).meta
            _, rec = diagnosed(prom.url, site, meta["since"], meta["end"])
            path.write_bytes(rec.dump(**meta))
            n += 1
    return f"{name}: {n} windows recorded again from raw samples"


@click.command()
@click.argument("name", default="evening")
@click.option("--record", "record_", is_flag=True, help="Write into tests/data/real-sequences/.")
@click.option(
    "--server-core",
    type=click.IntRange(0),
    default=None,
    help="Pin the server to this core (run the rest on another, with taskset).",
)
@click.option(
    "--venv",
    type=click.Path(path_type=Path),
    default=Path(".venv-vllm"),
    show_default=True,
    help="vLLM's CPU build is installed here.",
)
@click.option("--bench", "bench_", is_flag=True, help="Every recorded window, replayed.")
@click.option("--rerecord", "again", is_flag=True, help="Answers again from the raw samples.")
def main(name: str, record_: bool, server_core: int | None, venv: Path, bench_: bool,
         again: bool) -> None:  # fmt: skip
    """Run a sequence of incidents on one real vLLM server (CPU build) and diagnose each
    phase's window."""
    if bench_:
        results = replay_all()
        for named, which, s, e in results:
            click.echo(f"{named}: {s.line(which, e)}")
        ok = sum(s.ok(w, e) for _, w, s, e in results)
        click.echo(f"sequence windows, replayed: {ok}/{len(results)} as expected")
        return
    try:
        chosen = find(name)
    except UserError as exc:
        click.echo(f"sequence: {exc}", err=True)
        sys.exit(2)
    if again:
        try:
            click.echo(rerecord(chosen.name))
        except (PrometheusError, OSError) as exc:
            click.echo(f"sequence: recording {chosen.name} again failed: {exc}", err=True)
            sys.exit(1)
        return
    try:
        with interrupted_cleanly():
            got = run(chosen, venv, DATA if record_ else None, click.echo, server_core)
    except (LabError, PrometheusError, OSError) as exc:
        click.echo(f"sequence: {chosen.name} failed: {exc}", err=True)
        sys.exit(1)
    ok = sum(s.ok(w, expectation(chosen, w)) for w, s in got.items())
    click.echo(f"{chosen.name}: {ok}/{len(got)} windows as expected")
    sys.exit(0 if ok == len(got) else 1)


if __name__ == "__main__":
    from lab.args import click_main

    click_main(main, "python -m lab.real.sequence")
