"""``--format html``: one self-contained page, each finding's evidence plotted over the window.

No scripts and no external files: the plots are inline SVG, so the page can be attached to an
incident ticket or opened from disk.
"""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

from diagnoser.diagnosis import Diagnosis
from diagnoser.report import _scope, _value, evidence_line
from diagnoser.signals import SIGNALS
from diagnoser.source import Series

W, H, PAD = 560, 120, 28

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1180px;color:#222}
h1{font-size:1.4em} h2{font-size:1.15em;margin-top:2em} .meta{color:#666}
.finding{border:1px solid #ddd;border-radius:6px;padding:1em 1.2em;margin:1em 0}
.top{border-color:#c0392b} .sev-critical{color:#c0392b;font-weight:600}
.sev-warning{color:#d35400;font-weight:600} .plots{display:flex;flex-wrap:wrap;gap:12px}
figure{margin:0} figcaption{font-size:12px;color:#444} svg{background:#fafafa}
table{border-collapse:collapse} td,th{padding:2px 8px;border-bottom:1px solid #eee;text-align:left}
"""


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
    series: Series, name: str, start: float, end: float, window_start: float, onset: float | None
) -> str:
    mask = (series.t >= start) & (series.t <= end) & np.isfinite(series.v)
    v = series.v[mask]
    if v.size == 0:
        return ""
    unit = SIGNALS[name].unit
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
    parts.append(f'<text x="2" y="12" font-size="10">{html.escape(_value(hi, unit))}</text>')
    parts.append(f'<text x="2" y="{H - 4}" font-size="10">{html.escape(_value(lo, unit))}</text>')
    parts.append("</svg>")
    return (
        f"<figure>{''.join(parts)}<figcaption>{html.escape(name)} ({unit}); shaded: the "
        f"window</figcaption></figure>"
    )


def render(d: Diagnosis, doc: dict[str, Any]) -> str:
    e = html.escape
    w = d.window
    start = min(w.baseline_start, w.start)
    body = [
        f"<h1>Diagnosis {e(doc['window']['start'])} to {e(doc['window']['end'])}</h1>",
        f"<p class=meta>Baseline {e(doc['baseline']['start'])} to "
        f"{e(doc['baseline']['end'])}; {doc['stats']['queries']} queries.</p>",
    ]
    if not doc["findings"]:
        body.append("<p>No known problem pattern matched.</p>")
    for i, (f, m) in enumerate(zip(doc["findings"], d.findings, strict=True), 1):
        scope_key = (
            ("model_name", m.scope["model_name"])
            if "model_name" in m.scope
            else ("target", m.scope.get("job", ""), m.scope.get("instance", ""))
        )
        data = d.series.get(scope_key)
        onset = m.periods.onset if m.periods else None
        figs = []
        if data is not None:
            for name in m.playbook.evidence:
                s = data.series.get(name)
                if s is not None:
                    figs.append(plot(s, name, start, w.end, w.start, onset))
        ev = "".join(
            f"<tr><td>{e(evidence_line(x))}</td><td>{e(x['condition'])}</td>"
            f"<td>{'yes' if x['holds'] else 'no'}</td></tr>"
            for x in f["evidence"]
        )
        fixes = "".join(f"<li>{e(s)}</li>" for s in f["fix"])
        body.append(
            f'<div class="finding{" top" if i == 1 else ""}"><h2>{i}. {e(f["title"])} '
            f"<code>{e(f['id'])}</code></h2><p>{e(_scope(f['scope']))} &middot; since "
            f"{e(f['onset'] or 'the start of the window')} &middot; confidence "
            f'{f["confidence"]:.0%} &middot; <span class="sev-{e(f["severity"])}">'
            f"{e(f['severity'])}</span>"
            + (
                f" &middot; explained by <code>{e(f['explained_by'])}</code>"
                if f["explained_by"]
                else ""
            )
            + "".join(f" &middot; caveat: {e(c)}" for c in f["caveats"])
            + f'</p><div class="plots">{"".join(figs)}</div><table><tr><th>Evidence</th>'
            f"<th>Condition</th><th>Holds</th></tr>{ev}</table><p><b>Cause.</b> "
            f"{e(f['cause'])}</p><p><b>Fix.</b></p><ol>{fixes}</ol><p><b>Guardrail.</b> "
            f'{e(" ".join(f["guardrail"]))}</p><p><a href="{e(f["runbook"])}">Runbook</a></p>'
            "</div>"
        )
    if doc["undecided"]:
        items = "".join(
            f"<li><code>{e(u['id'])}</code>: needs {e(', '.join(u['missing']))}</li>"
            for u in doc["undecided"]
        )
        body.append(f"<h2>Undecided (missing data is not health)</h2><ul>{items}</ul>")
    return (
        f"<!doctype html><html lang=en><meta charset=utf-8><title>servediag diagnosis"
        f"</title><style>{CSS}</style><body>{''.join(body)}</body></html>\n"
    )
