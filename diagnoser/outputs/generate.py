"""Write every generated artefact of the repository: rules, runbooks and dashboards."""

from __future__ import annotations

from pathlib import Path

from diagnoser.outputs import rules, runbooks
from diagnoser.plumbing.atomic import Staged, refusal
from diagnoser.plumbing.errors import UserError, read_bytes
from diagnoser.site import Site


def render(site: Site, configmaps: bool = False) -> dict[Path, str]:
    """Every generated file, by path relative to the output root; with ``configmaps`` the
    dashboards as ConfigMaps too (for kube-prometheus-stack's Grafana sidecar: made on
    demand, as they repeat every dashboard)."""
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
    if configmaps:
        out[Path("dashboards") / "configmaps.yaml"] = dashboards.configmaps(boards)
    return out


# Larger than any generated file (the ConfigMaps of every dashboard are a few MiB).
MAX_GENERATED = 64 << 20


def _on_disk(path: Path) -> bytes | None:
    """What a generated file holds now (None: not there). Anything but a regular file where
    a generated file goes (a directory, a symbolic link, a FIFO) is refused in one line;
    content that is not UTF-8 is simply not what would be written."""
    why = refusal(path)
    if why is not None:
        raise UserError(f"--out: {path} {why}")
    if not path.exists():
        return None

    def error(p: Path, where: str, message: str) -> UserError:
        return UserError(f"--out: {path}: {message}")

    return read_bytes(path, error, MAX_GENERATED)


def stale(files: dict[Path, str], root: Path) -> list[Path]:
    """Generated files whose content on disk differs from what the catalog renders."""
    return [rel for rel, text in files.items() if _on_disk(root / rel) != text.encode()]


def write(files: dict[Path, str], root: Path) -> list[Path]:
    """Write what changed; remove runbook pages of playbooks that no longer exist. Every
    changed file is written beside its target first and read back; only when all are whole
    are they renamed over the old ones (a failure midway leaves the old files, not a
    truncated dashboard), and a link where a file goes is refused, not followed."""
    changed = stale(files, root)
    with Staged() as staged:
        for rel in changed:
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            data = files[rel].encode()
            if staged.write(path, data).read_bytes() != data:
                raise OSError(f"{rel} did not read back as written")
        staged.commit()
    pages = {rel.name: text for rel, text in files.items() if rel.parts[0] == "runbooks"}
    removed = runbooks.prune(pages, root / "runbooks")
    return changed + removed
