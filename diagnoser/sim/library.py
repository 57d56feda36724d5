"""The scenario library shipped with the package (``fixtures/scenarios`` in a checkout)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from diagnoser.sim.scenario import Scenario, ScenarioError, load_scenario


def scenario_dir() -> Path:
    packaged = Path(str(resources.files("diagnoser"))) / "_catalog" / "scenarios"
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent.parent / "fixtures" / "scenarios"


def names() -> list[str]:
    return sorted(p.stem for p in scenario_dir().glob("*.yaml"))


def find(name_or_path: str) -> Scenario:
    """A scenario file by path, or a library scenario by name; ``NAME~K`` is its K-th
    held-out variant (see ``diagnoser.sim.variants``)."""
    base, sep, k = name_or_path.rpartition("~")
    if sep and k.isdigit() and int(k) > 0:
        from diagnoser.sim.variants import variant

        return variant(find(base), int(k))
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return load_scenario(path)
    candidate = scenario_dir() / f"{name_or_path}.yaml"
    if not candidate.exists():
        import difflib

        near = difflib.get_close_matches(name_or_path, names(), n=1)
        hint = f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(names())})"
        raise ScenarioError(name_or_path, "", f"no such scenario{hint}")
    return load_scenario(candidate)
