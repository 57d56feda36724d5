"""The lab server's step costs, measured: what the ``CPU`` device preset is fitted to.

For each model shape, one vLLM CPU-build server; on it, requests one at a time with
``max_tokens`` 1 (the time to the first token of a prompt of P tokens: the API server's cost
of a request, then one prefill step), and N requests at once with 16-token prompts and 100
answer tokens (the time between tokens of a decode batch of N). Both are read from the
server's own histograms (``vllm:time_to_first_token_seconds`` and
``vllm:inter_token_latency_seconds``: their sum over their count), so the client's overhead is
not in them. Written to ``tests/data/cpu-step-costs.json``::

    python -m lab.real.stepcosts          # about 5 minutes on two cores

Run it on a quiet machine: vLLM's CPU build binds a thread per core, and a core shared with
another process slows every step several times over.
"""

from __future__ import annotations

import json
import platform
import random
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from lab.promserver import free_port
from lab.real import model
from lab.real import venv as lab_venv
from lab.real.record import DATA, fetch_text
from lab.real.server import DTYPE, MODEL_NAME, VllmServer

OUT = DATA.parent / "cpu-step-costs.json"
# (name, config.json changes, prompt lengths, decode batch sizes)
SHAPES: tuple[tuple[str, dict[str, int], tuple[int, ...], tuple[int, ...]], ...] = (
    ("tiny (1.8 M)", {}, (8, 64, 256, 1024, 2048), (1, 4, 16, 64, 128)),
    (
        "296 M",
        {"hidden_size": 1536, "intermediate_size": 4096, "num_hidden_layers": 12,
         "num_attention_heads": 24, "num_key_value_heads": 4},
        (8, 64, 256, 1024),
        (1, 4, 8, 16, 32),
    ),
)  # fmt: skip
PROMPT, ANSWER, REPEAT = 16, 100, 5


def _mean(url: str, family: str) -> tuple[float, float]:
    total = count = 0.0
    for f in text_string_to_metric_families(fetch_text(f"{url}/metrics")):
        for s in f.samples:
            if s.name == f"{family}_sum":
                total += s.value
            elif s.name == f"{family}_count":
                count += s.value
    return total, count


def _request(url: str, words: int, tokens: int, rng: random.Random) -> None:
    body = {"model": MODEL_NAME, "prompt": model.prompt(words, rng), "max_tokens": tokens,
            "ignore_eos": True}  # fmt: skip
    req = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        resp.read()


def _measured(url: str, family: str, send: list[tuple[int, int]], rng: random.Random) -> float:
    """The mean of ``family`` over the requests ``send`` (all at once)."""
    s0, c0 = _mean(url, family)
    threads = [threading.Thread(target=_request, args=(url, w, t, rng)) for w, t in send]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    s1, c1 = _mean(url, family)
    return (s1 - s0) / max(c1 - c0, 1.0)


def measure_shape(venv: Path, shape: dict[str, int], prompts: tuple[int, ...],
                  batches: tuple[int, ...]) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(1)
    with tempfile.TemporaryDirectory(prefix="servediag-steps-") as tmp:
        work = Path(tmp)
        model.make(work / "model", 8192, shape)
        server = VllmServer(venv, work / "model", free_port(), ["--max-model-len", "8192"],
                            work / "vllm.log")  # fmt: skip
        try:
            server.start()
            for _ in range(3):  # warm the kernels
                _request(server.url, 50, 5, rng)
            ttft = "vllm:time_to_first_token_seconds"
            prefill = []
            for p in prompts:
                seconds = [_measured(server.url, ttft, [(p - 1, 1)], rng) for _ in range(REPEAT)]
                prefill.append([p, sorted(seconds)[REPEAT // 2]])
            decode = []
            for n in batches:
                itl = _measured(
                    server.url, "vllm:inter_token_latency_seconds", [(PROMPT - 1, ANSWER)] * n, rng
                )
                decode.append([n, PROMPT + ANSWER / 2, itl])
        finally:
            server.stop()
    return {"prefill": prefill, "decode": decode}


@dataclass(frozen=True)
class Priced:
    model: str
    kind: str  # "prefill" (x: prompt tokens) or "decode" (x: sequences in the batch)
    x: int
    measured: float
    priced: float

    @property
    def ratio(self) -> float:
        return self.priced / self.measured


def price(doc: dict[str, Any] | None = None, device: str = "CPU") -> list[Priced]:
    """Each measurement next to what the simulator prices it at on ``device``: a prompt's
    TTFT as the API server's cost of a request and the prefill steps (chunks of vLLM's CPU
    default, 2,048 tokens); a batch's ITL as one decode step over its context."""
    from diagnoser.hardware.presets import ModelSpec, gpu
    from diagnoser.sim.engine import Engine, EngineConfig
    from diagnoser.whatif.replay import kv_dtype_bytes
    from diagnoser.whatif.setup import vllm_defaults

    doc = doc or json.loads(OUT.read_text())
    g = gpu(device)
    _, budget = vllm_defaults(gpu("CPU"))  # the server measured ran with the CPU build's
    out = []
    for m in doc["models"]:
        spec = ModelSpec.from_hf_config({**m["config"], "max_position_embeddings": 8192})
        spec = spec.served_as(DTYPE)
        cfg = EngineConfig(kv_cache_dtype_bytes=kv_dtype_bytes("auto", spec),
                           max_num_batched_tokens=budget, gpu_memory_utilization=0.1)  # fmt: skip
        engine = Engine(spec, g, cfg)
        for p, seconds in m["prefill"]:
            t, done = g.request_overhead or 0.0, 0
            while done < p:
                chunk = min(budget, p - done)
                t += engine.mixed_step_time(0, 0, chunk, engine.attention_flops(done, chunk))
                done += chunk
            out.append(Priced(m["name"], "prefill", int(p), float(seconds), t))
        for n, ctx, seconds in m["decode"]:
            t = engine.decode_step_time(int(n), n * ctx)
            out.append(Priced(m["name"], "decode", int(n), float(seconds), t))
    return out


def table(rows: list[Priced]) -> list[str]:
    lines = [
        f"  {'model':<14} {'step':<8} {'size':>6} {'measured':>10} {'priced':>10} {'ratio':>6}"
    ]
    for r in rows:
        size = f"{r.x} tok" if r.kind == "prefill" else f"x{r.x}"
        lines.append(
            f"  {r.model:<14} {r.kind:<8} {size:>6} {r.measured * 1e3:>8.1f}ms "
            f"{r.priced * 1e3:>8.1f}ms {r.ratio:>6.2f}"
        )
    return lines


def main() -> None:
    import sys

    from lab.args import refuse

    if sys.argv[1:]:
        refuse(
            "python -m lab.real.stepcosts", f"takes no arguments (given: {' '.join(sys.argv[1:])})"
        )
    venv = Path(".venv-vllm")
    if not lab_venv.installed(venv):
        raise SystemExit(f"stepcosts: no vLLM CPU build in {venv} (make real installs it)")
    doc: dict[str, Any] = {
        "what": "vLLM CPU build: TTFT of one request (s) by prompt tokens, ITL (s) by batch",
        "vllm": lab_venv.version(venv),
        "machine": platform.processor() or platform.machine(),
        "measured": time.strftime("%Y-%m-%d", time.gmtime()),
        "models": [],
    }
    for name, shape, prompts, batches in SHAPES:
        print(f"measuring {name}", flush=True)
        got = measure_shape(venv, shape, prompts, batches)
        doc["models"].append({"name": name, "config": {**model.CONFIG, **shape}, **got})
        print(json.dumps(got), flush=True)
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"written {OUT}")


if __name__ == "__main__":
    main()
