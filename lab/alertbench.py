"""``python -m lab.bench alerts``: the generated alerts' precision on healthy services and
their recall on incidents, over backfilled history (``lab.alerts``).

Healthy cases: the library's healthy scenarios, the wider healthy world of
``fixtures/healthy`` (quiet models, deploys and rollbacks, rollouts to new pods, scrape
intervals from 5 s to 60 s, pre-0.11 names, replicas with normal skew, steady speculative
decoding and LoRA), variants of both (other seeds, pre-0.11 names on odd ``k``, scrape
intervals of 5, 30 and 60 s, and failed scrapes and one-scrape gaps on even ``k``: variants
2, 3 and 4 were looked at while the rules were fixed, 9, 10 and 12 are kept out of tuning),
and the healthy phases of every real recording (the baselines, a planned restart, the windows
after each recovery of the evening sequence). A page is an alert that starts firing in a healthy
stretch whose expression began to hold there too (one still resolving from the incident
before it is reported apart). Incidents: every library incident must raise its playbook's
alert at or after its onset (the scenario's first change), evaluated over the whole scenario
and simulated on for the longest ``for:`` of that playbook's alerts (an incident does not end
with its scenario: an alert whose expression holds at the end is given its ``for:``); and a
crash, half the requests failing and a blown TTFT SLO must page within 5, 5 and 10 minutes of
their onset (the TTFT SLO's: the first moment its 5-minute error ratio passes the budget).
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from diagnoser.metrics.exposition import write_openmetrics
from diagnoser.plumbing.durations import parse_duration
from diagnoser.sim import library
from diagnoser.sim.run import simulate
from diagnoser.sim.scenario import Scenario, load_scenario
from diagnoser.sim.variants import variant
from diagnoser.site.slo import Objectives
from lab.alerts import Episode, _rules, backfill_rules, episodes, needed
from lab.promserver import Prometheus, backfill

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "rules" / "recording.rules.yaml"
ALERTS = ROOT / "rules" / "alerts.rules.yaml"
HEALTHY_WORLD = ROOT / "fixtures" / "healthy"
REAL = ROOT / "tests" / "data" / "real"
SEQUENCES = ROOT / "tests" / "data" / "real-sequences"
TUNED, HELD_OUT = (2, 3, 4), (9, 10, 12)
# A variant's scrape interval, by k: the healthy world is scraped from 5 s to 60 s.
SCRAPES = {2: 30.0, 3: 60.0, 4: 60.0, 9: 30.0, 10: 5.0, 12: 60.0}
# The history the rules need before a stretch is judged (their hour-ago comparisons).
HISTORY = 3600.0
# After an incident, a stretch is judged once the rules' 5-minute rates no longer see it.
SETTLE = 300.0
# The page-delay bounds: what each incident must page within, in seconds from its onset.
DELAY_BOUNDS = {"crash": 300.0, "half the requests failing": 300.0, "TTFT SLO blown": 600.0}


@dataclass(frozen=True)
class Case:
    name: str
    kind: str  # "healthy" or "incident"
    spans: tuple[tuple[float, float], ...]  # the healthy stretches (healthy cases)
    episodes: tuple[Episode, ...]
    onset: float = 0.0  # incidents: when it began
    expect: str = ""  # incidents: the playbook whose alert must fire
    breach: float | None = None  # incidents: when the TTFT SLO was first breached, if it was

    @property
    def hours(self) -> float:
        return sum(b - a for a, b in self.spans) / 3600.0

    def pages(self) -> list[Episode]:
        """The episodes that began in a healthy stretch: their expression began to hold
        there and they fired there."""
        return [
            e for e in self.episodes if any(a <= e.pending and e.at <= b for a, b in self.spans)
        ]

    def carried(self) -> list[Episode]:
        """The episodes that fired in a healthy stretch but began to hold before it (an
        incident's alert still resolving)."""
        mine = {id(e) for e in self.pages()}
        return [
            e
            for e in self.episodes
            if id(e) not in mine and any(a <= e.at <= b for a, b in self.spans)
        ]


def healthy_scenarios() -> list[Scenario]:
    """The library's healthy scenarios and the healthy world's."""
    lib = [sc for sc in map(library.find, library.names()) if sc.labels.healthy]
    world = [load_scenario(p) for p in sorted(HEALTHY_WORLD.glob("*.yaml"))]
    return lib + world


def widened(sc: Scenario, k: int) -> tuple[Scenario, bool]:
    """Variant ``k`` of a healthy scenario, scraped at ``SCRAPES[k]``; and whether its
    scrapes fail now and then (even ``k``)."""
    out = variant(sc, k)
    out.scrape_interval = SCRAPES.get(k, sc.scrape_interval)
    return out, k % 2 == 0


def _blips(om: Path, scrape: float, start: float, end: float) -> None:
    """Failed scrapes in ``om``: every 20 minutes from ``start``, one scrape of the first
    target fails (``up`` 0, none of its other samples), and every 25 minutes one scrape is
    missing for every target (no sample at all: Prometheus itself restarted). A target's last
    scrape does not fail: a target leaving discovery gets stale markers, which a backfill
    cannot write, and its ``up`` 0 would stand for the five minutes of the lookback."""
    failed = {round(t, 3) for t in _every(start, end, 1200.0, scrape)}
    missing = {round(t + 600.0, 3) for t in _every(start, end, 1500.0, scrape)}
    text = om.read_text(encoding="utf-8").splitlines(keepends=True)
    last: dict[str, float] = {}
    for line in text:
        if line.startswith("up{"):
            instance = _instance(line)
            last[instance] = max(last.get(instance, 0.0), float(line.rsplit(" ", 1)[1]))
    first = None
    with om.open("w", encoding="utf-8") as fh:
        for line in text:
            if line.startswith("#"):
                fh.write(line)
                continue
            head, _value, ts = line.rsplit(" ", 2)
            t = round(float(ts), 3)
            if t in missing:
                continue
            instance = _instance(line)
            if t in failed and last.get(instance, 0.0) > t:
                first = first or instance
                if instance == first:
                    if head.startswith("up{"):
                        fh.write(f"{head} 0 {ts}")
                    continue
            fh.write(line)


def _instance(line: str) -> str:
    return line.partition('instance="')[2].partition('"')[0]


def _every(start: float, end: float, period: float, scrape: float) -> Iterator[float]:
    t = start + period
    while t < end:
        yield float(int(t // scrape) * scrape)
        t += period


def grace(playbook: str) -> float:
    """The longest ``for:`` of the alerts of ``playbook``: how long an incident is simulated
    on past its scenario's end."""
    holds = [
        parse_duration(r.get("for", "0s"))
        for r in _rules(ALERTS)
        if r.get("labels", {}).get("playbook") == playbook
    ]
    return max(holds, default=0.0)


def _ttft_breach(prom: Prometheus, since: float, end: float) -> float | None:
    """The first evaluation from ``since`` at which the TTFT SLI's 5-minute error ratio passes
    the SLO's budget (the requests over the threshold are more than the objective allows)."""
    budget = 1 - Objectives().ttft
    series = prom.query_range(
        f"model_name:slo_ttft:error_ratio_rate5m > {budget:g}", since, end, 30.0
    )
    return min((float(t) for s in series for t, _ in s["values"]), default=None)


def _simulated(job: tuple[Scenario, bool, str, float]) -> Case:
    sc, blips, workdir, end = job
    if sc.labels.expect:  # an incident goes on past its scenario: its alerts get their for:
        sc = copy.deepcopy(sc)
        sc.duration += grace(sc.labels.expect[0]) + 60.0
    rec = simulate(sc, end)
    om = Path(workdir) / f"{sc.name}.om"
    with om.open("w", encoding="utf-8") as fh:
        write_openmetrics(rec, fh)
    start = end - sc.duration
    if blips:
        _blips(om, sc.scrape_interval, start, end)
    data = Path(workdir) / sc.name
    backfill(om, data)
    om.unlink()
    incident = bool(sc.labels.expect)
    onset = start + min((c.at for m in sc.models for c in m.timeline if c.at > 0), default=0)
    with Prometheus(data) as prom:
        backfill_rules(prom, RECORDING, start, end, only=needed(RECORDING, ALERTS))
        # An incident over its whole scenario; a healthy stretch once the rules have history.
        found = episodes(prom, ALERTS, start if incident else start + HISTORY, end)
        breach = _ttft_breach(prom, onset, end) if incident else None
    if incident:
        return Case(sc.name, "incident", (), tuple(found), onset, sc.labels.expect[0], breach)
    return Case(sc.name, "healthy", ((start + HISTORY, end),), tuple(found))


def simulated(jobs: list[tuple[Scenario, bool]], end: float) -> list[Case]:
    """Each scenario simulated, backfilled, its rules backfilled and its alerts evaluated,
    in parallel."""
    with tempfile.TemporaryDirectory(prefix="servediag-alertbench-") as tmp:
        args = [(sc, b, tmp, end) for sc, b in jobs]
        workers = max(1, min(len(args), os.cpu_count() or 1))
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(_simulated, args))


def _utc(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@contextmanager
def _raw(directory: Path) -> Iterator[tuple[Prometheus, float, float]]:
    """A Prometheus serving a recording's raw samples with its rules backfilled over them
    (lookback 15 s: the live server's staleness markers are not in the raw samples), and
    the first and last sample's times."""
    from lab.real.record import raw_prometheus

    raw = gzip.decompress((directory / "raw.om.gz").read_bytes()).decode()
    stamps = [float(line.rsplit(" ", 1)[1]) for line in raw.splitlines() if line[:1] not in "#"]
    with (
        tempfile.TemporaryDirectory(prefix="servediag-alertbench-") as tmp,
        raw_prometheus(directory, Path(tmp), lookback="15s") as prom,
    ):
        backfill_rules(prom, RECORDING, min(stamps), max(stamps) + 60.0, interval=15.0)
        yield prom, min(stamps), max(stamps)


def real_cases() -> list[Case]:
    """The real recordings: their healthy phases (a baseline its file expects healthy, a
    phase whose file expects no finding and a healthy verdict, a sequence's gap after an
    incident) as healthy cases. A stretch after an incident is judged from ``SETTLE`` on."""
    out: list[Case] = []
    dirs = sorted(p.parent for p in REAL.glob("*/provenance.json"))
    dirs += sorted(p.parent for p in SEQUENCES.glob("*/provenance.json"))
    for d in dirs:
        prov = json.loads((d / "provenance.json").read_text())
        spans = []
        for i, phase in enumerate(prov["phases"]):
            start, end = _utc(phase["start"]), _utc(phase["end"])
            healthy, after_incident = _healthy_phase(d, prov, i)
            if healthy:
                spans.append((start + (SETTLE if after_incident else 0.0), end))
        with _raw(d) as (prom, lo, hi):
            found = episodes(prom, ALERTS, lo, hi, step=15.0)
        out.append(Case(f"real/{d.name}", "healthy", tuple(spans), tuple(found)))
    return out


def _healthy_phase(directory: Path, prov: dict[str, Any], i: int) -> tuple[bool, bool]:
    """Whether phase ``i`` of a recording is a healthy one, and whether it follows an
    incident."""
    if "sequence" in prov:
        # A sequence: a baseline, then each incident followed by a healthy gap.
        return i % 2 == 0, i > 0
    from lab.real import incident

    if i == 0:  # the baseline, unless its file says it is not healthy (a slow CPU server)
        return incident.find(directory.name).baseline_health == "healthy", False
    return prov.get("expect") == "none" and prov.get("health") == "healthy", False


def delays() -> list[tuple[str, str, float | None]]:
    """Minutes from onset to the page for a crash, half the requests failing and a blown
    TTFT SLO (simulated), with the alert that paged first."""
    crash = load_scenario(ROOT / "tests" / "scenarios" / "crash-stays-down.yaml")
    failing = copy.deepcopy(library.find("kv-transfer-failures"))
    failing.name = "half-failing"
    for m in failing.models:
        for c in m.timeline:
            c.set = {"fault.kv_transfer_failure": 0.5}
    ttft = library.find("queue-saturation")
    end = float(int(time.time()) // 60 * 60)
    cases = simulated([(crash, False), (failing, False), (ttft, False)], end)
    wants = {
        "crash": ("VllmTargetDown",),
        "half the requests failing": (
            "VllmHttpErrors",
            "VllmEngineErrors",
            "VllmAvailabilityBudgetBurn",
        ),
        "TTFT SLO blown": ("VllmTtftBudgetBurn",),
    }
    onsets = {
        "crash": end - crash.duration + 70 * 60,  # its crash (no playbook: it expects none)
        "half the requests failing": cases[1].onset,
        # The load's ramp begins before the SLO is missed: the onset is the breach itself.
        "TTFT SLO blown": cases[2].breach if cases[2].breach is not None else cases[2].onset,
    }
    out = []
    for (what, alerts), case in zip(wants.items(), cases, strict=True):
        fired = [e for e in case.episodes if e.alert in alerts and e.at >= onsets[what]]
        first = min(fired, key=lambda e: e.at, default=None)
        out.append(
            (
                what,
                first.alert if first else "-",
                (first.at - onsets[what]) if first else None,
            )
        )
    return out


def _moment(e: Episode, case: Case) -> str:
    start = case.spans[0][0] if case.spans else 0.0
    scope = e.labels.get("instance") or e.labels.get("model_name", "")
    at, held = (e.at - start) / 60, (e.pending - start) / 60
    return f"{e.alert}{{{scope}}} at +{at:.0f} min (held from +{held:.0f})"


def report_healthy(title: str, cases: list[Case]) -> tuple[int, float]:
    pages = hours = 0.0
    print(f"{title}:")
    for c in cases:
        p = c.pages()
        hours += c.hours
        pages += len(p)
        verdict = "ok" if not p else f"{len(p)} PAGE(S)"
        print(f"  {c.name:<40} {c.hours:4.1f} h  {verdict}")
        for e in p:
            print(f"      {_moment(e, c)}")
        for e in c.carried():
            print(f"      (still resolving from before: {_moment(e, c)})")
    rate = pages / max(hours, 1e-9) * 24
    print(f"  {int(pages)} page(s) over {hours:.1f} healthy hours: {rate:.2f} per healthy day")
    return int(pages), hours


def report_incidents(cases: list[Case]) -> None:
    from diagnoser.catalog import load_catalog

    alerts = {pb.id: pb for pb in load_catalog()}
    raised = 0
    print("incident recall (each library incident raises its playbook's alert; delay from onset):")
    for c in cases:
        mine = [e for e in c.episodes if e.labels.get("playbook") == c.expect and e.at >= c.onset]
        first = min(mine, key=lambda e: e.at, default=None)
        raised += first is not None
        if c.expect not in alerts:
            continue
        took = f"{(first.at - c.onset) / 60:5.1f} min" if first else "MISSED"
        print(f"  {c.name:<40} {c.expect:<32} {took}")
    print(f"  recall: {raised}/{len(cases)}")


def precision(part: str, end: float) -> tuple[int, float]:
    """Pages on one part of the healthy cases: ``base`` (the scenarios as written),
    ``tuned`` or ``held`` (their variants), ``real`` (the recordings' healthy phases)."""
    base = healthy_scenarios()
    if part == "base":
        title = "healthy scenarios (the library's and fixtures/healthy)"
        return report_healthy(title, simulated([(sc, False) for sc in base], end))
    if part == "real":
        return report_healthy("real recordings, healthy phases", real_cases())
    ks = TUNED if part == "tuned" else HELD_OUT
    how = ", ".join(f"{k}: {SCRAPES[k]:g} s{' + failed scrapes' if k % 2 == 0 else ''}" for k in ks)
    kept = "looked at while tuning" if part == "tuned" else "kept out of tuning"
    title = f"their variants {', '.join(map(str, ks))} ({how}; odd k pre-0.11 names; {kept})"
    return report_healthy(title, simulated([widened(sc, k) for sc in base for k in ks], end))


def recall(end: float) -> None:
    """Every library incident's playbook alert, and the page delays."""
    incidents = [sc for sc in map(library.find, library.names()) if sc.labels.expect]
    report_incidents(simulated([(sc, False) for sc in incidents], end))
    print("page delays (from the onset; bounds 5, 5 and 10 min):")
    for what, alert, took in delays():
        bound = DELAY_BOUNDS[what] / 60
        shown = f"{took / 60:4.1f} min" if took is not None else "NO PAGE"
        ok = took is not None and took <= DELAY_BOUNDS[what]
        print(f"  {what:<28} {alert:<28} {shown} (bound {bound:.0f}) {'ok' if ok else 'LATE'}")


def main(parts: tuple[str, ...] = ("base", "tuned", "held", "real", "recall")) -> None:
    end = float(int(time.time()) // 60 * 60)
    t0 = time.perf_counter()
    print(f"alert precision and recall ({ALERTS.relative_to(ROOT)}):")
    totals = [precision(p, end) for p in parts if p != "recall"]
    if totals:
        pages = sum(p for p, _ in totals)
        hours = sum(h for _, h in totals)
        print(
            f"pages on healthy services: {pages} over {hours:.1f} h = "
            f"{pages / max(hours, 1e-9) * 24:.2f} per healthy day (target: none)"
        )
    if "recall" in parts:
        recall(end)
    print(f"alerts bench: {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
