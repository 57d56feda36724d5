"""What-if as JSON (the documented object) and as text (a table per lever).

The JSON object::

    {"model": str, "window": {"start": ISO, "end": ISO, "seconds": float},
     "span": {"start": ISO, "end": ISO, "seconds": float} (the part of the window calibrated
             on and replayed: its steadiest busy quarter hour, or the whole window),
     "fit": {"arrival_rate": {"mean", "min", "max", "step_seconds"},
             "prompt_tokens": {"median", "sigma"}, "output_tokens": {"median", "sigma"},
             "length_share", "max_tokens", "prefix_cache_hit_rate", "instances", "engines",
             "engine": {"num_gpu_blocks", "block_size", "gpu_memory_utilization",
                        "kv_cache_dtype", "enable_prefix_caching", "max_num_seqs",
                        "max_num_batched_tokens", "max_model_len"},
             "model_shape", "gpu"},
     "calibration": {"ok", "reason", "prefill_factor", "decode_factor", "replays" (of today's
                     configuration: more than 1 when a factor was fitted), "tolerance",
                     "draws" (window-long draws each replay pools), "noise" ({name: the
                     standard deviation of a figure over the draws, null with one draw}),
                     "measured": FIGURES, "replayed": FIGURES, "residual": {...},
                     "residual_relative": {name: bool}},
     "today": FIGURES, "today_replayed": FIGURES,
     "levers": [{"lever", "restart", "change", "predicted": FIGURES, "band": {...},
                 "knee": {name: [low, high]} or null, "error"}],
     "slo": {"ttft_seconds", "itl_seconds"}, "notes": [str], "seconds": float}

FIGURES maps ``ttft_p50``, ``ttft_p95``, ``itl_p50``, ``itl_p95`` (seconds), ``kv_usage``
(0-1), ``preemptions_per_second``, ``waiting`` (requests), ``requests_per_second``,
``tokens_per_second`` (generated) and ``ttft_slo_share``, ``itl_slo_share`` (0-1, the SLO
attainment) to numbers, null where unknown; a replay of several draws gives each latency
quantile as the median of its draws'. A band is the ± on the predicted figure: the
calibration's residual, and never less than twice the lever's own spread over the draws.
A lever's ``knee`` names the latency quantiles that sit on a knee of their distribution: the
quantile one point of the observations below and above (p94 and p96 for a p95), where that
reaches past the band and a quarter of the figure; the figure may be anywhere between.
With ``calibration.ok`` false, ``levers`` carry no prediction. A figure or lever the deadline
(``--timeout``) cut short says so: the calibration's ``reason`` ("the deadline passed before
the calibration finished ..."), a lever's ``error`` ("the deadline passed").
"""

from __future__ import annotations

from typing import Any

from diagnoser.plumbing.durations import iso
from diagnoser.plumbing.finite import finite
from diagnoser.plumbing.printable import printable
from diagnoser.whatif.calibrate import NOISE_Z, TOLERANCE, relative
from diagnoser.whatif.figures import LABELS, SHOWN, fmt, knee_lines
from diagnoser.whatif.predict import WhatIf
from diagnoser.whatif.replay import draws


def to_json(w: WhatIf) -> dict[str, Any]:
    fit, e, cal = w.fit, w.today.engine, w.calibration
    rates = fit.rates
    whole = fit.window or (fit.start, fit.end)
    doc = {
        "model": fit.model,
        "window": {"start": iso(whole[0]), "end": iso(whole[1]), "seconds": whole[1] - whole[0]},
        "span": {"start": iso(fit.start), "end": iso(fit.end), "seconds": fit.seconds},
        "fit": {
            "arrival_rate": {
                "mean": fit.mean_rate,
                "min": float(rates.min()) if rates.size else None,
                "max": float(rates.max()) if rates.size else None,
                "step_seconds": fit.rate_step,
            },
            "prompt_tokens": {"median": fit.prompt.median, "sigma": fit.prompt.sigma},
            "output_tokens": {"median": fit.output.median, "sigma": fit.output.sigma},
            "length_share": fit.length_share,
            "max_tokens": w.today.max_tokens,
            "prefix_cache_hit_rate": fit.prefix_hit,
            "instances": fit.instances,
            "engines": fit.engines,
            "engine": {
                "num_gpu_blocks": fit.cache.num_gpu_blocks,
                "block_size": fit.cache.block_size,
                "gpu_memory_utilization": fit.cache.gpu_memory_utilization,
                "kv_cache_dtype": fit.cache.cache_dtype,
                "enable_prefix_caching": fit.cache.enable_prefix_caching,
                "max_num_seqs": e.max_num_seqs,
                "max_num_batched_tokens": e.max_num_batched_tokens,
                "max_model_len": e.max_model_len,
            },
            "model_shape": w.setup.spec.name,
            "gpu": w.setup.gpu.name,
        },
        "calibration": {
            "ok": cal.ok,
            "reason": cal.reason,
            "prefill_factor": cal.prefill_factor,
            "decode_factor": cal.decode_factor,
            "replays": cal.replays,
            "tolerance": TOLERANCE,
            "draws": draws(fit),
            "noise": cal.noise,
            "measured": cal.measured,
            "replayed": cal.replayed,
            "residual": cal.residual,
            "residual_relative": {
                name: relative(name, cal.measured.get(name)) for name in cal.residual
            },
        },
        "today": cal.measured,
        "today_replayed": w.replayed,
        "levers": [
            {
                "lever": o.lever.text,
                "restart": o.lever.restart,
                "change": o.change or None,
                "predicted": o.predicted or None,
                "band": o.band or None,
                "knee": {k: list(v) for k, v in o.knee.items()} or None,
                "error": o.error,
            }
            for o in w.outcomes
        ],
        "slo": {"ttft_seconds": w.slo[0], "itl_seconds": w.slo[1]},
        "notes": list(w.notes),
        "seconds": w.seconds,
    }
    clean, _ = finite(doc)
    return dict(clean)


def text(w: WhatIf) -> str:
    doc = to_json(w)
    fit, cal = w.fit, w.calibration
    f = doc["fit"]
    n = doc["calibration"]["draws"]
    each = f", each pooling {n} draws of the window" if n > 1 else ""
    lines = [
        f"what-if for {printable(fit.model)}, {doc['window']['start']} to {doc['window']['end']}",
        f"  workload: {f['arrival_rate']['mean']:.2f} req/s (per {fit.rate_step:g} s: "
        f"{f['arrival_rate']['min']:.2f}-{f['arrival_rate']['max']:.2f}), prompts "
        f"~{fit.prompt.median:,.0f} tokens (sigma {fit.prompt.sigma:.2f}), answers "
        f"~{fit.output.median:,.0f} (sigma {fit.output.sigma:.2f}), {fit.length_share:.1%} "
        f"stop on length (max_tokens ~{w.today.max_tokens:,})",
        f"  engine: {fit.instances} server(s) x {fit.engines} engine(s), "
        f"{fit.cache.num_gpu_blocks:,} blocks of {fit.cache.block_size} at "
        f"gpu_memory_utilization {fit.cache.gpu_memory_utilization:g}, KV "
        f"{fit.cache.cache_dtype}, max_num_seqs {w.today.engine.max_num_seqs}, "
        f"max_num_batched_tokens {w.today.engine.max_num_batched_tokens}; "
        f"{printable(w.setup.spec.name)} on {w.setup.gpu.name}",
        f"  calibration: prefill x{cal.prefill_factor:.2f}, decode x{cal.decode_factor:.2f} "
        f"({cal.replays} replay(s){each})",
    ]
    if fit.window:
        lines.insert(
            1,
            f"  replayed: {iso(fit.start)} to {iso(fit.end)}, the window's steadiest part at the "
            "incident's load (calibrated on it; every figure is of it)",
        )
    chance = any(v is not None for v in cal.noise.values())
    lines.append(
        f"    {'':16}{'measured':>12}{'replayed':>12}{'residual':>14}"
        + (f"{'chance ±':>12}" if chance else "")
    )
    for name, r in cal.residual.items():
        measured = cal.measured[name]
        res = "-" if r is None else (f"{r:+.0%}" if relative(name, measured) else f"{r:+.2g} abs")
        spread = cal.noise.get(name)
        by = "-" if spread is None else fmt(name, NOISE_Z * spread)
        lines.append(
            f"    {LABELS[name]:16}{fmt(name, cal.measured[name]):>12}"
            f"{fmt(name, cal.replayed[name]):>12}{res:>14}" + (f"{by:>12}" if chance else "")
        )
    if cal.late:
        lines.append(f"  not finished: {cal.reason}")
    if not cal.ok and not cal.late:
        lines.append(f"  refused: {cal.reason}; nothing is predicted")
    else:
        for o in w.outcomes:
            restart = "restarts the engine" if o.lever.restart else "no restart"
            head = f"lever {o.lever.text} ({o.change or 'not applied'}; {restart})"
            lines += ["", head]
            if o.error:
                lines.append(f"  not predicted: {o.error}")
                continue
            lines.append(f"  {'':16}{'today':>12}{'predicted':>12}{'±':>10}")
            for name in SHOWN:
                pm = o.band.get(name)
                lines.append(
                    f"  {LABELS[name]:16}{fmt(name, cal.measured[name]):>12}"
                    f"{fmt(name, o.predicted.get(name)):>12}"
                    f"{fmt(name, pm) if pm is not None else '-':>10}"
                )
            lines += [f"  {line}" for line in knee_lines(o.knee)]
    for note in w.notes:
        lines.append(f"note: {printable(note)}")
    lines.append(f"({w.seconds:.1f} s)")
    return "\n".join(lines) + "\n"
