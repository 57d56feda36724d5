"""``--format html``: one self-contained page, each finding's evidence plotted over the window.

No scripts and no external files: the plots are inline SVG, so the page can be attached to an
incident ticket or opened from disk.
"""

from __future__ import annotations

import html
import math
from urllib.parse import urlsplit

import numpy as np

from diagnoser.core.source import Series
from diagnoser.core.units import fmt
from diagnoser.diagnose.model import Diagnosis, iso
from diagnoser.report.format import health_line, needs, scope_text, since

W, H, PAD = 560, 120, 28

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1180px;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:2em} .meta{color:#666}
.finding{border:1px solid #ddd;border-radius:6px;padding:1em 1.2em;margin:1em 0}
.top{border-color:#c0392b} .sev-critical{color:#c0392b;font-weight:600}
.sev-warning{color:#d35400;font-weight:600} .plots{display:flex;flex-wrap:wrap;gap:12px}
.v-unhealthy{color:#c0392b;font-weight:600} .v-healthy{color:#1e8449}
figure{margin:0} figcaption{font-size:12px;color:#444} svg{background:#fafafa}
table{border-collapse:collapse} td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
"""


def runbook_link(url: str) -> str:
    """The runbook as a link when its URL is http(s); any other scheme (``javascript:`` runs
    a script when clicked) is shown as text."""
    if urlsplit(url.strip()).scheme.lower() in ("http", "https"):
        return f'<a href="{html.escape(url)}">Runbook</a>'
    return f"Runbook: {html.escape(url)}"


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
) -> str:
    mask = (series.t >= start) & (series.t <= end) & np.isfinite(series.v)
    v = series.v[mask]
    if v.size == 0:
        return ""
    lo, hi = float(min(0.0, v.min())), float(v.max()) or 1.0

    def xpos(t: float) -> float:
        return PAD + (t - start) / (end - start) * (W - 2 * PAD)

    parts = [
        f'<svg width="{W}" height="{H}" role="img" aria-label="{name}">',
        f'<rect x="{xpos(window_start):.1f}" y="0" width="{W - PAD - xpos(window_start):.1f}"'
        f' height="{H}" fill="#eef4fb"/>',
        f'<polyline fill="none" stroke="#2c6fbb" stroke-width="1.5" '
        f'points="{_path(series.t, series.v, start, end, lo, hi)}"/>',
    ]
    if onset is not None and start <= onset <= end:
        x = xpos(onset)
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="0" y2="{H}" stroke="#c0392b" '
            f'stroke-dasharray="4 3"/><text x="{x + 3:.1f}" y="12" font-size="10" '
            f'fill="#c0392b">onset</text>'
        )
    parts.append(f'<text x="2" y="12" font-size="10">{html.escape(fmt(hi, unit))}</text>')
    parts.append(f'<text x="2" y="{H - 4}" font-size="10">{html.escape(fmt(lo, unit))}</text>')
    parts.append("</svg>")
    return (
        f"<figure>{''.join(parts)}<figcaption>{html.escape(name)} ({unit}); shaded: the "
        f"window</figcaption></figure>"
    )


def render(d: Diagnosis) -> str:
    e = html.escape
    w = d.window
    start = w.first
    body = [
        f"<h1>Diagnosis {e(str(iso(w.start)))} to {e(str(iso(w.end)))}</h1>",
        f"<p class=meta>Baseline {e(str(iso(w.baseline_start)))} to "
        f"{e(str(iso(w.baseline_end)))}; {d.queries} queries.</p>",
    ]
    if d.warnings:
        body.append(f"<p><strong>Partial answer:</strong> {e('; '.join(d.warnings))}</p>")
    if d.health:
        rows = "".join(
            f'<tr><td>{e(scope_text(h.scope))}</td><td class="v-{e(h.verdict)}">'
            f"{e(health_line(h))}</td></tr>"
            for h in d.health
        )
        body.append(f"<table><tr><th>Model</th><th>State</th></tr>{rows}</table>")
    unexplained = [h for h in d.health if h.verdict == "unhealthy" and not d.findings_for(h.scope)]
    for h in unexplained:
        near = "".join(
            f"<li><code>{e(m.playbook.id)}</code>: "
            + e(f"{f.condition.describe()} does not hold ({d.evidence_text(f)})" if f else m.reason)
            + "</li>"
            for m, f in d.nearest(h.scope)
        )
        body.append(
            f'<div class="finding top"><h2>{e(scope_text(h.scope))} is unhealthy and no known '
            f"problem pattern explains it</h2><p>{e('; '.join(h.reasons))}.</p>"
            + (f"<p>Nearest playbooks:</p><ul>{near}</ul>" if near else "")
            + "</div>"
        )
    if not d.findings and not unexplained:
        body.append("<p>No known problem pattern matched.</p>")
    for i, m in enumerate(d.findings, 1):
        pb = m.playbook
        data = d.data_for(m)
        figs = []
        if data is not None:
            for name in pb.evidence:
                s = data.series.get(name)
                if s is not None:
                    figs.append(plot(s, name, d.unit(name), start, w.end, w.start, m.onset))
        ev = "".join(
            f"<tr><td>{e(d.evidence_text(r))}</td><td>{e(r.condition.describe())}</td>"
            f"<td>{'yes' if r.verdict.holds else 'no'}</td></tr>"
            for r in m.shown()
        )
        fixes = "".join(f"<li>{e(s)}</li>" for s in pb.fix)
        body.append(
            f'<div class="finding{" top" if i == 1 else ""}"><h2>{i}. {e(pb.title)} '
            f"<code>{e(pb.id)}</code></h2><p>{e(scope_text(m.scope))} &middot; "
            f"{e(since(d, m))} &middot; confidence "
            f'{m.confidence:.0%} &middot; <span class="sev-{e(pb.severity)}">'
            f"{e(pb.severity)}</span>"
            + (f" &middot; explained by <code>{e(m.explained_by)}</code>" if m.explained_by else "")
            + "".join(f" &middot; caveat: {e(c)}" for c in m.caveats)
            + f'</p><div class="plots">{"".join(figs)}</div><table><tr><th>Evidence</th>'
            f"<th>Condition</th><th>Holds</th></tr>{ev}</table><p><b>Cause.</b> "
            f"{e(pb.cause)}</p><p><b>Fix.</b></p><ol>{fixes}</ol><p><b>Guardrail.</b> "
            f"{e(' '.join(pb.guardrail))}</p><p>{runbook_link(d.runbook(m))}</p>"
            "</div>"
        )
    if d.undecided:
        items = "".join(
            f"<li><code>{e(u.playbook.id)}</code>: {e(needs(u))}"
            + (f" ({e(d.engine_gap(u))})" if d.engine_gap(u) else "")
            + "</li>"
            for u in d.undecided
        )
        body.append(f"<h2>Undecided (missing data is not health)</h2><ul>{items}</ul>")
    return (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>servediag diagnosis"
        f"</title><style>{CSS}</style><body>{''.join(body)}</body></html>\n"
    )
