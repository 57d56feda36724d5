"""Formatting shared by every renderer: times, scopes, wrapped paragraphs, evidence lines,
health lines and onsets."""

from __future__ import annotations

import textwrap
import time

from diagnoser.diagnosis.health import UNHEALTHY_BURN, Health, Sli, describe
from diagnoser.diagnosis.match import Match
from diagnoser.diagnosis.model import Diagnosis
from diagnoser.plumbing.durations import format_duration
from diagnoser.plumbing.printable import printable

WIDTH = 96


def clock(t: float | None) -> str:
    """``14:32 UTC`` (or ``?``)."""
    return time.strftime("%H:%M UTC", time.gmtime(t)) if t is not None else "?"


def day(t: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(t))


def scope_text(s: dict[str, str]) -> str:
    """``model_name=llama, instance=...``: label values from Prometheus or an alert, with
    their control characters written as escapes (see ``plumbing.printable``)."""
    return ", ".join(f"{printable(k)}={printable(v)}" for k, v in s.items())


def wrap(text: str, indent: str, width: int = WIDTH) -> list[str]:
    """``text`` in lines of at most ``width`` characters. A word longer than a line (a label
    value of megabytes) is cut into lines here: ``textwrap`` cuts it by copying what is left
    of it for each line, which is quadratic in its length (6 MB took 18 s, 10 MB minutes)."""
    room = max(1, width - len(indent))
    words = text.split()
    if any(len(w) > room for w in words):
        words = [w[i : i + room] for w in words for i in range(0, len(w), room)]
    return textwrap.wrap(" ".join(words), width, initial_indent=indent, subsequent_indent=indent)


def evidence_lines(d: Diagnosis, m: Match, most: int) -> list[str]:
    """The conditions that held and point to the cause, in words, at most ``most``."""
    texts = dict.fromkeys(d.evidence_text(r) for r in m.held())  # one line per fact
    return list(texts)[:most]


def needs(m: Match) -> str:
    """Why a playbook stayed undecided: the series it lacks, or else what its verdicts said
    (too few samples, a window too short for the shape)."""
    if m.missing:
        return f"needs {', '.join(m.missing)}"
    return f"({m.reason})" if m.reason else "needs more samples"


def since(d: Diagnosis, m: Match) -> str:
    """When the finding began, as it is: inside the window, before it, or not known."""
    if m.onset is None:
        if m.basis == "absolute":
            return "abnormal through the window (no change found in the lookback)"
        return "through the window"
    if m.onset < d.window.start:
        ago = format_duration(d.window.start - m.onset)
        return f"began {clock(m.onset)}, {ago} before the window"
    return f"since {clock(m.onset)}"


def hours(m: Match) -> str:
    """When a finding that ended held: ``17:52-17:59 UTC`` (``until 17:59 UTC`` when its
    onset is not known)."""
    end = time.strftime("%H:%M", time.gmtime(m.end)) if m.end is not None else "?"
    if m.onset is None:
        return f"until {end} UTC"
    return f"{time.strftime('%H:%M', time.gmtime(m.onset))}-{end} UTC"


def span(m: Match) -> str:
    """A finding that ended in the window, as on-call reads it: ``17:52-17:59 UTC, 7 min``."""
    if m.onset is None or m.end is None:
        return hours(m)
    return f"{hours(m)}, {format_duration(m.end - m.onset)}"


def resolved_head(m: Match) -> str:
    """``batch-slot-limit: 17:52-17:59 UTC, 7 min, resolved``"""
    return f"{m.playbook.id}: {span(m)}, resolved"


NO_CURRENT_CAUSE = "No current cause: the incidents below ended in the window."
NOTHING_MATCHED = (
    "No known problem pattern matches: every checked playbook was ruled out or did not match."
)
NO_SERIES = (
    "No vLLM series in the window: nothing to diagnose (check the URL, the selectors, and "
    "that vLLM is scraped)."
)


def unexplained(d: Diagnosis) -> list[Health]:
    """The unhealthy scopes with no finding, current or ended in the window, to explain them."""
    return [
        h
        for h in d.health
        if h.verdict == "unhealthy" and not d.findings_for(h.scope) and not d.resolved_for(h.scope)
    ]


def nothing_found(d: Diagnosis) -> str | None:
    """What every report says of a diagnosis that found nothing (no finding, none ended in the
    window, no unhealthy scope left unexplained): ``NOTHING_MATCHED`` where some scope had
    traffic to judge, ``NO_SERIES`` where no scope had a series at all (missing data is not
    health). None where something was found, or every scope was idle (each says so:
    ``idle_line``)."""
    if d.findings or d.resolved or unexplained(d):
        return None
    if not d.scopes:
        return NO_SERIES
    return NOTHING_MATCHED if len(d.idle) < len(d.scopes) else None


def idle_line(scope: dict[str, str]) -> str:
    return (
        f"{scope_text(scope)}: no traffic in the window (fewer than one finished request per "
        "100 s), so its latency and load patterns cannot be judged."
    )


def ended_before_line(d: Diagnosis) -> str | None:
    """``Ended just before the window: prefix-cache-collapse (17:31-17:40 UTC).`` (None when
    no incident ended before it); each incident's scope is named when there are several."""
    if not d.ended_before:
        return None
    several = len({tuple(sorted(m.scope.items())) for m in d.ended_before}) > 1 or (
        len(d.scopes) > 1
    )
    parts = []
    for m in d.ended_before:
        where = f" on {scope_text(m.scope)}" if several and m.scope else ""
        parts.append(f"{m.playbook.id}{where} ({hours(m)})")
    return f"Ended just before the window: {'; '.join(parts)}."


def _sli(s: Sli) -> str:
    """An SLI's reading as the health line gives it, with its objective when read; where the
    window's end and the whole window disagree on the SLO (an incident that ended, or one
    that began in its last minutes), the reading at the end first, the window's beside it."""
    words = describe(s, terse=True)
    if s.good is None:
        return words
    burns = [b is not None and b >= UNHEALTHY_BURN for b in (s.burn_now, s.burn)]
    if s.now is not None and burns[0] != burns[1]:
        words = f"{describe(s, terse=True, now=True)} now, {s.good:.1%} over the window"
    return f"{words} (SLO {percent(s.objective)})"


def percent(share: float) -> str:
    """0.999 -> ``99.9%``, 0.99 -> ``99%``."""
    return f"{share * 100:.3f}".rstrip("0").rstrip(".") + "%"


def health_line(h: Health) -> str:
    """``unhealthy | 2.39 req/s | available 100.00% (objective 0.999) | ...``"""
    parts = [h.verdict.upper() if h.verdict == "unhealthy" else h.verdict]
    if h.request_rate is not None:
        parts.append(f"{h.request_rate:.3g} req/s")
    parts += [_sli(s) for s in h.slis if s.good is not None]
    if h.finished_abort_share:
        parts.append(f"aborted {h.finished_abort_share:.1%}")
    if h.targets_gone_at is not None:
        parts.append("no targets")
    elif h.targets_total is not None:
        up = h.targets_total - (h.targets_down or 0)
        parts.append(f"targets {up}/{h.targets_total} up")
    if h.notes:
        parts += h.notes
    elif h.restarts:
        parts.append(f"{h.restarts} restart(s)")
    if h.platform and not any(h.platform in n for n in h.notes):
        parts.append(f"down: {h.platform}")  # why, as the platform says it
    return " | ".join(parts)
