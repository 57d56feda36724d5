"""Write every generated artefact of the repository: rules, runbooks and dashboards."""

from __future__ import annotations

from pathlib import Path

from diagnoser.outputs import rules, runbooks
from diagnoser.site import Site


def render(site: Site) -> dict[Path, str]:
    """Every generated file, by path relative to the output root."""
    out: dict[Path, str] = {}
    for name, text in rules.render_files(site).items():
        out[Path("rules") / name] = text
    for name, text in runbooks.render_all(site).items():
        out[Path("runbooks") / name] = text
    from diagnoser.outputs import dashboards

    boards = {name: dashboards.render(name, site) for name in dashboards.DASHBOARDS}
    for name, text in boards.items():
        out[Path("dashboards") / f"{name}.json"] = text
    out[Path("dashboards") / "provisioning.yaml"] = dashboards.provisioning()
    out[Path("dashboards") / "configmaps.yaml"] = dashboards.configmaps(boards)
    return out


def stale(files: dict[Path, str], root: Path) -> list[Path]:
    """Generated files whose content on disk differs from what the catalog renders."""
    return [
        rel
        for rel, text in files.items()
        if not (root / rel).exists() or (root / rel).read_text(encoding="utf-8") != text
    ]


def write(files: dict[Path, str], root: Path) -> list[Path]:
    """Write what changed; remove runbook pages of playbooks that no longer exist."""
    changed = stale(files, root)
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[rel], encoding="utf-8")
    pages = {rel.name: text for rel, text in files.items() if rel.parts[0] == "runbooks"}
    removed = runbooks.prune(pages, root / "runbooks")
    return changed + removed
