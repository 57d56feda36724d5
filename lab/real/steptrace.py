"""The lab's vLLM traced step by step, and what its steps say.

    python -m lab.real.steptrace chunk-room --lever num_gpu_blocks:x0.3 --seconds 480
    python -m lab.real.steptrace --read /tmp/steps.12345

The first runs a what-if experiment's server (at the lever's flags or load, when given) under
the experiment's load with the step hook (``stephook/sitecustomize.py``: one JSON line per
engine step, from vLLM's own scheduler) and summarises the steps after ``--skip`` seconds;
the second summarises a trace already written. On a quiet machine, as every lab run.

The summary: the steps by what they carried (decodes only, a new prompt's prefill, a
preempted request's recompute) with their time; preemptions, resumptions and admissions; the
mean running and waiting requests and KV usage; and the gaps between a request's tokens (what
vLLM's ITL histogram counts), with the share of them slower than twice the median decode-only
step: the tokens that waited behind a prefill or a recompute, or were preempted. Where ITL p95
sits is decided by whether that share is over 5%.

Given an experiment, the steps are also priced by the simulator's cost model (``price``: what
its engine would charge for the same requests, at the preset's speeds or the calibration's
``--factors``), by kind, so a kind of step the model misprices stands out from the machine's
overall speed, which the calibration fits.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from diagnoser.hardware.presets import ModelSpec
from diagnoser.plumbing.errors import UserError
from diagnoser.plumbing.limits import Limit
from diagnoser.sim import costs
from diagnoser.sim.engine import Engine, EngineConfig
from diagnoser.whatif.calibrate import with_factors
from diagnoser.whatif.replay import Config, kv_dtype_bytes
from lab.promserver import free_port
from lab.real import model
from lab.real import whatif as lab
from lab.real.load import Load
from lab.real.run import MAX_MODEL_LEN
from lab.real.server import MODEL_NAME, VllmServer

KEYS = {"t0", "t1", "reqs", "new", "resumed", "preempted", "running", "waiting", "kv"}


def read(paths: list[Path]) -> list[dict[str, Any]]:
    """Every step of the trace files, in time order."""
    steps = []
    for path in paths:
        with path.open(encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    step = json.loads(line)
                except json.JSONDecodeError:
                    step = None
                missing = KEYS - set(step) if isinstance(step, dict) else {"JSON object"}
                if missing:
                    raise ValueError(f"{path}:{n}: not a step of a trace (no {min(missing)})")
                bad = _malformed(step)
                if bad:
                    raise ValueError(f"{path}:{n}: not a step of a trace ({bad})")
                steps.append(step)
    return sorted(steps, key=lambda s: s["t0"])


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _malformed(step: dict[str, Any]) -> str | None:
    """What makes ``step`` no step the hook writes: a field not a finite number, or a request
    not ``[id, tokens, computed, prompt, output]``; None when it is one."""
    for key in sorted(KEYS - {"reqs"}):
        if not _finite(step[key]):
            return f"{key} is not a number"
    reqs = step["reqs"]
    if not isinstance(reqs, list) or not all(
        isinstance(r, list)
        and len(r) == 5
        and isinstance(r[0], (str, int))
        and all(_finite(v) for v in r[1:])
        for r in reqs
    ):
        return "reqs is not a list of [id, tokens, computed, prompt, output]"
    return None


def _kind(req: list[Any]) -> str:
    """``decode``, ``prefill`` (a prompt not yet answered) or ``recompute`` (a preempted
    request's prompt and output, computed again)."""
    _, n, computed, prompt, output = req
    if output == 0:
        return "prefill"
    return "decode" if n == 1 and computed == prompt + output else "recompute"


def _label(reqs: list[list[Any]]) -> str:
    """What a step carried: ``decode``, ``prefill+decode``, ... (``empty``: nothing)."""
    kinds = {_kind(r) for r in reqs}
    return "+".join(k for k in ("prefill", "recompute", "decode") if k in kinds) or "empty"


def summarise(steps: list[dict[str, Any]], skip: float = 0.0) -> dict[str, Any]:
    """What the steps after the first ``skip`` seconds did (see the module's docstring)."""
    if not steps:
        return {"steps": 0}
    begin = steps[0]["t0"] + skip
    chosen = [s for s in steps if s["t0"] >= begin]
    if not chosen:
        return {"steps": 0}
    times: dict[str, list[float]] = defaultdict(list)
    last: dict[str, float] = {}
    gaps: list[float] = []
    for s in chosen:
        label = _label(s["reqs"])
        times[label].append(s["t1"] - s["t0"])
        for rid, _, computed, prompt, output in s["reqs"]:
            if computed < prompt + output:
                continue  # a chunk that leaves some of the prompt to compute: no token
            if output > 0 and rid in last:
                gaps.append(s["t1"] - last[rid])
            last[rid] = s["t1"]
    decode = times.get("decode", [])
    slow = 2 * float(np.median(decode)) if decode else math.inf
    g = np.array(gaps) if gaps else np.zeros(0)
    return {
        "steps": len(chosen),
        "seconds": chosen[-1]["t1"] - chosen[0]["t0"],
        "busy": float(sum(s["t1"] - s["t0"] for s in chosen)),
        "kinds": {
            k: {
                "steps": len(v),
                "seconds": float(sum(v)),
                "median": float(np.median(v)),
                "p95": float(np.percentile(v, 95)),
            }
            for k, v in sorted(times.items())
        },
        "preempted": sum(s["preempted"] for s in chosen),
        "resumed": sum(s["resumed"] for s in chosen),
        "new": sum(s["new"] for s in chosen),
        "running": float(np.mean([s["running"] for s in chosen])),
        "waiting": float(np.mean([s["waiting"] for s in chosen])),
        "kv": float(np.mean([s["kv"] for s in chosen])),
        "gaps": {
            "count": int(g.size),
            "p50": float(np.percentile(g, 50)) if g.size else None,
            "p95": float(np.percentile(g, 95)) if g.size else None,
            "slow_over": slow,
            "slow_share": float((g > slow).mean()) if g.size else None,
        },
    }


def price(
    steps: list[dict[str, Any]], step_costs: costs.StepCosts, spec: ModelSpec, skip: float = 0.0
) -> dict[str, dict[str, float]]:
    """Each traced step after ``skip`` seconds priced by the simulator's cost model (what its
    engine would charge for the same requests: decodes with their context, chunks with their
    attention), by kind: steps, seconds measured and modelled, and the median ratio of the
    measured to the modelled step. A step's measured time runs from its scheduling to its
    output's processing; the simulator's step includes the gap to the next step too."""
    if not steps:
        return {}
    begin = steps[0]["t0"] + skip
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in steps:
        if s["t0"] < begin or not s["reqs"]:
            continue
        n_dec, context, chunk, attn = 0, 0, 0, 0.0
        for req in s["reqs"]:
            _, n, computed, _, _ = req
            if _kind(req) == "decode":
                n_dec, context = n_dec + 1, context + computed
            else:
                chunk += n
                attn += costs.attention_flops(spec, computed - n, n)
        out[_label(s["reqs"])].append(
            (s["t1"] - s["t0"], step_costs.step(n_dec, context, chunk, attn))
        )
    table = {}
    for label, pairs in sorted(out.items()):
        real, model_ = np.array(pairs).T
        table[label] = {
            "steps": float(len(pairs)),
            "measured": float(real.sum()),
            "modelled": float(model_.sum()),
            "ratio": float(np.median(real / model_)),
        }
    return table


def experiment_costs(
    name: str, prefill: float = 1.0, decode: float = 1.0
) -> tuple[costs.StepCosts, ModelSpec]:
    """The step costs the replay gives the experiment's server: the model's shape on vLLM's
    CPU build at the preset's speeds times ``prefill`` and ``decode`` (the calibration's
    factors, applied by ``calibrate.with_factors``), as the simulator's engine builds them."""
    setup = lab.setup(lab.find(name))
    today = Config(EngineConfig(kv_cache_dtype_bytes=kv_dtype_bytes("auto", setup.spec)), 1, 1)
    engine = with_factors(today, prefill, decode, setup.gpu).engine
    return Engine(setup.spec, setup.gpu, engine).costs, setup.spec


def price_lines(table: dict[str, dict[str, float]]) -> list[str]:
    out = ["  priced by the simulator's cost model (measured / modelled):"]
    for label, k in table.items():
        out.append(
            f"  {label:<26} {k['steps']:>6.0f} steps {k['measured']:>7.1f} s measured "
            f"{k['modelled']:>7.1f} s modelled  median ratio {k['ratio']:.2f}"
        )
    return out


def lines(summary: dict[str, Any]) -> list[str]:
    if not summary["steps"]:
        return ["no steps traced"]
    out = [
        f"{summary['steps']} steps over {summary['seconds']:.0f} s ({summary['busy']:.0f} s "
        f"busy); {summary['new']} admitted, {summary['preempted']} preempted, "
        f"{summary['resumed']} resumed; mean running {summary['running']:.2f}, waiting "
        f"{summary['waiting']:.2f}, KV {summary['kv']:.1%}"
    ]
    for kind, k in summary["kinds"].items():
        out.append(
            f"  {kind:<26} {k['steps']:>6} steps {k['seconds']:>7.1f} s  median "
            f"{k['median'] * 1000:>6.0f} ms  p95 {k['p95'] * 1000:>6.0f} ms"
        )
    g = summary["gaps"]
    if g["count"]:
        out.append(
            f"  token gaps: {g['count']}, p50 {g['p50'] * 1000:.0f} ms, p95 "
            f"{g['p95'] * 1000:.0f} ms; {g['slow_share']:.2%} over {g['slow_over'] * 1000:.0f} "
            "ms (twice the median decode step)"
        )
    return out


def run(name: str, lever: str | None, seconds: float, out: Path, venv: Path) -> list[Path]:
    """The experiment's server (at ``lever``) under its load for ``seconds``, traced into
    ``out.<pid>``; the trace files written."""
    e = lab.find(name)
    args, load = list(e.server), e.load
    if lever is not None:
        trials = {t.lever.text: t for t in e.trials}
        if lever not in trials:
            raise UserError(f"{name} has no lever {lever} (it has: {', '.join(trials)})")
        args += trials[lever].args
        load = trials[lever].load or load
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="servediag-steptrace-") as tmp:
        work = Path(tmp)
        directory = model.make(work / "model", MAX_MODEL_LEN, e.shape)
        server = VllmServer(venv, directory, free_port(), args, work / "vllm.log", trace=out)
        try:
            print(f"vLLM up after {server.start():.0f} s; {seconds:.0f} s of load", flush=True)
            traffic = Load(server.url, MODEL_NAME, e.seed)
            traffic.start(load)
            try:
                time.sleep(seconds)
            finally:
                traffic.stop()
        finally:
            server.stop()
    pids = out.parent.glob(f"{out.name}.*")  # <out>.<pid>: nothing else beside them
    return sorted(f for f in pids if f.suffix[1:].isdigit())


LOAD_SECONDS = Limit(0, 86400, low_open=True)  # of load: more than nothing, at most a day


def main(argv: list[str] | None = None) -> None:
    from lab.args import Parser, number, one_of, regular_file
    from lab.real import venv as lab_venv
    from lab.real.run import interrupted_cleanly
    from lab.real.venv import LabError

    p = Parser(prog="python -m lab.real.steptrace")
    p.add_argument("name", nargs="?", help=f"a what-if experiment ({', '.join(lab.names())})")
    p.add_argument("--lever", help="run at this lever of the experiment (default: today)")
    p.add_argument(
        "--seconds", type=number(LOAD_SECONDS), default=480.0, help="of load (default 480)"
    )
    p.add_argument(
        "--skip",
        type=number(Limit(0, LOAD_SECONDS.high)),
        default=120.0,
        help="warm-up left out (default 120)",
    )
    p.add_argument("--out", type=Path, help="trace file prefix (default: a temporary one)")
    p.add_argument("--read", type=regular_file, nargs="+", help="summarise these trace files")
    p.add_argument(
        "--factors",
        type=number(Limit(0, 1000, low_open=True)),
        nargs=2,
        metavar=("PREFILL", "DECODE"),
        help="price the steps at these speed factors (default 1 1: the preset's)",
    )
    p.add_argument("--venv", type=Path, default=Path(".venv-vllm"))
    a = p.parse_args(argv)
    one_of(p.prog, "experiment", [a.name] if a.name else [], lab.names())
    if a.read and a.name is None and a.lever is not None:
        p.error("--lever runs an experiment: name one")
    try:
        if a.read:
            files = a.read
        elif a.name:
            if not lab_venv.installed(a.venv):
                raise LabError(f"no vLLM CPU build in {a.venv} (make real installs it)")
            out = a.out or Path(tempfile.mkdtemp(prefix="servediag-steps-")) / "steps"
            with interrupted_cleanly():
                files = run(a.name, a.lever, a.seconds, out, a.venv)
            print(f"trace: {', '.join(str(f) for f in files)}")
        else:
            p.error("name an experiment, or --read trace files")
        priced = experiment_costs(a.name, *(a.factors or (1.0, 1.0))) if a.name else None
        steps = read(files)
        print("\n".join(lines(summarise(steps, a.skip))))
        if priced is not None:
            print("\n".join(price_lines(price(steps, *priced, a.skip))))
    except (UserError, LabError, OSError, ValueError, KeyError) as exc:
        print(f"steptrace: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
