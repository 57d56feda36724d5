"""Incident files (``fixtures/real/*.yaml``): what a real vLLM server is put through.

An incident is a server (flags on top of the lab's), a warm-up, then phases run one after
another, each with its traffic (a ``LoadSpec``; keys not given carry over from the phase
before) and at most one action on the server at its start:

- ``restart``: stop the server and start it again with ``args`` (a planned deploy);
- ``kill``: ``SIGKILL`` the server and leave it down (a crash);
- ``crash_loop``: kill it every ``every`` seconds and start it again (a loop);
- ``freeze``: ``SIGSTOP`` its engine core and workers (a hang: the API server still answers);
- ``thaw``: ``SIGCONT`` to the frozen engine (the hang ends; in a sequence);
- ``start``: start the killed server again (in a sequence);
- ``replace``: a rollout to a new pod: the server is stopped and its target leaves service
  discovery; a new server with ``args`` on a new port (a new target) takes its place, and is
  started again each time it exits, after the kubelet's back-off (10 s, doubling);
- ``restart_on_exit``: the server is left to die on its own (the kernel's OOM killer at its
  memory limit) and started again after each exit with the kubelet's back-off
  (``restartPolicy: Always``).

``memory_headroom: MiB`` starts the server in a memory cgroup of its own whose limit is set,
as the incident's phase starts, to the server's footprint then plus that headroom (a
container's limit sized from the working set under its usual traffic; ``host``).
``node_exporter: true`` scrapes Debian's node-exporter beside the server (job ``node``, on the
server's host: its ``instance`` has the same host part).

``replicas: N`` runs N servers of the model (the first takes the phases' actions; a load's
``hot_share`` is the share of requests it gets). ``adapters: N`` serves N LoRA adapters made
locally (``lora-00``...; see ``model``), which a phase's load names with its own ``adapters``.

``expect`` is the playbook ``diagnose`` must name first over the last phase (``none``: no
finding), ``health`` the verdict it must give (``unhealthy``, ``healthy``, or ``any``). The
baseline (the phase before the last) must give no finding, and a healthy verdict, unless
``baseline_expect`` names the finding its traffic is built to give, or ``baseline_health``
another verdict (a CPU server whose plain load already misses the default TTFT SLO).
``health_reason`` is a phrase one of the incident's health reasons must hold (why the server
went down, as the platform says it).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from diagnoser.plumbing.durations import parse_duration
from diagnoser.plumbing.errors import FileFieldError, read_yaml_mapping
from lab.real.load import LoadSpec

ACTIONS = (
    "restart",
    "kill",
    "crash_loop",
    "freeze",
    "replace",
    "thaw",
    "start",
    "restart_on_exit",
)
HEALTH = ("healthy", "unhealthy", "any")


class IncidentError(FileFieldError):
    """A bad incident file: one line naming the file and the field."""


@dataclass(frozen=True)
class Phase:
    name: str
    duration: float
    load: LoadSpec
    action: str | None = None
    args: tuple[str, ...] = ()  # restart, replace: the new flags
    every: float = 0.0  # crash_loop: seconds between kills


@dataclass(frozen=True)
class Incident:
    name: str
    description: str
    expect: str | None
    health: str
    server: tuple[str, ...]
    warmup: float
    phases: tuple[Phase, ...]
    probe: bool = False
    seed: int = 1
    path: Path | None = None
    # What the baseline must give: nothing (None), or a finding its traffic is built with
    # (answers that end on max_tokens where vLLM refuses the lab's exact-length method).
    baseline_expect: str | None = None
    # LoRA adapters the server is given (made locally; --enable-lora and --lora-modules are
    # added to its flags); the phases' load names them.
    adapters: int = 0
    # Servers of the model (1: one), each scraped as a target of the vllm job; a phase's
    # load spreads requests over them (``hot_share``: the first's share).
    replicas: int = 1
    # The verdict the baseline must give (``any``: whatever the SLOs say of the CPU server).
    baseline_health: str = "healthy"
    # MiB over the server's footprint at its first start: its memory cgroup's limit (0: none).
    memory_headroom: int = 0
    # Debian's node-exporter scraped beside the server (job ``node``).
    node_exporter: bool = False
    # A phrase one of the incident's health reasons must hold ("": any reasons).
    health_reason: str = ""

    @property
    def duration(self) -> float:
        return self.warmup + sum(p.duration for p in self.phases)

    @property
    def incident(self) -> Phase:
        return self.phases[-1]

    @property
    def baseline(self) -> Phase:
        return self.phases[-2]


def incident_dir() -> Path:
    return Path(__file__).resolve().parents[2] / "fixtures" / "real"


def names() -> list[str]:
    return sorted(p.stem for p in incident_dir().glob("*.yaml"))


def find(name_or_path: str) -> Incident:
    return load(path_of(name_or_path, incident_dir(), "incident"))


def path_of(name_or_path: str, directory: Path, what: str) -> Path:
    """A file given by its path, or by its name among ``directory``'s YAML files; an
    unknown name is an ``IncidentError`` listing the known ones."""
    path = Path(name_or_path)
    if path.suffix not in (".yaml", ".yml"):
        path = directory / f"{name_or_path}.yaml"
        if not path.is_file():
            known = ", ".join(sorted(p.stem for p in directory.glob("*.yaml")))
            raise IncidentError(name_or_path, "", f"no such {what} (known: {known})")
    return path


def duration_field(path: Path, where: str, value: object) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise IncidentError(path, where, str(exc)) from None


def load_spec(path: Path, where: str, raw: object, before: LoadSpec) -> LoadSpec:
    if raw is None:
        return before
    if not isinstance(raw, dict):
        raise IncidentError(path, where, "must be a mapping of load parameters")
    known = {f.name: f.type for f in fields(LoadSpec)}
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise IncidentError(path, f"{where}.{key}", f"unknown (known: {', '.join(known)})")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise IncidentError(path, f"{where}.{key}", "must be a number >= 0")
        out[key] = int(value) if known[key] == "int" else float(value)
    spec = replace(before, **out)
    if spec.long_share > 1:
        raise IncidentError(path, f"{where}.long_share", "must be a share between 0 and 1")
    return spec


def args_field(path: Path, where: str, raw: object) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(a, (str, int, float)) for a in raw):
        raise IncidentError(path, where, "must be a list of command-line words")
    return tuple(str(a) for a in raw)


def load(path: Path) -> Incident:
    doc = read_yaml_mapping(path, IncidentError, "an incident")
    raw_phases = doc.get("phases")
    if not isinstance(raw_phases, list) or len(raw_phases) < 2:
        raise IncidentError(path, "phases", "must list a baseline phase and the incident phase")
    spec = LoadSpec(rate=0.0)
    phases = []
    for i, raw in enumerate(raw_phases):
        where = f"phases[{i}]"
        if not isinstance(raw, dict):
            raise IncidentError(path, where, "must be a mapping")
        spec = load_spec(path, f"{where}.load", raw.get("load"), spec)
        action = raw.get("action")
        if action is not None and action not in ACTIONS:
            raise IncidentError(path, f"{where}.action", f"must be one of {', '.join(ACTIONS)}")
        every = raw.get("every")
        if action == "crash_loop" and every is None:
            raise IncidentError(path, f"{where}.every", "a crash loop needs 'every'")
        phases.append(
            Phase(
                name=str(raw.get("name", f"phase {i + 1}")),
                duration=duration_field(path, f"{where}.duration", raw.get("duration")),
                load=spec,
                action=action,
                args=args_field(path, f"{where}.args", raw.get("args")),
                every=duration_field(path, f"{where}.every", every) if every is not None else 0.0,
            )
        )
    expect = doc.get("expect")
    if not isinstance(expect, str) or not expect:
        raise IncidentError(path, "expect", "must name a playbook, or say none")
    health = doc.get("health", "any")
    if health not in HEALTH:
        raise IncidentError(path, "health", f"must be one of {', '.join(HEALTH)}")
    baseline_health = doc.get("baseline_health", "healthy")
    if baseline_health not in HEALTH:
        raise IncidentError(path, "baseline_health", f"must be one of {', '.join(HEALTH)}")
    seed = doc.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise IncidentError(path, "seed", "must be an integer")
    adapters = doc.get("adapters", 0)
    if isinstance(adapters, bool) or not isinstance(adapters, int) or not 0 <= adapters <= 64:
        raise IncidentError(path, "adapters", "must be a whole number from 0 to 64")
    needed = max(p.load.adapters for p in phases)
    if needed > adapters:
        raise IncidentError(
            path, "adapters", f"the load names {needed} adapters, the server has {adapters}"
        )
    replicas = doc.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 1 <= replicas <= 4:
        raise IncidentError(path, "replicas", "must be a whole number from 1 to 4")
    if any(p.load.hot_share > 1 for p in phases):
        raise IncidentError(path, "phases", "hot_share must be a share between 0 and 1")
    baseline = doc.get("baseline_expect", "none")
    if not isinstance(baseline, str) or not baseline:
        raise IncidentError(path, "baseline_expect", "must name a playbook, or say none")
    headroom = doc.get("memory_headroom", 0)
    if isinstance(headroom, bool) or not isinstance(headroom, int) or not 0 <= headroom <= 65536:
        raise IncidentError(path, "memory_headroom", "must be a whole number of MiB, 0 to 65536")
    node_exporter = doc.get("node_exporter", False)
    if not isinstance(node_exporter, bool):
        raise IncidentError(path, "node_exporter", "must be true or false")
    health_reason = doc.get("health_reason", "")
    if not isinstance(health_reason, str):
        raise IncidentError(path, "health_reason", "must be a phrase")
    return Incident(
        name=path.stem,
        description=" ".join(str(doc.get("description", "")).split()),
        expect=None if expect == "none" else expect,
        health=health,
        server=args_field(path, "server", doc.get("server")),
        warmup=duration_field(path, "warmup", doc.get("warmup", "1m")),
        phases=tuple(phases),
        probe=bool(doc.get("probe", False)),
        seed=seed,
        path=path,
        baseline_expect=None if baseline == "none" else baseline,
        adapters=adapters,
        replicas=replicas,
        baseline_health=baseline_health,
        memory_headroom=headroom,
        node_exporter=node_exporter,
        health_reason=health_reason,
    )
