"""The recorded real incidents diagnosed again: from their answers (``replay_all``, what the
tests and ``bench`` do) or, after a query changed, from their raw samples (``rerecord``)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from diagnoser.diagnosis import Diagnosis, Window, diagnose
from diagnoser.site import Site
from lab.real import incident as incidents
from lab.real.outcome import Outcome, diagnosed, summary
from lab.real.record import DATA, raw_prometheus
from lab.replay import Replay

WINDOWS = ("incident", "baseline")


def recorded() -> list[Path]:
    """Every recording under ``tests/data/real``."""
    return sorted(p.parent for p in DATA.glob("*/provenance.json"))


def provenance(directory: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((directory / "provenance.json").read_text())
    return doc


def replayed(directory: Path, which: str, site: Site) -> Diagnosis:
    replay = Replay(directory / f"{which}.json.gz")
    window = Window.plan(replay.meta["since"], replay.meta["end"])
    return diagnose(replay, site, window)


def outcome(directory: Path, site: Site) -> tuple[Outcome, str]:
    prov = provenance(directory)
    expect = None if prov["expect"] == "none" else prov["expect"]
    inc = incidents.find(directory.name)
    o = Outcome(directory.name, expect, inc.baseline_expect,
                startup_seconds=prov.get("startup_seconds", []),
                expect_baseline_health=inc.baseline_health)  # fmt: skip
    o.first, o.confidence, o.health, o.reasons = summary(replayed(directory, "incident", site))
    o.baseline_first, _, o.baseline_health, _ = summary(replayed(directory, "baseline", site))
    return o, str(prov["health"])


def replay_all() -> list[tuple[Outcome, str]]:
    site = Site.default()
    return [outcome(d, site) for d in recorded()]


def rerecord(name: str, which: tuple[str, ...] = WINDOWS, end: float | None = None) -> str:
    """Backfill ``name``'s raw samples into a throwaway Prometheus and record the answers of
    ``which`` windows again (ending at ``end`` instead of the recorded end, when given); returns
    one line saying what was done."""
    directory = DATA / name
    site = Site.default()
    with (
        tempfile.TemporaryDirectory(prefix="servediag-rerecord-") as tmp,
        raw_prometheus(directory, Path(tmp)) as prom,
    ):
        firsts = []
        for w in which:
            meta = Replay(directory / f"{w}.json.gz").meta
            if end is not None:
                meta["end"] = end
            result, rec = diagnosed(prom.url, site, meta["since"], meta["end"])
            (directory / f"{w}.json.gz").write_bytes(rec.dump(**meta))
            firsts.append(f"{w}: {summary(result)[0] or 'no finding'}")
    return f"{name}: recorded again from raw samples; first findings {', '.join(firsts)}"
