"""SGLang 0.5 series written from SGLang's own code, without the simulator's engine.

Each case in ``fixtures/sglang-written/`` gives the traffic before and after an onset; this
module turns it into the series an SGLang server would export, following what SGLang observes
and when (``docs/sglang-semantics.md``), with the one server held to a few numbers (prefill
tokens per second, the decode step, the chunk size, the KV capacity):

- prefill runs first and alone (no ``--enable-mixed-chunk``): every decoding stream waits for
  each prefill batch, so the token after it carries the prefill's time in its ITL;
- a request is counted in ``num_queue_reqs`` until its first chunk runs (a prompt being chunked
  is not in the queue), its queue time observed then, its prompt tokens added to
  ``realtime_tokens_total{mode="prefill_compute"}`` chunk by chunk as they run;
- TTFT is observed at the first output; prompt and generation counters, e2e and TPOT only
  when the request finishes, and so are the prompt, uncached and generation histograms, which
  a server writes only with ``--collect-tokens-histogram`` (off by default: ``histograms``).

The wait before prefill is the queue's, served first come first served at the server's prefill
speed. ``variant(case, k)`` draws another server (prefill speed, decode step, chunk size, KV
capacity), other rates, lengths and onset, and another seed, from ``k`` alone: variants 9 and
10 are kept out of tuning, as the simulator's are (``make bench-sglang``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from diagnoser.metrics import families_sglang as SG
from diagnoser.metrics.exposition import Histogram, Recorder, labels_of, write_openmetrics

DIR = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-written"
STEP = 15.0  # scrape interval
MINUTES = 120
WINDOW = "1h"  # diagnosed: the recording's last hour
MODEL = "llama-3.1-8b-instruct"
TARGET = {"job": "sglang", "instance": "10.0.0.7:30000"}
HELD_OUT = (9, 10)


@dataclass(frozen=True)
class Server:
    """The one SGLang server the series come from."""

    prefill_tokens_per_s: float = 20_000.0
    decode_step: float = 0.03  # seconds a decode step takes
    chunk: int = 8192  # --chunked-prefill-size
    kv_tokens: float = 400_000.0  # sglang:max_total_num_tokens


@dataclass(frozen=True)
class Case:
    name: str
    expect: str | None
    onset_minutes: float
    before: dict[str, float]
    after: dict[str, float]
    server: Server = field(default_factory=Server)
    seed: int = 28


def cases() -> list[Case]:
    out = []
    for path in sorted(DIR.glob("*.yaml")):
        raw: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
        server = Server(**raw.get("server", {}))
        out.append(
            Case(
                path.stem, raw["expect"], raw["onset_minutes"], raw["before"], raw["after"], server
            )
        )
    return out


def variant(case: Case, k: int) -> Case:
    """Variant ``k`` of a case: the same story on another server, at other rates, lengths and
    onset, with other draws. What changes at the onset changes by 0.8 to 1.25 times as much;
    what does not change is scaled alike before and after."""
    rng = np.random.default_rng(1_000 + k)
    server = Server(
        prefill_tokens_per_s=float(rng.choice([12_000.0, 16_000.0, 20_000.0, 28_000.0])),
        decode_step=float(rng.uniform(0.02, 0.045)),
        chunk=int(rng.choice([4096, 8192, 16384])),
        kv_tokens=case.server.kv_tokens * float(rng.uniform(0.9, 1.5)),
    )
    speed = server.prefill_tokens_per_s / case.server.prefill_tokens_per_s
    scale = {
        "rate": float(rng.uniform(0.8, 1.2)) * min(1.0, speed) ** 0.5,
        "prompt": float(rng.uniform(0.8, 1.2)),
        "output": float(rng.uniform(0.8, 1.25)),
    }
    step = float(rng.uniform(0.8, 1.25))
    before, after = dict(case.before), dict(case.after)
    for key, value in case.before.items():
        base = scale.get(key, 1.0)
        before[key] = value * base
        change = case.after[key] / value if value else 1.0
        after[key] = value * base * (change**step if change != 1.0 else 1.0)
    for key in case.after.keys() - case.before.keys():  # a class of traffic that arrives
        after[key] = case.after[key] * (scale.get(key.removeprefix("long_"), 1.0) * step)
    late = case.onset_minutes > MINUTES - 20
    shift = float(rng.uniform(-3, 3) if late else rng.uniform(-10, 10))
    return replace(
        case,
        name=f"{case.name}~{k}",
        onset_minutes=case.onset_minutes + shift,
        before=before,
        after=after,
        server=server,
        seed=28 + 7919 * k,
    )


def _classes(phase: dict[str, float]) -> list[tuple[float, float, float]]:
    """(rate, prompt, output) per class of traffic."""
    out = [(phase["rate"], phase["prompt"], phase["output"])]
    if phase.get("long_rate"):
        out.append((phase["long_rate"], phase["long_prompt"], phase["long_output"]))
    return out


def write(case: Case, end: float, path: Path, histograms: bool = False) -> Path:
    """The case's series into ``path`` (OpenMetrics); ``histograms``: as a server started
    with ``--collect-tokens-histogram``."""
    rng = np.random.default_rng(case.seed)
    srv = case.server
    rec = Recorder()
    sched = labels_of(
        model_name=MODEL,
        engine_type="unified",
        tp_rank="0",
        pp_rank="0",
        moe_ep_rank="0",
        **TARGET,
    )
    tok = labels_of(model_name=MODEL, engine_type="unified", **TARGET)
    stream = labels_of(**dict(tok), is_streaming="true")
    h = {f: Histogram(f.bucket_bounds(0)) for f in (SG.TTFT, SG.ITL, SG.TPOT, SG.E2E)}
    hp = {f: Histogram(f.bucket_bounds(0)) for f in (SG.PROMPT, SG.PROMPT_UNCACHED, SG.GENERATION)}
    queue = Histogram(SG.QUEUE.bucket_bounds(0))
    stage = {
        s: Histogram(SG.STAGE.bucket_bounds(0)) for s in ("prefill_forward", "chunked_prefill")
    }
    counters = {"prompt": 0.0, "gen": 0.0, "req": 0.0, "compute": 0.0, "decode": 0.0}
    pending: dict[int, list[tuple[float, float, float, float]]] = {}
    start = end - MINUTES * 60
    onset = start + case.onset_minutes * 60
    steps = int(MINUTES * 60 / STEP)
    backlog: list[tuple[float, float, float]] = []  # (arrival, prompt, output), FIFO
    for k in range(steps):
        t = start + k * STEP
        classes = _classes(case.after if t >= onset else case.before)
        for rate, prompt, output in classes:
            for _ in range(rng.poisson(rate * STEP)):
                p = max(16.0, round(prompt * rng.lognormal(0.0, 0.35)))
                g = max(2.0, round(output * rng.lognormal(0.0, 0.3)))
                backlog.append((t + rng.uniform(0, STEP), p, g))
        backlog.sort()
        # Prefill runs first, at most 90% of the interval (decodes hold the rest), FIFO; a
        # request waits in num_queue_reqs until its first chunk runs.
        budget, clock, prefills = 0.9 * STEP, t, list[float]()
        while backlog and backlog[0][0] < t + STEP:
            arrival, p, g = backlog[0]
            chunks = int(np.ceil(p / srv.chunk))
            s = p / srv.prefill_tokens_per_s + 0.01 * chunks
            if s > budget and prefills:
                break
            backlog.pop(0)
            clock = max(clock, arrival)
            budget -= s
            w = clock - arrival + srv.decode_step * rng.uniform(0, 1)
            clock += s
            queue.observe([w])
            stage["prefill_forward"].observe([s])
            if chunks > 1:
                stage["chunked_prefill"].observe(np.full(chunks, s / chunks))
            counters["compute"] += p
            prefills.append(s)
            ttft = w + s + srv.decode_step
            h[SG.TTFT].observe([ttft])
            busy = min(0.9, sum(prefills) / STEP)
            decode_gap = srv.decode_step / (1 - busy)
            e2e = ttft + (g - 1) * decode_gap
            done = int((arrival + e2e - start) // STEP)
            pending.setdefault(done, []).append((p, g, e2e, (e2e - ttft) / (g - 1)))
        busy = min(0.9, sum(prefills) / STEP)
        decode_gap = srv.decode_step / (1 - busy)
        waiting = sum(1 for a, _, _ in backlog if a <= t + STEP)
        # The decoding streams (Little's law) and their tokens over the interval: one decode
        # step every decode_step while no prefill runs; the step after a prefill carries it.
        decoding = sum(r * (o - 1) * decode_gap for r, _, o in classes)
        decode_steps = STEP * (1 - busy) / srv.decode_step
        stalls = np.array(prefills[: int(decode_steps)])
        plain = max(0.0, decode_steps - len(stalls))
        h[SG.ITL].observe(
            np.concatenate(
                [srv.decode_step * rng.lognormal(0, 0.08, 20), srv.decode_step + stalls]
            ),
            np.concatenate([np.full(20, plain * decoding / 20), np.full(len(stalls), decoding)]),
        )
        counters["decode"] += decode_steps * decoding
        for p, g, e2e, tpot in pending.pop(k, []):
            counters["prompt"] += p
            counters["gen"] += g
            counters["req"] += 1
            h[SG.E2E].observe([e2e])
            h[SG.TPOT].observe([tpot])
            hp[SG.PROMPT].observe([p])
            hp[SG.PROMPT_UNCACHED].observe([p])
            hp[SG.GENERATION].observe([g])
        ts = t + STEP
        kv = sum(r * (o - 1) * decode_gap * (p + o / 2) for r, p, o in classes) / srv.kv_tokens
        gauges = {
            SG.RUNNING: round(decoding),
            SG.WAITING: waiting,
            SG.TOKEN_USAGE: min(1.0, kv),
            SG.CACHE_HIT_RATE: 0.0,
            SG.GEN_THROUGHPUT: decoding / decode_gap,
        }
        for fam, value in gauges.items():
            rec.sample(fam.name, fam.type, fam.help, sched, ts, float(value))
        for mode, key in (("prefill_compute", "compute"), ("decode", "decode")):
            fam = SG.REALTIME_TOKENS
            labels = labels_of(**dict(sched), mode=mode)
            rec.sample(fam.name, fam.type, fam.help, labels, ts, counters[key])
        for mode in ("input", "device_hit", "host_hit", "storage_hit"):  # pre-seeded at 0
            fam = SG.PREFILL_EFFECTIVE_TOKENS
            labels = labels_of(**dict(sched), mode=mode)
            value = counters["compute"] if mode == "input" else 0.0
            rec.sample(fam.name, fam.type, fam.help, labels, ts, value)
        rec.sample_histogram(SG.QUEUE.name, SG.QUEUE.help, sched, ts, queue)
        for name, hist in stage.items():
            if hist.count:
                labels = labels_of(**dict(sched), stage=name)
                rec.sample_histogram(SG.STAGE.name, SG.STAGE.help, labels, ts, hist)
        for fam, key in (
            (SG.PROMPT_TOKENS, "prompt"),
            (SG.GENERATION_TOKENS, "gen"),
            (SG.REQUESTS, "req"),
        ):
            rec.sample(fam.name, fam.type, fam.help, stream, ts, counters[key])
        for fam, hist in h.items():
            rec.sample_histogram(fam.name, fam.help, stream, ts, hist)
        for fam, hist in hp.items() if histograms else ():
            rec.sample_histogram(fam.name, fam.help, tok, ts, hist)
        fam = SG.HTTP_RESPONSES
        code = labels_of(
            **TARGET, endpoint="/v1/chat/completions", method="POST", status_code="200"
        )
        rec.sample(fam.name, fam.type, fam.help, code, ts, counters["req"])
    with path.open("w", encoding="utf-8") as out:
        write_openmetrics(rec, out)
    return path


def diagnose(case: Case, workdir: Path, end: float, histograms: bool = False) -> dict[str, Any]:
    """The case written into a real Prometheus and diagnosed over its last hour, as a user
    would: ``diagnose``'s JSON (``histograms``: see ``write``)."""
    import diagnoser
    from lab.promserver import Prometheus, backfill

    workdir.mkdir(parents=True, exist_ok=True)
    om = write(case, end, workdir / f"{case.name}.om", histograms)
    backfill(om, workdir / "tsdb")
    with Prometheus(workdir / "tsdb") as prom:
        return diagnoser.diagnose(prom.url, since=WINDOW, until=end).to_json()
