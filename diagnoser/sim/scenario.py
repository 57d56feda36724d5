"""Scenarios as data: ``fixtures/scenarios/<name>.yaml``.

A scenario names the models served (preset, GPU, engine flags, API server, workload, client
path, probe), a timeline of changes (set a knob at a time, or ramp it over a duration), and
its labels (``diagnoser.sim.labels``): the playbooks ``diagnose`` must find current at the
end, those it must not, and those whose incident ended in the window. Every problem is
reported as one line naming the file and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diagnoser.hardware import presets as hardware
from diagnoser.metrics.buckets import BucketsError, parse_custom, prompt_bucket_label
from diagnoser.metrics.platform import START_FAILURES
from diagnoser.plumbing.durations import format_duration, parse_duration
from diagnoser.plumbing.errors import FileFieldError, read_yaml_mapping
from diagnoser.sim.engine import EngineConfig
from diagnoser.sim.labels import Expectation
from diagnoser.sim.profiles import profile
from diagnoser.sim.server import RUNTIMES, ApiServerConfig, Fault
from diagnoser.sim.workload import Lengths, Rate, Workload

PLATFORMS = ("kubernetes", "bare-metal")
# How a deploy replaces a server: the same target restarts, or a new pod takes its place.
ROLLOUTS = ("in-place", "new-pods")


class ScenarioError(FileFieldError):
    """A scenario that cannot be simulated; ``str()`` is one line naming file and field."""


@dataclass
class Client:
    network_seconds: float = 0.02  # one way, client to server
    buffering_proxy: bool = False  # the stream arrives in one burst at the end


@dataclass
class Probe:
    enabled: bool = False
    every: float = 30.0  # seconds between rounds (one request per prompt class a round)
    buckets: tuple[int, ...] = (128, 1024, 4096, 16384)
    max_tokens: int = 16
    target: str = "public"

    bucket_label = staticmethod(prompt_bucket_label)


@dataclass
class Change:
    at: float
    set: dict[str, Any]
    over: float = 0.0  # ramp linearly over this many seconds
    restart: bool = False  # a rolling restart of every instance (a deploy)


@dataclass
class ModelScenario:
    name: str
    spec: hardware.ModelSpec
    gpu: hardware.GpuSpec
    engine: EngineConfig
    api: ApiServerConfig
    workload: Workload
    client: Client
    probe: Probe
    fault: Fault
    instances: int = 1
    engines: int = 1
    version: str = "0.33"
    runtime: str = "vllm"  # the serving engine, a registered one: vllm or sglang
    dcgm: bool = True
    # kubernetes (namespace and pod labels, dcgm-exporter's pod mapping) or bare-metal
    platform: str = "kubernetes"
    # in-place (a StatefulSet, a systemd unit: the same target restarts) or new-pods (a
    # Deployment: each server comes back as a new pod, a new target); kubernetes only
    rollout: str = "in-place"
    kube_exporters: bool = False  # kube-state-metrics and cAdvisor scraped (kubernetes only)
    timeline: list[Change] = field(default_factory=list)


@dataclass
class Scenario:
    name: str
    description: str
    duration: float
    scrape_interval: float
    seed: int
    models: list[ModelScenario]
    labels: Expectation
    path: Path | None = None


# --- building dataclasses from YAML ---------------------------------------------------------

LIMITS: dict[str, tuple[float, float]] = {
    # field -> (minimum, maximum), inclusive
    "mean": (0, 1e5),
    "amplitude": (0, 1),
    "noise": (0, 1),
    "peak_hour": (0, 24),
    "start_hour": (0, 24),
    "burst_factor": (0, 100),
    "median": (1, 1e7),
    "sigma": (0, 3),
    "long_share": (0, 1),
    "long_median": (0, 1e7),
    "long_sigma": (0, 3),
    "max_tokens": (1, 1e7),
    "stop_failure_share": (0, 1),
    "overlong_share": (0, 1),
    "max_num_seqs": (1, 1e5),
    "max_num_batched_tokens": (1, 1e7),
    "new_token_ratio": (0, 1),
    "max_model_len": (16, 1e8),
    "gpu_memory_utilization": (0.01, 1),
    "block_size": (1, 1024),
    "tensor_parallel": (1, 64),
    "prefix_hit_share": (0, 0.99),
    "prefix_share": (0, 0.99),
    "draft_acceptance": (0, 0.99),
    "hot_share": (0, 1),
    "adapters": (0, 10000),
    "adapter_skew": (0, 5),
    "max_loras": (0, 256),
    "kv_transfer_gbps": (0.001, 1e4),
    "kv_transfer_failure": (0, 1),
    "num_speculative_tokens": (0, 16),
    "draft_overhead": (0, 5),
    "mfu": (0.01, 1),
    "mbu": (0.01, 1),
    "step_overhead": (0, 1),
    "step_overhead_per_seq": (0, 0.01),
    "processes": (1, 64),
    "other_process_gb": (0, 1e4),
    "hung_instances": (0, 256),
    "network_seconds": (0, 60),
}
# Duration fields -> (shortest, longest) in seconds, inclusive.
_DURATIONS = {
    "every": (1.0, 86400.0),
    "burst_every": (0.0, 86400.0),
    "burst_length": (0.0, 86400.0),
    "restart_seconds": (0.0, 86400.0),
    "liveness_kill_seconds": (0.0, 86400.0),
    "phase_quantum": (0.001, 60.0),
}
# A scrape is a sample of every series: more than this many in one scenario, and the
# recording outgrows a machine's memory (a week at 15 s is 40,320).
MIN_SCRAPE_INTERVAL = 1.0
MAX_SCRAPES = 50_000


def _duration(value: Any, path: Path, where: str, lo: float, hi: float = math.inf) -> float:
    """A duration field within ``[lo, hi]`` seconds, or a ScenarioError naming it."""
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise ScenarioError(path, where, str(exc)) from None
    if not lo <= seconds <= hi:
        what = f"at least {_clock(lo)}" if hi == math.inf else f"{_clock(lo)} to {_clock(hi)}"
        raise ScenarioError(path, where, f"must be {what} (got {value!r})")
    return seconds


def _clock(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if 0 < seconds < 1 else format_duration(seconds)


def _build(cls: type, raw: Any, path: Path, where: str, base: Any = None, built: Any = None) -> Any:
    """``cls`` from a mapping, each key checked against its field (type, limits); ``built``
    holds fields already made (a workload's rate and lengths), which the mapping may not
    name again."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(path, where, "must be a mapping")
    made = dict(built or {})
    fields = {
        f.name: f
        for f in dataclasses.fields(cls)
        if not f.name.startswith("_") and f.name not in made
    }
    out = dataclasses.replace(base) if base is not None else None
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise ScenarioError(
                path, f"{where}.{key}", f"unknown key (known: {', '.join(sorted(fields))})"
            )
        kwargs[key] = _coerce(fields[key], value, path, f"{where}.{key}")
    try:
        if out is not None:
            for k, v in kwargs.items():
                setattr(out, k, v)
            return out
        return cls(**made, **kwargs)
    except TypeError as exc:
        missing = re.findall(r"'(\w+)'", str(exc))
        raise ScenarioError(
            path, f"{where}.{missing[0] if missing else ''}".rstrip("."), "is required"
        ) from None


def _coerce(f: dataclasses.Field[Any], value: Any, path: Path, where: str) -> Any:
    name, typ = f.name, str(f.type)
    if name in _DURATIONS:
        lo, hi = _DURATIONS[name]
        return _duration(value, path, where, lo, hi)
    if typ == "bool":
        if not isinstance(value, bool):
            raise ScenarioError(path, where, "must be true or false")
        return value
    if typ in ("int", "float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(path, where, f"must be a number (got {value!r})")
        if not math.isfinite(value):
            raise ScenarioError(path, where, f"must be a finite number (got {value})")
        lo, hi = LIMITS.get(name, (float("-inf"), float("inf")))
        if not lo <= value <= hi:
            raise ScenarioError(path, where, f"must be between {lo:g} and {hi:g} (got {value})")
        return int(value) if typ == "int" else float(value)
    if name == "buckets":
        if (
            not isinstance(value, list)
            or not value
            or not all(isinstance(v, int) and v > 0 for v in value)
        ):
            raise ScenarioError(path, where, "must be a list of positive token counts")
        return tuple(value)
    if name == "histogram_buckets":
        return _histogram_buckets(value, path, where)
    if name == "start_failure" and value not in ("", *START_FAILURES):
        raise ScenarioError(path, where, f"must be one of {', '.join(START_FAILURES)}")
    if typ == "str":
        if not isinstance(value, str):
            raise ScenarioError(path, where, "must be a string")
        return value
    return value


def _histogram_buckets(value: Any, path: Path, where: str) -> dict[str, tuple[float, ...]]:
    try:
        return parse_custom(value)
    except BucketsError as exc:
        raise ScenarioError(path, ".".join(p for p in (where, exc.where) if p), str(exc)) from None


def _model(raw: Any, path: Path, where: str) -> ModelScenario:
    if not isinstance(raw, dict):
        raise ScenarioError(path, where, "must be a mapping")
    # The model's fields, as a scenario names them.
    known = {f.name for f in dataclasses.fields(ModelScenario)} - {"spec", "api"}
    known |= {"preset", "api_server"}
    for key in raw:
        if key not in known:
            raise ScenarioError(
                path, f"{where}.{key}", f"unknown key (known: {', '.join(sorted(known))})"
            )
    for key in ("name", "preset", "workload"):
        if key not in raw:
            raise ScenarioError(path, f"{where}.{key}", "is required")
    try:
        spec = hardware.model(str(raw["preset"]))
    except KeyError as exc:
        raise ScenarioError(path, f"{where}.preset", str(exc.args[0])) from None
    try:
        g = hardware.gpu(str(raw.get("gpu", "H100-80GB")))
    except KeyError as exc:
        raise ScenarioError(path, f"{where}.gpu", str(exc.args[0])) from None
    engine = _build(EngineConfig, raw.get("engine"), path, f"{where}.engine")
    if engine.num_gpu_blocks(spec, g) < 1:
        raise ScenarioError(
            path,
            f"{where}.engine",
            "the KV cache would be smaller than one "
            "block: weights and overhead exceed gpu_memory_utilization x memory",
        )
    wl = raw["workload"]
    if not isinstance(wl, dict):
        raise ScenarioError(path, f"{where}.workload", "must be a mapping")
    w = f"{where}.workload"
    for key in ("rate", "prompt", "output"):
        if key not in wl:
            raise ScenarioError(path, f"{w}.{key}", "is required")
    curves = {
        "rate": _build(Rate, wl["rate"], path, f"{w}.rate"),
        "prompt": _build(Lengths, wl["prompt"], path, f"{w}.prompt"),
        "output": _build(Lengths, wl["output"], path, f"{w}.output"),
    }
    extra = {k: v for k, v in wl.items() if k not in curves}
    workload = _build(Workload, extra, path, w, built=curves)
    if workload.rate.shape not in ("steady", "diurnal"):
        raise ScenarioError(path, f"{w}.rate.shape", "must be steady or diurnal")
    platform = str(raw.get("platform", "kubernetes"))
    if platform not in PLATFORMS:
        raise ScenarioError(path, f"{where}.platform", f"must be one of {', '.join(PLATFORMS)}")
    rollout = str(raw.get("rollout", "in-place"))
    if rollout not in ROLLOUTS:
        raise ScenarioError(path, f"{where}.rollout", f"must be one of {', '.join(ROLLOUTS)}")
    if rollout == "new-pods" and platform != "kubernetes":
        raise ScenarioError(path, f"{where}.rollout", "new-pods needs platform kubernetes")
    if raw.get("kube_exporters") and platform != "kubernetes":
        raise ScenarioError(path, f"{where}.kube_exporters", "needs platform kubernetes")
    runtime = str(raw.get("runtime", "vllm"))
    if runtime not in RUNTIMES:
        raise ScenarioError(path, f"{where}.runtime", f"must be one of {', '.join(RUNTIMES)}")
    profiles = RUNTIMES[runtime]
    if profile(runtime).mechanics == "sglang":  # SGLang's scheduler, for its mechanics
        engine.as_sglang(raw.get("engine") or {})
    version = str(raw.get("version", next(iter(profiles))))
    if version not in profiles:
        raise ScenarioError(
            path, f"{where}.version", f"must be one of {', '.join(profiles)} for {runtime}"
        )
    m = ModelScenario(
        name=str(raw["name"]),
        spec=spec,
        gpu=g,
        engine=engine,
        api=_build(ApiServerConfig, raw.get("api_server"), path, f"{where}.api_server"),
        workload=workload,
        client=_build(Client, raw.get("client"), path, f"{where}.client"),
        probe=_build(Probe, raw.get("probe"), path, f"{where}.probe"),
        fault=_build(Fault, raw.get("fault"), path, f"{where}.fault"),
        instances=_count(raw.get("instances", 1), path, f"{where}.instances"),
        engines=_count(raw.get("engines", 1), path, f"{where}.engines"),
        version=version,
        runtime=runtime,
        dcgm=bool(raw.get("dcgm", True)),
        platform=platform,
        rollout=rollout,
        kube_exporters=bool(raw.get("kube_exporters", False)),
    )
    timeline = raw.get("timeline") or []
    if not isinstance(timeline, list):
        raise ScenarioError(path, f"{where}.timeline", "must be a list of changes")
    m.timeline = [_change(c, path, f"{where}.timeline[{i}]", m) for i, c in enumerate(timeline)]
    return m


def _count(value: Any, path: Path, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
        raise ScenarioError(path, where, f"must be a whole number from 1 to 256 (got {value!r})")
    return value


def _change(raw: Any, path: Path, where: str, m: ModelScenario) -> Change:
    if not isinstance(raw, dict) or "at" not in raw:
        raise ScenarioError(path, where, "needs 'at' and 'set' (or 'restart: true')")
    unknown = set(raw) - {"at", "set", "over", "restart"}
    if unknown:
        raise ScenarioError(
            path, f"{where}.{sorted(unknown)[0]}", "unknown key (known: at, over, restart, set)"
        )
    at = _duration(raw["at"], path, f"{where}.at", 0.0) if raw["at"] not in (0, "0") else 0.0
    over = _duration(raw["over"], path, f"{where}.over", 0.0) if "over" in raw else 0.0
    sets = raw.get("set") or {}
    if not isinstance(sets, dict):
        raise ScenarioError(path, f"{where}.set", "must map knob paths to values")
    for knob, value in sets.items():
        target, attr = resolve(m, knob)
        if target is None:
            raise ScenarioError(path, f"{where}.set.{knob}", "unknown knob")
        field_ = next(f for f in dataclasses.fields(target) if f.name == attr)
        _coerce(field_, value, path, f"{where}.set.{knob}")
        if over and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ScenarioError(path, f"{where}.set.{knob}", "only numbers can be ramped")
    if not sets and not raw.get("restart"):
        raise ScenarioError(path, where, "changes nothing (give 'set' or 'restart: true')")
    return Change(at=at, set=dict(sets), over=over, restart=bool(raw.get("restart")))


def resolve(m: ModelScenario, knob: str) -> tuple[Any, str]:
    """``workload.prompt.median`` -> (the Lengths object, "median"); (None, "") if unknown."""
    parts = knob.split(".")
    roots: dict[str, Any] = {
        "workload": m.workload,
        "engine": m.engine,
        "api_server": m.api,
        "client": m.client,
        "probe": m.probe,
        "fault": m.fault,
    }
    obj = roots.get(parts[0])
    for p in parts[1:-1]:
        if obj is None or not dataclasses.is_dataclass(obj):
            return None, ""
        obj = getattr(obj, p, None)
    if obj is None or not dataclasses.is_dataclass(obj) or len(parts) < 2:
        return None, ""
    names = {f.name for f in dataclasses.fields(obj) if not f.name.startswith("_")}
    return (obj, parts[-1]) if parts[-1] in names else (None, "")


def load_scenario(path: Path) -> Scenario:
    raw = read_yaml_mapping(path, ScenarioError, "a scenario")
    known = {"description", "duration", "scrape_interval", "seed", "models", "labels"}
    for key in raw:
        if key not in known:
            raise ScenarioError(path, key, f"unknown key (known: {', '.join(sorted(known))})")
    for key in ("description", "duration", "models", "labels"):
        if key not in raw:
            raise ScenarioError(path, key, "is required")
    interval = _duration(
        raw.get("scrape_interval", "15s"), path, "scrape_interval", MIN_SCRAPE_INTERVAL
    )
    duration = _duration(raw["duration"], path, "duration", interval)
    if duration / interval > MAX_SCRAPES:
        raise ScenarioError(
            path,
            "duration",
            f"{format_duration(duration)} is {duration / interval:,.0f} scrapes at "
            f"{format_duration(interval)}; at most {MAX_SCRAPES:,} (a week at 15 s)",
        )
    seed = raw.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 1 << 63:
        raise ScenarioError(path, "seed", f"must be a whole number from 0 to 2^63 (got {seed!r})")
    if not isinstance(raw["models"], list) or not raw["models"]:
        raise ScenarioError(path, "models", "must be a non-empty list")
    models = [_model(m, path, f"models[{i}]") for i, m in enumerate(raw["models"])]
    for i, m in enumerate(models):
        for j, change in enumerate(m.timeline):
            if change.at > duration:
                raise ScenarioError(
                    path,
                    f"models[{i}].timeline[{j}].at",
                    f"{format_duration(change.at)} is after the scenario's end "
                    f"({format_duration(duration)})",
                )
    return Scenario(
        name=path.stem,
        description=str(raw["description"]).strip(),
        duration=duration,
        scrape_interval=interval,
        seed=seed,
        models=models,
        labels=_labels(raw["labels"], path),
        path=path,
    )


_LABEL_LISTS = ("expect", "absent", "resolved", "ended")  # each a list of playbook ids


def _labels(lab: Any, path: Path) -> Expectation:
    if not isinstance(lab, dict) or set(lab) - {"window", *_LABEL_LISTS}:
        raise ScenarioError(path, "labels", f"may hold only window, {', '.join(_LABEL_LISTS)}")
    ids: dict[str, tuple[str, ...]] = {}
    for key in _LABEL_LISTS:
        value = lab.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ScenarioError(path, f"labels.{key}", "must be a list of playbook ids")
        ids[key] = tuple(value)
    for key in ("resolved", "ended"):
        for i, pid in enumerate(ids[key]):
            if pid in ids["expect"]:
                raise ScenarioError(path, f"labels.{key}[{i}]", f"{pid} is also in labels.expect")
    return Expectation(
        window=_duration(lab.get("window", "1h"), path, "labels.window", MIN_SCRAPE_INTERVAL),
        expect=ids["expect"],
        absent=ids["absent"],
        resolved=ids["resolved"],
        ended=ids["ended"],
    )


def check_labels(sc: Scenario, known: Iterable[str]) -> None:
    """Every playbook a scenario's labels name must exist (in ``known``: the catalog's ids)."""
    ids = sorted(known)
    for key in _LABEL_LISTS:
        for i, pid in enumerate(getattr(sc.labels, key)):
            if pid not in ids:
                near = difflib.get_close_matches(pid, ids, n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                raise ScenarioError(
                    sc.path or sc.name, f"labels.{key}[{i}]", f"unknown playbook {pid!r}{hint}"
                )
