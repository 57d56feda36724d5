"""A KV budget as one JSON document for tools, and as text for a terminal (from the document,
so the two never disagree). GB are 10^9 bytes, as GPU vendors count; KiB are 1,024 bytes.
"""

from __future__ import annotations

import textwrap
import time
from dataclasses import asdict
from typing import Any

from diagnoser.hardware.presets import ModelSpec
from diagnoser.kvbudget import budget as kvbudget
from diagnoser.kvbudget.budget import Budget
from diagnoser.kvbudget.live import Live
from diagnoser.plumbing.printable import inert, printable

WIDTH = 96


def to_json(budget: Budget | None, live: Live | None) -> dict[str, Any]:
    """One document with the plan (when a model is given) and the live reading (if any)."""
    doc: dict[str, Any] = {}
    if budget is not None:
        spec = budget.model.spec
        planned = kvbudget.plan(budget)
        variants, refused = kvbudget.what_if(budget)
        doc.update(
            model={
                "name": spec.name,
                "source": budget.model.source,
                "attention": attention_kind(spec),
                "layers": spec.layers,
                "attention_heads": spec.heads,
                "kv_heads": spec.kv_heads,
                "head_dim": spec.head_dim,
                "kv_lora_rank": spec.kv_lora_rank or None,
                "qk_rope_head_dim": spec.qk_rope_head_dim or None,
                "dtype": spec.dtype,
                "max_position": spec.max_position or None,
            },
            gpu={"name": budget.gpu.name, "memory_bytes": budget.gpu.memory_bytes},
            gpu_memory_utilization=budget.gpu_memory_utilization,
            weights={"bytes": budget.weight_bytes, "source": budget.weights_from},
            runtime_overhead_bytes=budget.overhead_bytes,
            block_size=budget.block_size,
            max_model_len=budget.max_model_len,
            context=budget.context,
            users=budget.users,
            kv_bytes_per_token=kvbudget.plan(budget, 1).kv_bytes_per_token,
            plan=asdict(planned),
            what_if=[asdict(p) for p in variants],
            not_possible=refused,
            notes=kvbudget.notes(budget, planned),
        )
    if live is not None:
        doc["live"] = asdict(live)
    if budget is not None:
        doc["model"]["served_dtype"] = budget.dtype
        doc["model"]["served_dtype_from"] = budget.dtype_from
        doc["gpu"]["source"] = budget.gpu_from
        if live is not None:
            doc["notes"] = [*doc["notes"], *live_notes(budget, live)]
    return doc


def live_notes(budget: Budget, live: Live) -> list[str]:
    """What the live engines say about the plan's assumptions: the KV dtype they cache in
    (``cache_dtype``), and that the served dtype is not among vLLM's series."""
    cached = sorted({e.cache_dtype for e in live.engines if e.cache_dtype})
    out = []
    explicit = [c for c in cached if c != "auto"]
    if explicit and budget.kv_cache_dtype == "auto":
        out.append(
            f"The running engines cache KV as {', '.join(explicit)} (vllm:cache_config_info); "
            f"the plan caches it as {budget.dtype}: give --kv-cache-dtype to plan theirs."
        )
    if "auto" in cached and budget.dtype_from != "--dtype":
        out.append(
            "The served dtype is not in vLLM's series: vllm:cache_config_info says "
            'cache_dtype="auto" (the KV cache takes the --dtype the server runs with), and '
            f"vLLM exports no model config. The plan assumes {budget.dtype}, from "
            f"{budget.dtype_from}; give --dtype if the server runs another (float32 doubles "
            "the KV per token)."
        )
    return out


def attention_kind(spec: ModelSpec) -> str:
    if spec.mla:
        return "MLA"
    if spec.kv_heads == spec.heads:
        return "MHA"
    return "MQA" if spec.kv_heads == 1 else "GQA"


def gb(n: float) -> str:
    """GB with three significant digits below 10 (2.14), one decimal above (53.9)."""
    v = n / 1e9
    return f"{v:.2f} GB" if abs(v) < 10 else f"{v:,.1f} GB"


def kib(n: float) -> str:
    return f"{n / 1024:g} KiB" if n % 1024 == 0 else f"{n:,.0f} bytes ({n / 1024:.1f} KiB)"


def nbytes(n: float) -> str:
    return f"{n:g} byte" if n == 1 else f"{n:g} bytes"


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell; text left, numbers right."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        out = []
        for cell, w in zip(cells, widths, strict=True):
            numeric = cell[:1].isdigit() or cell == "-"
            out.append(cell.rjust(w) if numeric else cell.ljust(w))
        return "  ".join(out).rstrip()

    return [line(header), *(line(r) for r in rows)]


def text(doc: dict[str, Any]) -> str:
    lines: list[str] = []
    if "plan" in doc:
        lines += _plan(doc)
    if "live" in doc:
        if lines:
            lines.append("")
        lines += _live(doc["live"])
    return inert("\n".join(lines)) + "\n"


def _per_token(doc: dict[str, Any], p: dict[str, Any]) -> str:
    m, value = doc["model"], p["kv_bytes_per_value"]
    per_gpu = " per GPU" if p["tensor_parallel"] > 1 else ""
    if m["attention"] == "MLA":
        return (
            f"{m['layers']} layers x ({m['kv_lora_rank']} kv_lora_rank + "
            f"{m['qk_rope_head_dim']} qk_rope_head_dim) x {nbytes(value)} = "
            f"{kib(p['kv_bytes_per_token'])}{per_gpu}"
        )
    return (
        f"2 (K and V) x {m['layers']} layers x {p['kv_heads_per_gpu']} KV heads{per_gpu} x "
        f"{m['head_dim']} head dim x {nbytes(value)} = {kib(p['kv_bytes_per_token'])}{per_gpu}"
    )


def _plan(doc: dict[str, Any]) -> list[str]:
    m, p, g = doc["model"], doc["plan"], doc["gpu"]
    tp = p["tensor_parallel"]
    free = (
        f"{g['memory_bytes'] / 1e9:g} x {doc['gpu_memory_utilization']:g} - "
        f"{gb(p['weight_bytes'])} weights - {gb(doc['runtime_overhead_bytes'])} runtime = "
        f"{gb(p['free_bytes'])}"
    )
    source = "preset" if m["source"] == "preset" else m["source"]
    lines = [
        f"{m['name']} ({source}): {m['attention']}, {m['layers']} layers, {m['dtype']}",
        f"{g['name']}: {g['memory_bytes'] / 1e9:g} GB x {doc['gpu_memory_utilization']:g} "
        f"gpu_memory_utilization, TP {tp}, KV cache {p['kv_cache_dtype']}, "
        f"blocks of {doc['block_size']} tokens",
        "",
        f"KV per token    {_per_token(doc, p)}",
        f"Weights         {gb(doc['weights']['bytes'])} ({doc['weights']['source']})"
        + (f", {gb(p['weight_bytes'])} per GPU" if tp > 1 else ""),
        f"Free for KV     {free}" + (" per GPU" if tp > 1 else ""),
        f"Capacity        {p['num_gpu_blocks']:,} blocks = {p['capacity_tokens']:,} tokens",
        f"max_model_len   {doc['max_model_len']:,} tokens: "
        f"{p['full_length_sequences']:,} full-length sequence(s) fit",
    ]
    if doc["users"] is not None:
        per = kib(p["kv_bytes_per_token"])
        fit, n = p["users_fit"] >= doc["users"], p["users_fit"]
        lines += [
            "",
            f"KV needed = {doc['users']:,} users x {doc['context']:,} tokens x {per} = "
            f"{gb(p['need_bytes'])}" + (" per GPU" if tp > 1 else ""),
            f"  vs free = {free}",
            f"-> All {doc['users']:,} users fit."
            if fit
            else f"-> {f'Only {n:,}' if n else 'None'} of {doc['users']:,} users fit: the rest "
            "queue, or running requests are preempted and recomputed later.",
        ]
    else:
        lines.append(f"Users           {p['users_fit']:,} at {doc['context']:,} tokens each")
    lines += ["", "What if (KV/token and free KV per GPU; tokens and users per instance):"]
    rows = []
    for v in doc["what_if"]:
        here = v["tensor_parallel"] == tp and v["kv_cache_dtype"] == p["kv_cache_dtype"]
        rows.append(
            [
                f"  TP {v['tensor_parallel']}, KV {v['kv_cache_dtype']}"
                + (" (plan)" if here else ""),
                f"{v['kv_bytes_per_token'] / 1024:,.1f} KiB".replace(".0 KiB", " KiB"),
                gb(v["free_bytes"]),
                f"{v['capacity_tokens']:,}",
                f"{v['full_length_sequences']:,}",
                f"{v['users_fit']:,}",
            ]
        )
    header = ["", "KV/token", "free KV", "tokens", "full-length", f"users at {doc['context']:,}"]
    lines += table(header, rows)
    lines += [f"  {r}" for r in doc["not_possible"]]
    if doc["notes"]:
        lines.append("")
        for note in doc["notes"]:
            lines += textwrap.wrap(note, WIDTH, initial_indent="- ", subsequent_indent="  ")
    lines += ["", "GB = 10^9 bytes; KiB = 1,024 bytes."]
    return lines


def _live(live: dict[str, Any]) -> list[str]:
    max_model_len, context = live["max_model_len"], live["context"]
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(live["at"]))
    engines = live["engines"]
    if not engines:
        return [
            f"Live: no vllm:cache_config_info series at {when} (vLLM before 0.8, "
            "--disable-log-stats, or the servers are not scraped)."
        ]
    full = f"full {max_model_len:,}" if max_model_len else "full-length"
    users = f"users at {context:,}" if context else "users"
    header = ["job", "instance", "engine", "model", "blocks", "block", "tokens", "KV dtype"]
    header += ["util", full, users]
    rows = [
        [
            printable(e["job"]) or "-",
            printable(e["instance"]) or "-",
            printable(e["engine"]) or "-",
            printable(e["model_name"]) or "-",
            _count(e["num_gpu_blocks"]),
            _count(e["block_size"]),
            _count(e["capacity_tokens"]),
            printable(e["cache_dtype"]) or "-",
            printable(e["gpu_memory_utilization"]) or "-",
            _count(e["full_length_sequences"]),
            _count(e["users_fit"]),
        ]
        for e in engines
    ]
    lines = [f"Live capacity at {when} (vllm:cache_config_info):", *table(header, rows)]
    if not max_model_len:
        lines.append("Give --max-model-len (or --model) to count full-length sequences.")
    return lines
