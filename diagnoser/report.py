"""Render a diagnosis: text for a terminal at 3 a.m., Markdown for a ticket, JSON for tools."""

from __future__ import annotations

import json
import textwrap
import time
from typing import Any

from diagnoser.signals import SIGNALS

WIDTH = 96


def _clock(iso: str | None) -> str:
    return iso[11:16] + " UTC" if iso else "?"


def _value(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit == "s":
        return f"{v * 1000:.0f} ms" if abs(v) < 1 else f"{v:.2f} s"
    if unit == "ratio":
        return f"{v:.1%}" if abs(v) < 10 else f"{v:.1f}"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:.3g}"


def evidence_line(e: dict[str, Any]) -> str:
    unit = SIGNALS[e["signal"]].unit if e["signal"] in SIGNALS else ""
    name = e["signal"]
    if e.get("over"):
        name, unit = f"{name} / {e['over']}", ""
    if "baseline" in e and "now" in e:
        ratio = f" (x{e['ratio']:.1f})" if e.get("ratio") not in (None, 0) else ""
        text = f"{name} {_value(e['baseline'], unit)} -> {_value(e['now'], unit)}{ratio}"
    elif "share" in e:
        text = f"{e['signal']} at {_value(e.get('now'), unit)}, {e['share']:.0%} of the time"
    elif "corr" in e:
        text = f"{e['signal']} correlates {e['corr']:.2f}"
    elif "exponent" in e:
        text = f"{e['signal']} grows with exponent {e['exponent']:.2f}"
    elif "ratio" in e:
        text = f"{e['signal']} x{e['ratio']:.1f}"
    else:
        text = e["signal"]
    return text


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(
        " ".join(text.split()), WIDTH, initial_indent=indent, subsequent_indent=indent
    )


def _scope(s: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in s.items())


def text(doc: dict[str, Any], colour: bool = False) -> str:
    def c(code: str, s: str) -> str:
        return f"\033[{code}m{s}\033[0m" if colour else s

    w = doc["window"]
    out = [
        f"diagnose {_clock(w['start'])} - {_clock(w['end'])} ({w['start'][:10]}), baseline "
        f"{_clock(doc['baseline']['start'])} - {_clock(doc['baseline']['end'])}"
    ]
    findings = doc["findings"]
    if not findings:
        if doc["scopes"] and len(doc["idle"]) < len(doc["scopes"]):
            out.append(
                c(
                    "32",
                    "No known problem pattern matches: every checked playbook was "
                    "ruled out or did not match.",
                )
            )
        elif not doc["scopes"]:
            out.append(
                c(
                    "33",
                    "No vLLM series in the window: nothing to diagnose (check the "
                    "URL, the selectors, and that vLLM is scraped).",
                )
            )
    for idle in doc["idle"]:
        out.append(
            c(
                "33",
                f"{_scope(idle)}: no traffic in the window (fewer than one finished "
                "request per 100 s), so its latency and load patterns cannot be "
                "judged.",
            )
        )
    for i, f in enumerate(findings, 1):
        head = "LIKELY CAUSE" if i == 1 else "ALSO POSSIBLE"
        sev = c("31;1" if f["severity"] == "critical" else "33;1", f["severity"])
        out.append("")
        out.append(c("1", f"{i}. {head}: {f['title']}") + f"  [{f['id']}]")
        since = f"since {_clock(f['onset'])}" if f["onset"] else "through the window"
        expl = f"; a consequence of {f['explained_by']}" if f["explained_by"] else ""
        out.append(
            f"   {_scope(f['scope'])} | {since} | confidence {f['confidence']:.0%} | {sev}{expl}"
        )
        shown = [
            e for e in f["evidence"] if e["holds"] and e["group"] in ("all", "any", "supporting")
        ]
        if shown:
            out.append("   evidence: " + "; ".join(evidence_line(e) for e in shown[:6]))
        if i == 1:
            out += _wrap(f"cause: {f['cause']}", "   ")
            out.append("   fix:")
            for k, step in enumerate(f["fix"], 1):
                lines = _wrap(f"{k}. {step}", "     ")
                out += [lines[0], *("   " + ln for ln in lines[1:])]
            out += _wrap(f"guardrail: {f['guardrail'][0]}", "   ")
        else:
            out += _wrap(f"fix: {f['fix'][0]}", "   ")
        out.append(f"   runbook: {f['runbook']}")
        for caveat in f["caveats"]:
            out += _wrap(f"caveat: {caveat}", "   ")
        for h in f["hints"]:
            out.append(f"   hint: see also {h} (advisory)")
    ruled = doc["ruled_out"]
    undecided = doc["undecided"]
    out.append("")
    if ruled:
        out += _wrap("ruled out: " + "; ".join(f"{r['id']} ({r['reason']})" for r in ruled), "")
    if undecided:
        out += _wrap(
            "undecided (missing data is not health): "
            + "; ".join(
                f"{u['id']} needs {', '.join(u['missing']) or 'more samples'}"
                + (f" from {' / '.join(u['provided_by'])}" if u["provided_by"] else "")
                for u in undecided
            ),
            "",
        )
    stats = doc["stats"]
    out.append(f"{stats['queries']} queries, {stats['query_seconds']:.1f} s in Prometheus")
    return "\n".join(out) + "\n"


def markdown(doc: dict[str, Any]) -> str:
    w = doc["window"]
    out = [f"## Diagnosis {w['start']} - {w['end']}", ""]
    if not doc["findings"]:
        out.append("No known problem pattern matched.")
    for i, f in enumerate(doc["findings"], 1):
        out.append(f"### {i}. {f['title']} (`{f['id']}`)")
        out.append("")
        out.append(f"- **Scope:** {_scope(f['scope'])}")
        out.append(f"- **Since:** {f['onset'] or 'the start of the window'}")
        out.append(f"- **Confidence:** {f['confidence']:.0%} ({f['severity']})")
        if f["explained_by"]:
            out.append(f"- **Explained by:** `{f['explained_by']}`")
        for caveat in f["caveats"]:
            out.append(f"- **Caveat:** {caveat}")
        out.append("")
        out.append("| Evidence | Holds |")
        out.append("|---|---|")
        for e in f["evidence"]:
            out.append(f"| {evidence_line(e)} ({e['condition']}) | {e['holds']} |")
        out.append("")
        out.append(f"**Cause.** {' '.join(f['cause'].split())}")
        out.append("")
        out.append("**Fix.**")
        out += [f"{k}. {s}" for k, s in enumerate(f["fix"], 1)]
        out.append("")
        out.append("**Guardrail.** " + " ".join(f["guardrail"]))
        out.append("")
        out.append(f"Runbook: {f['runbook']}")
        out.append("")
    if doc["undecided"]:
        out.append("### Undecided")
        out += [
            f"- `{u['id']}`: needs {', '.join(u['missing']) or 'more samples'}"
            for u in doc["undecided"]
        ]
    return "\n".join(out) + "\n"


def as_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def generated_at() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def explain(result: Any, playbook_id: str) -> str:
    """One playbook's signature evaluated step by step, per scope, with the numbers."""
    matches = [
        m
        for m in (*result.findings, *result.undecided, *result.checked)
        if m.playbook.id == playbook_id
    ]
    if not matches:
        return (
            f"{playbook_id}: not evaluated: no scope with traffic in the window "
            f"(or, for a target-level playbook, no vLLM target matched)\n"
        )

    def clock(t: float | None) -> str:
        return time.strftime("%H:%M", time.gmtime(t)) if t is not None else "-"

    out = []
    for m in matches:
        p = m.periods
        status = {
            "matched": f"MATCHED, confidence {m.confidence:.0%}",
            "ruled_out": f"ruled out: {m.reason}",
            "undecided": f"undecided: {m.reason or 'missing series'}",
            "not_matched": f"not matched: {m.reason}",
        }[m.status]
        out.append(f"{playbook_id} for {_scope(m.scope)}: {status}")
        if m.explained_by:
            out.append(f"  explained by {m.explained_by} (its confidence halved)")
        for caveat in m.caveats:
            out.append(f"  caveat (confidence x0.75): {caveat}")
        if p is not None:
            onset = f"change at {clock(p.onset)} UTC" if p.onset else "no clear change point"
            out.append(
                f"  periods: baseline {clock(p.baseline[0])}-{clock(p.baseline[1])}, "
                f"now {clock(p.now[0])}-{clock(p.now[1])} UTC ({onset})"
            )
        for r in m.results:
            state = {True: "holds", False: "fails", None: "unknown"}[r.verdict.holds]
            nums = ", ".join(f"{k}={_short(v)}" for k, v in r.verdict.numbers.items())
            note = f" [{r.verdict.note}]" if r.verdict.note else ""
            missing = f" [no series: {', '.join(r.missing)}]" if r.missing else ""
            out.append(
                f"  {r.group:<10} {state:<7} {r.condition.describe():<58} {nums}{note}{missing}"
            )
        out.append("")
    return "\n".join(out)


def _short(v: float) -> str:
    if v != v or v in (float("inf"), float("-inf")):
        return str(v)
    return f"{v:.4g}"
