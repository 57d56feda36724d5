"""What each playbook, alert and dashboard panel supports on each engine, as the documentation's
table (``docs/engines/support.md``): derived from the signals (which have an SGLang expression,
and why not) so the table cannot drift from the code (``tests/test_engines.py`` holds the page
to it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from diagnoser.catalog import PLACEHOLDER, Playbook
from diagnoser.metrics import engines
from diagnoser.site import Site

BEGIN, END = "<!-- engine-support:begin -->", "<!-- engine-support:end -->"
SUPPORT_PAGE = "docs/engines/support.md"
DASHBOARD_TITLES = {
    "overview": "Overview",
    "prompt-length": "Latency by prompt length",
    "kv-batching": "KV cache and batching",
    "gpu-frontend": "GPU and frontend",
    "playbooks": "Playbooks",
}


def gaps(site: Site, engine: str) -> dict[str, str]:
    """Signal -> why ``engine`` has no series for it."""
    return {s.name: s.gap(engine) for s in site.vocabulary if s.gap(engine)}


def _diagnosis(pb: Playbook, lacking: dict[str, str]) -> str:
    if pb.signature is None:
        return "a hint next to findings"
    needed = pb.signature.lacking(lacking)
    if needed:
        return "undecided: " + "; ".join(sorted(set(needed.values())))
    partial = sorted({n for c in pb.signature.conditions() for n in c.needs() if n in lacking})
    return "yes" + (f" (without {', '.join(partial)})" if partial else "")


def vllm_only(expr: str, site: Site, names: set[str], engine: str) -> bool:
    """Whether an alert expression reads a family of the reference engine's (and none of
    ``engine``'s) or a signal ``engine`` lacks."""
    vocab = site.vocabulary
    recorded = {vocab[n].record_name(site.config.by) for n in names}
    used = {m.group(1) for m in PLACEHOLDER.finditer(expr) if m.group(1) in vocab}
    used |= {s.name for s in vocab if s.record_name(site.config.by) in expr}
    ref = engines.reference().prefix
    own = engines.get(engine).prefix
    raw = bool(re.search(rf"(?<![\w:]){re.escape(ref)}", expr)) and own not in expr
    return raw or bool(used & names) or any(r in expr for r in recorded)


def playbook_rows(site: Site, engine: str) -> list[tuple[str, str, str]]:
    lacking = gaps(site, engine)
    rows = []
    for pb in sorted(site.catalog, key=lambda p: p.id):
        if pb.alert is None:
            alert = "-"
        else:
            only = vllm_only(pb.alert.expr, site, set(lacking), engine)
            alert = f"`{pb.alert.name}`" + (f" ({_only()})" if only else "")
        rows.append((pb.id, _diagnosis(pb, lacking), alert))
    return rows


def symptom_rows(site: Site, engine: str) -> list[tuple[str, str]]:
    from diagnoser.outputs.slo import alert_group

    lacking = set(gaps(site, engine))
    out: dict[str, str] = {}
    for rule in alert_group(site)["rules"]:
        name = rule["alert"]
        both = _only() if vllm_only(rule["expr"], site, lacking, engine) else "both"
        if out.get(name, both) != both:
            both = _only()
        out[name] = both
    return sorted(out.items())


def _only() -> str:
    return f"{engines.reference().title} only"


def panel_rows(site: Site) -> list[tuple[str, str, str]]:
    """The panels that are the reference engine's only: dashboard, title, why."""
    from diagnoser.outputs.dashboards import DASHBOARDS, render

    rows = []
    for name in DASHBOARDS:
        board: dict[str, Any] = json.loads(render(name, site))
        panels = [q for p in board["panels"] for q in (p, *p.get("panels", []))]
        for p in panels:
            text = p.get("description") or ""
            if _only() in text:
                why = text.split(f"{_only()}:", 1)[-1].split(" Metrics: ", 1)[0]
                why = why.strip().rstrip(".")
                rows.append((DASHBOARD_TITLES.get(name, name), p["title"], why))
    return rows


def support_table(site: Site) -> str:
    """The support page's section, between its markers: for each engine but the reference."""
    out = [BEGIN]
    for engine in engines.others():
        title = engine.title
        out += [f"| Playbook | On {title}: `diagnose` | Alert (on {title}) |", "|---|---|---|"]
        rows = playbook_rows(site, engine.name)
        out += [f"| `{pid}` | {diag} | {alert} |" for pid, diag, alert in rows]
        out += ["", "| Symptom alert | Engines |", "|---|---|"]
        out += [f"| `{name}` | {on} |" for name, on in symptom_rows(site, engine.name)]
        out.append("")
    out += [f"Dashboard panels that are {_only()} (every other panel reads both engines):", ""]
    out += [f"- {board} / {title}: {why}." for board, title, why in panel_rows(site)]
    out.append(END)
    return "\n".join(out) + "\n"


def rewrite(page: Path, site: Site) -> bool:
    """Put the generated table between the markers of ``page``; whether it changed."""
    text = page.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    new = text[:start] + support_table(site).rstrip("\n") + text[end:]
    if new != text:
        page.write_text(new, encoding="utf-8")
    return new != text


if __name__ == "__main__":  # make generate: python -m diagnoser.outputs.engines PAGE
    import sys

    target = Path(sys.argv[1] if len(sys.argv) > 1 else SUPPORT_PAGE)
    print(("wrote " if rewrite(target, Site.default()) else "unchanged: ") + str(target))
