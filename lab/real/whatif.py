"""What-if checked against a real vLLM: a load run at today's configuration, what-if's
prediction for each lever made from that window, and the same load run for real at each
lever's configuration, one after another on the same server.

An experiment file (``fixtures/real/what-if/*.yaml``)::

    description: ...
    server: [--max-model-len, "2048", --num-gpu-blocks-override, "66"]   # today's flags
    load: {rate: 5.0, prompt: 150, output: 150, max_tokens: 512}          # every phase's
    warmup: 3m        # before today's window
    window: 5m        # each configuration's measured span
    settle: 90s       # after a lever's restart (or load change), not measured
    levers:
      - lever: num_gpu_blocks:x2
        args: [--num-gpu-blocks-override, "132"]   # the flags it restarts with, after today's
      - lever: max_tokens:100
        load: {max_tokens: 100}                    # a client-side lever changes the load

``evaluate`` reads the windows from any source (the live Prometheus, or the answers recorded
with the run, which is what the tests and ``make bench`` replay) and gives, per lever and
figure, the prediction next to the measurement.
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnoser.catalog.levers import Lever, LeverError, parse_lever
from diagnoser.hardware.presets import ModelSpec, gpu
from diagnoser.metrics.promql import matcher
from diagnoser.plumbing.durations import parse_time
from diagnoser.plumbing.errors import UserError, read_yaml_mapping
from diagnoser.plumbing.source import MetricSource, PrometheusSource
from diagnoser.site import Site
from diagnoser.whatif.fit import fit_window, measure
from diagnoser.whatif.predict import WhatIf, what_if
from diagnoser.whatif.replay import Setup
from diagnoser.whatif.setup import vllm_defaults
from lab.real import model, record
from lab.real import venv as lab_venv
from lab.real.incident import (
    Incident,
    IncidentError,
    Phase,
    args_field,
    duration_field,
    load_spec,
)
from lab.real.load import LoadSpec
from lab.real.run import MAX_MODEL_LEN, SCALE, Run, utc
from lab.real.server import DTYPE, MODEL_NAME, base_args
from lab.replay import Recording, Replay

DATA = record.DATA.parent / "real-what-if"
DEVICE = "CPU"
# Figures judged, and how: TTFT and ITL p95 by their relative error; preemptions by the
# factor between prediction and measurement (both under the noise floor: agreed).
JUDGED = ("ttft_p95", "itl_p95", "preemptions_per_second")
PREEMPTION_FLOOR = 0.02  # preemptions/s that count as none
# Today's flags what-if is told of (the rest it reads from the series).
INT_FLAGS = ("--max-num-seqs", "--max-num-batched-tokens", "--max-model-len")


@dataclass(frozen=True)
class Trial:
    lever: Lever
    args: tuple[str, ...] = ()  # flags after today's (a restart)
    load: LoadSpec | None = None  # the load it runs (a client-side lever)


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    server: tuple[str, ...]
    load: LoadSpec
    warmup: float
    window: float
    settle: float
    trials: tuple[Trial, ...]
    seed: int = 1
    shape: dict[str, int] = field(default_factory=dict)  # the model's config.json, changed

    def flag(self, name: str, default: int | None) -> int | None:
        """Today's value of an integer flag (``--max-num-seqs``), else ``default``."""
        args = list(self.server)
        for i, a in enumerate(args[:-1]):
            if a == name:
                return int(args[i + 1])
        return default

    def incident(self) -> Incident:
        """The run as the lab's phases: today, then each lever (a restart with its flags, or
        back to today's when it only changes the load)."""
        phases = [Phase("today", self.window, self.load)]
        changed = False
        for t in self.trials:
            restart = bool(t.args) or changed
            phases.append(
                Phase(
                    t.lever.text,
                    self.settle + self.window,
                    t.load or self.load,
                    action="restart" if restart else None,
                    args=t.args,
                )
            )
            changed = bool(t.args)
        return Incident(self.name, self.description, None, "any", self.server, self.warmup,
                        tuple(phases), seed=self.seed)  # fmt: skip


def experiment_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "fixtures" / "real" / "what-if"


def names() -> list[str]:
    return sorted(p.stem for p in experiment_dir().glob("*.yaml"))


def find(name: str) -> Experiment:
    path = experiment_dir() / f"{name}.yaml"
    if not path.is_file():
        raise IncidentError(name, "", f"no such what-if experiment (known: {', '.join(names())})")
    return load(path)


def load(path: Path) -> Experiment:
    doc = read_yaml_mapping(path, IncidentError, "a what-if experiment")
    spec = load_spec(path, "load", doc.get("load"), LoadSpec(rate=0.0))
    if spec.rate <= 0:
        raise IncidentError(path, "load.rate", "must be above 0")
    raw = doc.get("levers")
    if not isinstance(raw, list) or not raw:
        raise IncidentError(path, "levers", "must list the levers to run")
    trials: list[Trial] = []
    for i, item in enumerate(raw):
        where = f"levers[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("lever"), str):
            raise IncidentError(path, where, "must be a mapping with a lever")
        try:
            lever = parse_lever(item["lever"])
        except LeverError as exc:
            raise IncidentError(path, f"{where}.lever", str(exc)) from None
        args = args_field(path, f"{where}.args", item.get("args"))
        changed = load_spec(path, f"{where}.load", item.get("load"), spec)
        if lever.restart != bool(args):
            need = "flags to restart with (args)" if lever.restart else "a load, not flags"
            raise IncidentError(path, where, f"{lever.text} needs {need}")
        if any(t.lever.text == lever.text for t in trials):
            raise IncidentError(path, f"{where}.lever", f"{lever.text} is listed twice")
        trials.append(Trial(lever, args, None if changed == spec else changed))
    server = args_field(path, "server", doc.get("server"))
    for flag in INT_FLAGS:
        at = server.index(flag) if flag in server[:-1] else -1
        if at >= 0 and not server[at + 1].isdigit():
            raise IncidentError(path, "server", f"{flag} must be a whole number")
    seed = doc.get("seed", 1)
    shape = doc.get("model", {})
    if not isinstance(shape, dict) or not all(
        k in model.CONFIG and isinstance(v, int) and not isinstance(v, bool) and v > 0
        for k, v in shape.items()
    ):
        raise IncidentError(path, "model", "must map config.json's size fields to whole numbers")
    return Experiment(
        name=path.stem,
        description=" ".join(str(doc.get("description", "")).split()),
        server=server,
        load=spec,
        warmup=duration_field(path, "warmup", doc.get("warmup", "3m")),
        window=duration_field(path, "window", doc.get("window", "5m")),
        settle=duration_field(path, "settle", doc.get("settle", "90s")),
        trials=tuple(trials),
        seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else 1,
        shape=shape,
    )


def setup(e: Experiment) -> Setup:
    """What what-if is told of the lab's server: the tiny model's config.json (served in
    float32), vLLM's CPU build, the scheduler limits its flags or vLLM's CPU defaults give."""
    config = {**model.CONFIG, **e.shape, "max_position_embeddings": MAX_MODEL_LEN}
    spec = ModelSpec.from_hf_config(config)
    device = gpu(DEVICE)
    seqs, tokens = vllm_defaults(device)
    return Setup(
        spec=dataclasses.replace(spec.served_as(DTYPE), name=MODEL_NAME),
        gpu=device,
        max_num_seqs=e.flag("--max-num-seqs", seqs) or seqs,
        max_num_batched_tokens=e.flag("--max-num-batched-tokens", tokens) or tokens,
        max_model_len=e.flag("--max-model-len", None),
    )


@dataclass
class Compared:
    """One lever: what-if's prediction and what the server then did."""

    lever: str
    change: str
    predicted: dict[str, float | None]
    measured: dict[str, float | None]
    error: str | None = None
    band: dict[str, float | None] = field(default_factory=dict)  # what-if's ± on each
    knee: dict[str, list[float]] = field(default_factory=dict)  # quantiles on a knee

    def gap(self, name: str) -> float | None:
        """Relative error (predicted / measured - 1) of a latency; the factor between them
        of preemptions (1: agreed, both under the floor counting as agreement)."""
        p, m = self.predicted.get(name), self.measured.get(name)
        if p is None or m is None:
            return None
        if name == "preemptions_per_second":
            lo, hi = sorted((max(p, PREEMPTION_FLOOR), max(m, PREEMPTION_FLOOR)))
            return hi / lo
        return p / m - 1 if m else None

    def in_band(self, name: str) -> bool | None:
        """Whether the measured figure lies within the prediction's band (its ±), or
        between the values of a quantile on a knee."""
        p, m, b = self.predicted.get(name), self.measured.get(name), self.band.get(name)
        if p is None or m is None or b is None:
            return None
        lo, hi = self.knee.get(name, (p, p))
        return abs(m - p) <= b or lo <= m <= hi

    def within(self, name: str) -> bool | None:
        g = self.gap(name)
        if g is None:
            return None
        return g <= 2.0 if name == "preemptions_per_second" else abs(g) <= 0.25


@dataclass
class Result:
    name: str
    calibration: dict[str, Any]
    today: dict[str, float | None]
    compared: list[Compared] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "experiment": self.name,
            "calibration": self.calibration,
            "today": self.today,
            "levers": [dataclasses.asdict(c) for c in self.compared],
        }


def evaluate(
    source: MetricSource, e: Experiment, windows: dict[str, tuple[float, float]]
) -> tuple[Result, WhatIf]:
    """What-if from today's window, each lever's measured window beside its prediction."""
    site = Site.default()
    slo = site.config.slo.for_labels({"model_name": MODEL_NAME})
    objectives = (slo.ttft_seconds, slo.itl_seconds)
    fit = fit_window(source, MODEL_NAME, *windows["today"])
    result = what_if(fit, setup(e), [t.lever for t in e.trials], objectives)
    cal = result.calibration
    out = Result(
        e.name,
        {
            "ok": cal.ok,
            "reason": cal.reason,
            "prefill_factor": cal.prefill_factor,
            "decode_factor": cal.decode_factor,
            "replays": cal.replays,
            "measured": cal.measured,
            "replayed": cal.replayed,
        },
        fit.measured.figures(*objectives),
    )
    scope = (matcher("model_name", MODEL_NAME),)
    for t, o in zip(e.trials, result.outcomes, strict=True):
        seen = measure(source, scope, *windows[t.lever.text]).figures(*objectives)
        out.compared.append(
            Compared(
                t.lever.text,
                o.change,
                o.predicted,
                seen,
                o.error,
                dict(o.band),
                {k: list(v) for k, v in o.knee.items()},
            )
        )
    return out, result


def windows(times: list[dict[str, Any]], e: Experiment) -> dict[str, tuple[float, float]]:
    """Each phase's measured span: today's whole window, a lever's after its settling."""
    out = {}
    for entry in times:
        start = parse_time(entry["start"])
        end = parse_time(entry["end"])
        out[entry["name"]] = (start if entry["name"] == "today" else start + e.settle, end)
    return out


def run(e: Experiment, venv: Path, out: Path | None, say: Callable[[str], None]) -> Result:
    """Run ``e`` on a real server (about warm-up + (levers + 1) x window + levers x settle);
    record it into ``out / name`` when given. Raises ``LabError``; nothing is left running."""
    inc = e.incident()
    with tempfile.TemporaryDirectory(prefix="servediag-whatif-") as tmp:
        work = Path(tmp)
        model.make(work / "model", MAX_MODEL_LEN, e.shape)
        r = Run(inc, venv, work, say)
        try:
            say(f"[{e.name}] starting vLLM: {' '.join(e.server) or 'lab defaults'}")
            r.start_server()
            r.start_prometheus()
            assert r.prom is not None
            t0 = time.time()
            r.load.start(e.load)
            say(f"      warm-up {e.warmup:.0f} s at {e.load.rate:g} req/s")
            time.sleep(e.warmup)
            for phase in inc.phases:
                say(f"      {phase.name}: {phase.duration:.0f} s" + (
                    f", restarted with {' '.join(phase.args) or 'today' + chr(39) + 's flags'}"
                    if phase.action else ""))  # fmt: skip
                r.phase(phase)
            end = float(int(time.time()))
            time.sleep(6)  # the last scrape lands
            spans = windows(r.times, e)
            prov = {
                "experiment": e.name,
                "vllm": lab_venv.version(venv),
                "vllm_args": [*base_args(), *e.server],
                "model": {**model.CONFIG, **e.shape},
                "phases": r.times,
                "windows": {k: list(v) for k, v in spans.items()},
                "client_outcomes": dict(sorted(r.load.outcomes.items())),
                "startup_seconds": r.startups,
                "recorded": utc(end),
            }
            if out is not None:  # the raw samples first: what-if may fail, the run is kept
                raw = record.openmetrics(record.raw_samples(r.prom, t0 - 60, end + 5))
                record.write(out / e.name, {"raw.om.gz": raw}, prov)
            result = _evaluated(r.prom.url, e, spans, out / e.name if out else None, prov)
        finally:
            r.close()
    return result


def _evaluated(
    url: str,
    e: Experiment,
    spans: dict[str, tuple[float, float]],
    out: Path | None,
    prov: dict[str, Any],
) -> Result:
    """``evaluate`` on the Prometheus at ``url``; its answers and result written into
    ``out`` when given."""
    source = Recording(PrometheusSource(url), instants=True)
    result, _ = evaluate(source, e, spans)
    if out is not None:
        files: dict[str, str | bytes] = {
            "answers.json.gz": source.dump(experiment=e.name),
            "result.json": json.dumps(result.to_json(), indent=1) + "\n",
        }
        record.write(out, files, prov)
    return result


def _recording(
    directory: Path,
) -> tuple[dict[str, Any], Experiment, dict[str, tuple[float, float]]]:
    """A recorded experiment's provenance, its experiment file, and its windows."""
    prov = json.loads((directory / "provenance.json").read_text())
    spans = {k: (float(v[0]), float(v[1])) for k, v in prov["windows"].items()}
    return prov, find(prov["experiment"]), spans


def rerecord(directory: Path) -> Result:
    """The answers and result of a recorded experiment made again from its raw samples (in a
    throwaway Prometheus), after a change to what-if's queries."""
    prov, e, spans = _recording(directory)
    with (
        tempfile.TemporaryDirectory(prefix="servediag-whatif-rerecord-") as tmp,
        record.raw_prometheus(directory, Path(tmp)) as prom,
    ):
        return _evaluated(prom.url, e, spans, directory, prov)


def recorded() -> list[Path]:
    return sorted(p.parent for p in DATA.glob("*/provenance.json"))


def replayed(directory: Path) -> tuple[Result, WhatIf]:
    """An experiment evaluated again from its recorded answers (no server, no Prometheus)."""
    _, e, spans = _recording(directory)
    return evaluate(Replay(directory / "answers.json.gz"), e, spans)


def table(results: list[Result]) -> list[str]:
    """Per lever and figure: measured, predicted with its band, the error, whether it meets
    the aim (TTFT and ITL p95 within 25%, preemptions within a factor of 2), and whether the
    measured figure lies within the band what-if gave (or between a knee's values)."""
    lines = [f"  {'experiment':<14} {'lever':<28} {'figure':<12} {'measured':>9} "
             f"{'predicted':>9} {'±':>9} {'error':>8}  {'aim':<6}  in band"]  # fmt: skip
    for r in results:
        if not r.calibration["ok"]:
            lines.append(f"  {r.name:<14} calibration refused: {r.calibration['reason']}")
            continue
        for c in r.compared:
            if c.error:
                lines.append(f"  {r.name:<14} {c.lever:<28} not predicted: {c.error}")
                continue
            for name in JUDGED:
                g, ok, inside = c.gap(name), c.within(name), c.in_band(name)
                knee = c.knee.get(name)
                on_knee = f" (knee {knee[0]:.4g}-{knee[1]:.4g})" if knee else ""
                err = "-" if g is None else (
                    f"x{g:.2f}" if name == "preemptions_per_second" else f"{g:+.0%}")  # fmt: skip
                aim = "-" if ok is None else "met" if ok else "MISSED"
                lines.append(
                    f"  {r.name:<14} {c.lever:<28} {name.replace('_per_second', '/s'):<12} "
                    f"{_fig(c.measured.get(name))} {_fig(c.predicted.get(name))} "
                    f"{_fig(c.band.get(name))} {err:>8}  {aim:<6}  "
                    + ("-" if inside is None else "yes" if inside else "NO")
                    + on_knee
                )
    return lines


def _fig(v: float | None) -> str:
    return f"{'-':>9}" if v is None or not math.isfinite(v) else f"{v:>9.4g}"


def main(argv: list[str] | None = None) -> None:
    """``python -m lab.real.whatif [NAME...] [--record] [--scale S] | --bench``."""
    import sys

    from lab.args import Parser, number, one_of
    from lab.real.run import interrupted_cleanly
    from lab.real.venv import LabError

    p = Parser(prog="python -m lab.real.whatif")
    p.add_argument("names", nargs="*", help=f"experiments (known: {', '.join(names())})")
    p.add_argument("--record", action="store_true", help=f"write the recording into {DATA}")
    p.add_argument(
        "--scale", type=number(SCALE), default=1.0, help="multiply every duration (0.2 to 10)"
    )
    p.add_argument("--venv", type=Path, default=Path(".venv-vllm"))
    p.add_argument("--bench", action="store_true", help="the recordings, replayed")
    p.add_argument("--rerecord", action="store_true", help="answers again from raw samples")
    a = p.parse_args(argv)
    if a.rerecord:
        one_of(p.prog, "recorded experiment", a.names, [d.name for d in recorded()])
    else:
        one_of(p.prog, "experiment", a.names, names())
    if a.bench and a.names:
        p.error("--bench replays every recording: give no names")
    try:
        if a.rerecord:
            done = [rerecord(d) for d in recorded() if not a.names or d.name in a.names]
            print("\n".join(table(done)))
            return
        if a.bench or not a.names:
            results = [replayed(d)[0] for d in recorded()]
            print(f"what-if against real vLLM runs ({len(results)} recorded):")
            print("\n".join(table(results)))
            return
        chosen = [find(n) for n in a.names]
    except (IncidentError, LeverError) as exc:
        print(f"what-if lab: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if not lab_venv.installed(a.venv):
        print(
            f"what-if lab: no vLLM CPU build in {a.venv} (make real installs it)", file=sys.stderr
        )
        raise SystemExit(2)
    results = []
    with interrupted_cleanly():
        for e in chosen:
            if a.scale != 1.0:
                e = dataclasses.replace(
                    e, warmup=e.warmup * a.scale, window=e.window * a.scale,
                    settle=e.settle * a.scale,
                )  # fmt: skip
            try:
                results.append(run(e, a.venv, DATA if a.record else None, print))
            except (LabError, UserError) as exc:
                print(f"what-if lab: {e.name} failed: {exc}", file=sys.stderr)
                raise SystemExit(1) from None
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
