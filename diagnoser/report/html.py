"""``--format html``: one self-contained page, each finding's evidence plotted over the window.

No scripts and no external files: the plots are inline SVG, so the page can be attached to an
incident ticket or opened from disk. The page is ``templates/report.html.j2``, rendered by
jinja2 with autoescape on: every value is escaped where the template places it. Behind the
escaping, the page's Content-Security-Policy (``POLICY``) lets a browser run no script, load
nothing and apply no style but the page's own stylesheet, whatever a value might hold.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

import jinja2
import numpy as np
from markupsafe import Markup

from diagnoser.diagnosis.match import Match
from diagnoser.diagnosis.model import Diagnosis
from diagnoser.plumbing.durations import iso
from diagnoser.plumbing.source import Series
from diagnoser.plumbing.units import fmt
from diagnoser.report.format import (
    NO_CURRENT_CAUSE,
    NO_SERIES,
    ended_before_line,
    health_line,
    needs,
    nothing_found,
    scope_text,
    since,
    span,
    unexplained,
)

W, H, PAD = 560, 120, 28

# A word longer than the page is broken where it reaches the edge (``overflow-wrap``): a label
# value of thousands of letters would make the page as wide as it is long. The health table's
# columns are set (``table-layout:fixed``), so that such a value in the first cannot squeeze
# the state beside it into a letter a line.
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1180px;color:#222;
overflow-wrap:anywhere}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:2em} .meta{color:#666}
.finding{border:1px solid #ddd;border-radius:6px;padding:1em 1.2em;margin:1em 0}
.resolved{border-style:dashed}
.top{border-color:#c0392b} .sev-critical{color:#c0392b;font-weight:600}
.sev-warning{color:#d35400;font-weight:600} .plots{display:flex;flex-wrap:wrap;gap:12px}
.v-unhealthy{color:#c0392b;font-weight:600} .v-healthy{color:#1e8449}
figure{margin:0} figcaption{font-size:12px;color:#444} svg{background:#fafafa}
table{border-collapse:collapse} td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
.health{table-layout:fixed;width:100%} .health th:first-child{width:35%}
.health td{vertical-align:top}
"""

# The page's own stylesheet is the only style it may apply (by its hash: a ``<style>`` or a
# ``style`` attribute made from a value would be refused), and nothing may be run, fetched,
# framed or submitted, nor may relative links be redirected (``base-uri``). A meta policy
# holds for what follows it: the template places it first after the charset.
POLICY = (
    "default-src 'none'; "
    f"style-src 'sha256-{base64.b64encode(hashlib.sha256(CSS.encode()).digest()).decode()}'; "
    "base-uri 'none'; form-action 'none'"
)


def runbook_link(url: str) -> bool:
    """Whether the runbook's URL may be a link: http(s) only (a ``javascript:`` URL from a
    site config runs a script when clicked); any other is shown as text."""
    return urlsplit(url.strip()).scheme.lower() in ("http", "https")


def _path(t: np.ndarray, v: np.ndarray, x0: float, x1: float, lo: float, hi: float) -> str:
    pts = []
    for ti, vi in zip(t, v, strict=True):
        if not math.isfinite(vi) or ti < x0 or ti > x1:
            continue
        x = PAD + (ti - x0) / (x1 - x0) * (W - 2 * PAD)
        y = H - PAD / 2 - (vi - lo) / (hi - lo or 1) * (H - PAD)
        pts.append(f"{x:.1f},{y:.1f}")
    return " ".join(pts)


def plot(
    series: Series,
    name: str,
    unit: str,
    start: float,
    end: float,
    window_start: float,
    onset: float | None,
    ended: float | None = None,
) -> dict[str, Any] | None:
    """One evidence plot's geometry and labels for the template (None: nothing to plot)."""
    mask = (series.t >= start) & (series.t <= end) & np.isfinite(series.v)
    v = series.v[mask]
    if v.size == 0:
        return None
    lo, hi = float(min(0.0, v.min())), float(v.max()) or 1.0

    def xpos(t: float) -> float:
        return PAD + (t - start) / (end - start) * (W - 2 * PAD)

    shade = xpos(window_start)
    return {
        "width": W,
        "height": H,
        "name": name,
        "unit": unit,
        "shade_x": shade,
        "shade_w": W - PAD - shade,
        "points": _path(series.t, series.v, start, end, lo, hi),
        "onset_x": xpos(onset) if onset is not None and start <= onset <= end else None,
        "end_x": xpos(ended) if ended is not None and start <= ended <= end else None,
        "top": fmt(hi, unit),
        "bottom": fmt(lo, unit),
    }


@functools.cache
def _template() -> jinja2.Template:
    """The page's template, each line stripped and the lines joined (the page is one line,
    as it was when it was written by hand; see the template's head)."""
    source = resources.files("diagnoser.report").joinpath("templates/report.html.j2")
    text = "".join(line.strip() for line in source.read_text(encoding="utf-8").splitlines())
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(text)


def render(d: Diagnosis) -> str:
    w = d.window
    causeless = [h for h in d.health if h.verdict == "unhealthy" and not d.findings_for(h.scope)]
    quiet = nothing_found(d)
    findings = [_finding(d, m) for m in d.findings]
    resolved = [
        {**_finding(d, m), "span": span(m), "resolved_at": str(iso(m.end))} for m in d.resolved
    ]
    page = _template().render(
        css=Markup(CSS),
        policy=POLICY,
        start=str(iso(w.start)),
        end=str(iso(w.end)),
        baseline_start=str(iso(w.baseline_start)),
        baseline_end=str(iso(w.baseline_end)),
        queries=d.queries,
        warnings=d.warnings,
        health=[
            {"scope": scope_text(h.scope), "verdict": h.verdict, "line": health_line(h)}
            for h in d.health
        ],
        unexplained=[
            {
                "scope": scope_text(h.scope),
                "reasons": "; ".join(h.reasons),
                "nearest": [
                    {
                        "id": m.playbook.id,
                        "why": (
                            f"{f.condition.describe()} does not hold ({d.evidence_text(f)})"
                            if f
                            else m.reason
                        ),
                    }
                    for m, f in d.nearest(h.scope)
                ],
            }
            for h in unexplained(d)
        ],
        findings=findings,
        resolved=resolved,
        first_resolved=len(findings) + 1,
        no_current_cause=NO_CURRENT_CAUSE if resolved and not findings else None,
        nothing_found=quiet,
        no_series=quiet == NO_SERIES,
        ended_sick=[scope_text(h.scope) for h in causeless if d.resolved_for(h.scope)]
        if findings
        else [],
        ended_before=ended_before_line(d),
        undecided=[
            {"id": u.playbook.id, "needs": needs(u), "gap": d.engine_gap(u)} for u in d.undecided
        ],
    )
    return page + "\n"


def _finding(d: Diagnosis, m: Match) -> dict[str, Any]:
    """A finding's part of the page: its plots (the onset marked, and its end when it ended
    in the window), its evidence, cause, fix and runbook."""
    w = d.window
    pb = m.playbook
    data = d.data_for(m)
    plots = []
    if data is not None:
        for name in pb.evidence:
            s = data.series.get(name)
            if s is not None:
                p = plot(s, name, d.unit(name), w.first, w.end, w.start, m.onset, m.end)
                if p is not None:
                    plots.append(p)
    url = d.runbook(m)
    return {
        "id": pb.id,
        "title": pb.title,
        "scope": scope_text(m.scope),
        "since": since(d, m),
        "confidence": f"{m.confidence:.0%}",
        "severity": pb.severity,
        "explained_by": m.explained_by,
        "caveats": m.caveats,
        "plots": plots,
        "evidence": [
            {
                "text": d.evidence_text(r),
                "condition": r.condition.describe(),
                "holds": "yes" if r.verdict.holds else "no",
            }
            for r in m.shown()
        ],
        "cause": pb.cause,
        "fix": list(pb.fix),
        "guardrail": " ".join(pb.guardrail),
        "runbook": url,
        "runbook_is_link": runbook_link(url),
    }
