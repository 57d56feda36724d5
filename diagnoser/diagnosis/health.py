"""Each model's state before any cause: traffic, errors, SLO attainment against the site's
objectives, targets down, restarts; and a verdict that is never the healthy one while any of
them is wrong.

Numbers are over the diagnosis window, from the series already fetched: shares are weighted by
the traffic they are shares of (requests, HTTP requests, output tokens), so a quiet minute
counts less than a busy one. A burn rate is the window's bad share over the share the
objective allows (1 spends the error budget exactly as fast as it lasts the SLO period).

The verdict is the state at the window's end: each SLI is read over the window and over its
last minutes (``present``), and the present's decides where it has requests enough, so a
window that holds an incident and its recovery says the service is healthy now, with the
window's attainment beside it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from diagnoser.catalog.shapes.base import episodes, events, whole
from diagnoser.diagnosis.availability import all_down, available, probe_errors, step_of
from diagnoser.diagnosis.match import ScopeData
from diagnoser.diagnosis.platform import NEVER_UNREAD, UNREAD
from diagnoser.site import Site

IDLE_RPS = 0.01  # finished requests per second below which a model counts as idle
UNHEALTHY_BURN = 2.0  # a burn rate from which the budget lasts under half the SLO period
MIN_EVENTS = 30.0  # fewer requests in the window and a burn rate is not judged
DOWN_SHARE = 0.05  # of the window with a target down
# A single restart takes its target down while the model loads: one stretch of downtime up to
# this long, with the model's only restart in the window, is that restart's (a deploy, or one
# crash the server came back from), not a reason of its own while the SLOs hold. Longer, and
# the target-down alert (for: 2m) fires: a symptom, and a reason.
RESTART_DOWNTIME = 120.0
# Seconds (or steps, whichever is longer) between a model's last target sample and the
# window's end after which its targets are gone, not late: a slow scrape and a query step.
GONE_AFTER, GONE_STEPS = 120.0, 4
STOPPED_TAIL = 600.0  # seconds at the end of the window with nothing finished: traffic stopped
# The present: the window's last quarter, five minutes at most, and two rate windows at least
# (a rate window's samples all come from its own minutes), never more than the window.
PRESENT_SHARE, PRESENT_MAX, PRESENT_RATES = 0.25, 300.0, 2


def present(window: tuple[float, float], smoothing: float) -> tuple[float, float]:
    """The last minutes of ``window`` that say how the service is now."""
    length = window[1] - window[0]
    span = max(PRESENT_RATES * smoothing, min(PRESENT_MAX, PRESENT_SHARE * length))
    return (window[1] - min(length, span), window[1])


@dataclass
class Sli:
    name: str  # availability | ttft | itl
    good: float | None  # share of good events over the window
    objective: float
    threshold: float | None = None  # seconds, for the latency SLIs
    # The bucket bounds the share was read at where the threshold is not one of the
    # servers' bounds (the largest below it); empty where it is.
    read_at: tuple[float, ...] = ()
    now: float | None = None  # share of good events over the present (the window's end)

    @property
    def burn(self) -> float | None:
        return self._burn(self.good)

    @property
    def burn_now(self) -> float | None:
        return self._burn(self.now)

    def _burn(self, good: float | None) -> float | None:
        if good is None:
            return None
        return (1 - good) / max(1e-12, 1 - self.objective)


def _off(site: Site, family: str, threshold: float) -> tuple[float, ...]:
    """The bounds a threshold's share is read at, where the threshold is not one of them."""
    at = site.read_at(family, threshold)
    return () if all(math.isclose(a, threshold, rel_tol=1e-9) for a in at) else at


@dataclass
class Health:
    scope: dict[str, str]
    verdict: str = "unknown"  # healthy | unhealthy | idle | unknown
    request_rate: float | None = None
    peak_rate: float = 0.0
    error_share: float | None = None  # 5xx and finished_reason="error", of inference requests
    http_5xx_share: float | None = None
    finished_error_share: float | None = None
    finished_abort_share: float | None = None
    slis: list[Sli] = field(default_factory=list)
    targets_total: int | None = None
    targets_down: int | None = None  # at the end of the window
    down_since: float | None = None  # when the targets down at the end went down (or None)
    targets_gone_at: float | None = None  # the last scrape of any of its targets, if long ago
    down_share: float | None = None  # of the window with any target down
    down_seconds: float = 0.0  # how long any target was down in the window
    down_episodes: int = 0  # separate stretches of it
    restarts: int = 0  # distinct restarts (separate rises of the restart count)
    # The synthetic probe's failed share outside the time every target was down (None: no
    # probe runs): counted in the availability SLI where it saw more fail than the servers.
    probe_error_share: float | None = None
    # Of the window, the share with every target of the model down: no request could be
    # served, which the availability SLI counts as unavailable time.
    all_down_share: float | None = None
    # Of its targets, those a rollout's new pods that never served (``run._heirs``): counted
    # as its own, so the time none of its targets answers is unavailable.
    never_served: int = 0
    # Why its servers went down, as the platform says it (``diagnosis.platform``); None where
    # nothing went down or nothing of the platform is scraped.
    platform: str | None = None
    stopped_at: float | None = None  # traffic stopped (it served before, not in the window)
    present: tuple[float, float] | None = None  # the window's last minutes, the state now
    present_rate: float | None = None  # requests per second over them
    calm_now: bool = False  # no target down and no restart counted over the present
    reasons: list[str] = field(default_factory=list)
    # What was seen but is no reason for concern (a single restart with the SLOs met).
    notes: list[str] = field(default_factory=list)

    @property
    def single_restart(self) -> bool:
        """One restart, and any downtime one stretch short enough to be its model load: a
        deploy or a single crash the server came back from, not a loop. Not where the platform
        says why it went down (an OOM kill is no deploy: its downtime counts)."""
        return (
            self.platform is None
            and self.restarts == 1
            and not self.targets_down
            and self.down_episodes <= 1
            and self.down_seconds <= RESTART_DOWNTIME
        )

    @property
    def judged(self) -> bool:
        return self.verdict in ("healthy", "unhealthy")


def _inside(data: ScopeData, name: str, span: tuple[float, float]) -> np.ndarray | None:
    s = data.series.get(name)
    if s is None:
        return None
    out: np.ndarray = s.v[(s.t >= span[0]) & (s.t <= span[1])]
    return out


def _down_since(data: ScopeData, span: tuple[float, float]) -> float | None:
    """When the stretch of downtime that lasts to the window's end began (None: all along)."""
    s = data.series["targets_down"]
    inside = (s.t >= span[0]) & (s.t <= span[1])
    t, v = s.t[inside], np.nan_to_num(s.v[inside])
    up = np.flatnonzero(v < v[-1])
    return float(t[up[-1] + 1]) if up.size else None


def _gone(data: ScopeData, span: tuple[float, float]) -> float | None:
    """The last scrape of any of the model's targets, when every one of them left service
    discovery well before the window's end (a deleted pod's series end; a down target's go on
    with ``up`` 0)."""
    s = data.series["targets_total"]
    seen = s.t[np.isfinite(s.v) & (s.v > 0)]
    late = max(GONE_AFTER, GONE_STEPS * step_of(data, "targets_total"))
    if not seen.size or seen[-1] < span[0] or span[1] - seen[-1] <= late:
        return None
    return float(seen[-1])


def _weighted(data: ScopeData, share: str, weight: str, span: tuple[float, float]) -> float | None:
    """The window's share: the samples of ``share`` weighted by those of ``weight``."""
    s, w = data.series.get(share), data.series.get(weight)
    if s is None or w is None:
        return None
    common, ia, ib = np.intersect1d(s.t, w.t, return_indices=True)
    keep = (common >= span[0]) & (common <= span[1])
    sv, wv = s.v[ia][keep], w.v[ib][keep]
    ok = np.isfinite(sv) & np.isfinite(wv) & (wv > 0)
    if not ok.any():
        return None
    return float(np.sum(sv[ok] * wv[ok]) / np.sum(wv[ok]))


def _mean(values: np.ndarray | None) -> float | None:
    if values is None:
        return None
    v = values[np.isfinite(values)]
    return float(v.mean()) if v.size else None


def went_down(data: ScopeData, window: tuple[float, float]) -> bool:
    """Whether a target of the scope was down or restarted in ``window``: the platform is
    asked why only then."""
    for name in ("targets_down", "engine_restarts"):
        v = _inside(data, name, window)
        if v is not None and np.nan_to_num(v).any():
            return True
    return _gone(data, window) is not None if "targets_total" in data.series else False


def assess(
    site: Site,
    data: ScopeData,
    window: tuple[float, float],
    before: tuple[float, float],
    platform: str | None = None,
    never_served: int = 0,
) -> Health:
    """The scope's state over ``window``; ``before`` is a period it may have served in;
    ``platform`` the platform's reason its servers went down, where it says one;
    ``never_served`` of its targets (in ``data``'s) are new pods that never served."""
    h = Health(dict(data.scope), platform=platform, never_served=never_served)
    objectives = site.config.slo.for_labels(data.scope)
    rate = _inside(data, "request_rate", window)
    h.request_rate = _mean(rate)
    h.peak_rate = float(np.nanmax(rate, initial=0.0)) if rate is not None and rate.size else 0.0
    h.http_5xx_share = _weighted(data, "http_5xx_share", "http_request_rate", window)
    h.finished_error_share = _weighted(data, "finished_error_share", "request_rate", window)
    h.finished_abort_share = _weighted(data, "finished_abort_share", "request_rate", window)
    parts = [p for p in (h.http_5xx_share, h.finished_error_share) if p is not None]
    h.error_share = min(1.0, sum(parts)) if parts else None
    h.slis = [
        Sli(
            "availability",
            None if h.error_share is None else 1 - h.error_share,
            objectives.availability,
        ),
        Sli(
            "ttft",
            _weighted(data, "ttft_slo_attainment", "request_rate", window),
            objectives.ttft,
            objectives.ttft_seconds,
            _off(site, "time_to_first_token", objectives.ttft_seconds),
        ),
        Sli(
            "itl",
            _weighted(data, "itl_slo_attainment", "generation_tokens_rate", window),
            objectives.itl,
            objectives.itl_seconds,
            _off(site, "inter_token_latency", objectives.itl_seconds),
        ),
    ]
    h.present = now = present(window, data.smoothing)
    h.present_rate = _mean(_inside(data, "request_rate", now))
    errors = [
        _weighted(data, "http_5xx_share", "http_request_rate", now),
        _weighted(data, "finished_error_share", "request_rate", now),
    ]
    known = [e for e in errors if e is not None]
    h.slis[0].now = 1 - min(1.0, sum(known)) if known else None
    h.slis[1].now = _weighted(data, "ttft_slo_attainment", "request_rate", now)
    h.slis[2].now = _weighted(data, "itl_slo_attainment", "generation_tokens_rate", now)
    total = _inside(data, "targets_total", window)
    down = _inside(data, "targets_down", window)
    if total is not None and total.size:
        # With a rollout's new pods: those at the end (the pods they replaced are gone).
        most = np.nan_to_num(total[-1:]) if never_served else total
        h.targets_total = whole(float(np.nanmax(most, initial=0.0)))
        h.targets_down = whole(float(down[-1])) if down is not None and down.size else 0
        h.down_since = _down_since(data, window) if h.targets_down else None
        h.down_share = float(np.mean(np.nan_to_num(down) > 0)) if down is not None else 0.0
        h.targets_gone_at = _gone(data, window)
        if down is not None:
            h.down_episodes = episodes(down)
            h.down_seconds = float(np.sum(np.nan_to_num(down) > 0)) * step_of(data, "targets_down")
    restarts = _inside(data, "engine_restarts", window)
    h.restarts = events(restarts) if restarts is not None else 0
    # Time with every target down is unavailable; a single restart's load is not (the note
    # below says it), as long as it stays one short stretch.
    h.all_down_share = 0.0 if h.single_restart else all_down(data, window)
    h.probe_error_share = probe_errors(data, window)
    h.slis[0].good = available(h.error_share, h.all_down_share, h.probe_error_share)
    all_down_now = 0.0 if h.single_restart else all_down(data, now)
    errors_now = None if h.slis[0].now is None else 1 - h.slis[0].now
    h.slis[0].now = available(errors_now, all_down_now, probe_errors(data, now))
    # Calm at the end: no target down and no restart counted over the present (a restart
    # stays counted five minutes): downtime and restarts earlier in the window are then what
    # the window went through, said beside a verdict on the state at its end.
    down_now, restarts_now = (
        _inside(data, "targets_down", now),
        _inside(data, "engine_restarts", now),
    )
    h.calm_now = not (down_now is not None and np.nan_to_num(down_now).any()) and not (
        restarts_now is not None and events(restarts_now)
    )
    h.stopped_at = _stopped(data, window, before)
    _verdict(h, window[1] - window[0])
    return h


def _stopped(
    data: ScopeData, window: tuple[float, float], before: tuple[float, float]
) -> float | None:
    """When the traffic stopped: nothing finished at the end of the window (its last tenth,
    ten minutes at least) after real traffic before (ten times the idle rate); else None."""
    s = data.series.get("request_rate")
    if s is None:
        return None
    tail_start = window[1] - max(STOPPED_TAIL, 0.1 * (window[1] - window[0]))
    tail = s.v[(s.t >= tail_start) & (s.t <= window[1])]
    if tail.size == 0 or np.nanmax(tail, initial=0.0) > IDLE_RPS:
        return None
    earlier = (s.t >= before[0]) & (s.t < tail_start) & (np.nan_to_num(s.v) > IDLE_RPS)
    if not earlier.any() or np.nanmax(s.v[earlier], initial=0.0) < 10 * IDLE_RPS:
        return None
    return float(s.t[earlier][-1])


def _verdict(h: Health, seconds: float) -> None:
    reasons = h.reasons
    downtime = ""
    if h.targets_gone_at is not None:
        when = time.strftime("%H:%M UTC", time.gmtime(h.targets_gone_at))
        reasons.append(
            f"no scrape target since {when}: every target that served it left service "
            "discovery (pods replaced by new ones that never served, a scale to zero, or a "
            "relabelling)"
        )
    elif h.targets_down:
        since = (
            f" since {time.strftime('%H:%M UTC', time.gmtime(h.down_since))}"
            if h.down_since is not None
            else " all through the window"
        )
        if h.never_served:
            after = (
                f"{min(h.never_served, h.targets_down)} of them a rollout's new pods that never "
                f"served: {h.platform or NEVER_UNREAD}"
            )
        else:
            after = "after serving: " + (
                h.platform
                or "a crash or kill with no restart, or a restart that fails to start (the "
                f"server's log and exit status tell which; {UNREAD})"
            )
        reasons.append(f"{h.targets_down} of {h.targets_total} target(s) down{since}, {after}")
    elif h.down_share is not None and h.down_share >= DOWN_SHARE:
        downtime = f"a target was down {h.down_share:.0%} of the window"
        if h.platform and h.restarts < 2:  # (two or more: the restarts say it below)
            downtime += f": {h.platform}"
        if h.calm_now and not h.single_restart:
            h.notes.append(f"{downtime}, none at its end")
        elif not h.single_restart:
            reasons.append(downtime)
    if h.restarts >= 2:
        said = f"{h.restarts} restarts in the window"
        if h.platform and not h.targets_down:
            said += f": {h.platform}"
        if h.calm_now:
            h.notes.append(f"{said}, none at its end")
        else:
            reasons.append(said)
    if h.platform and not any(h.platform in said for said in (*reasons, *h.notes)):
        # Downtime too short to be a reason of its own, or a target that left service
        # discovery at once (an evicted pod, replaced elsewhere): the platform says why.
        if h.down_seconds:
            how = f"a target was down {h.down_seconds:.0f} s"
        elif h.restarts:
            how = "a server restarted"
        else:
            how = "a server's target left service discovery at once"
        (h.notes if h.calm_now else reasons).append(f"{how}: {h.platform}")
    if h.stopped_at is not None:
        when = time.strftime("%H:%M UTC", time.gmtime(h.stopped_at))
        reasons.append(
            f"no requests finished at the end of the window, none since {when} after serving "
            "before it (traffic stopped: a gateway, a client, or a server that no longer answers)"
        )
    events = (h.request_rate or 0.0) * seconds
    recent = 0.0
    if h.present is not None:
        recent = (h.present_rate or 0.0) * (h.present[1] - h.present[0])
    for sli in h.slis:
        burn = sli.burn
        if recent >= MIN_EVENTS and sli.now is not None:
            # The state now decides; what the window went through is said beside it.
            if sli.burn_now is not None and sli.burn_now >= UNHEALTHY_BURN:
                reasons.append(
                    f"{describe(sli, now=True)} at the window's end, against an SLO of "
                    f"{sli.objective * 100:g}% ({describe(sli)} over the window)"
                )
            elif burn is not None and burn >= UNHEALTHY_BURN and events >= MIN_EVENTS:
                h.notes.append(
                    f"{describe(sli)} over the window, {describe(sli, now=True)} at its end: "
                    "recovered"
                )
        elif burn is not None and burn >= UNHEALTHY_BURN and events >= MIN_EVENTS:
            reasons.append(f"{describe(sli)}, against an SLO of {sli.objective * 100:g}%")
    if h.single_restart and downtime and reasons:
        reasons.insert(0, downtime)  # the restart's downtime, with the rest that went wrong
    if reasons:
        h.verdict = "unhealthy"
    elif h.request_rate is None and h.targets_total is None:
        h.verdict = "unknown"
    elif h.peak_rate <= IDLE_RPS:
        h.verdict = "idle"
    elif all(s.good is None for s in h.slis):
        h.verdict = "unknown"
    else:
        h.verdict = "healthy"
    if h.single_restart and not reasons:
        down = f", a target down {h.down_seconds:.0f} s" if h.down_seconds else ""
        met = ", SLOs met" if h.verdict == "healthy" else ""
        h.notes.append(f"1 restart (a deploy or a single crash{down}){met}")


def describe(sli: Sli, terse: bool = False, now: bool = False) -> str:
    """An SLI's reading in words, as a reason says it (``TTFT <= 0.5 s for 93.1%``,
    ``availability 99.95%``) or, ``terse``, as a report's health line does
    (``TTFT<=0.5s 93.1%``, ``available 99.95%``); ``now``: its reading over the present."""
    good = sli.now if now else sli.good
    if good is None:
        return f"{sli.name} {'-' if terse else 'unknown'}"
    if sli.name == "availability":
        return f"{'available' if terse else 'availability'} {good:.2%}"
    what = "TTFT" if sli.name == "ttft" else "ITL"
    if not terse:
        return f"{what} <= {sli.threshold:g} s for {good:.1%}"
    # A threshold that is not a bucket bound of the servers' histogram: the share is read
    # at the largest bound below it, and the line says so.
    bounds = " or ".join(f"{b:g}s" for b in sli.read_at)
    at = f" (read at {bounds}: not a bucket bound)" if sli.read_at else ""
    return f"{what}<={sli.threshold:g}s{at} {good:.1%}"


RECOVERED_STEPS = 4  # consecutive samples with every SLO met: the service had recovered


def met_since(data: ScopeData, h: Health, t: float) -> bool:
    """Whether every latency SLO was met for a stretch after ``t`` (four samples in a row):
    the service recovered from what ended at ``t``, so trouble after it is something new."""
    objectives = {s.name: s.objective for s in h.slis}
    ok: np.ndarray | None = None
    for name, signal in (("ttft", "ttft_slo_attainment"), ("itl", "itl_slo_attainment")):
        s = data.series.get(signal)
        if s is None:
            continue
        after = s.t > t
        met = np.nan_to_num(s.v[after], nan=0.0) >= objectives[name]  # no reading: not met
        ok = met if ok is None or ok.size != met.size else ok & met
    if ok is None:
        return False
    run = 0
    for m in ok:
        run = run + 1 if m else 0
        if run >= RECOVERED_STEPS:
            return True
    return False


def flag(h: Health, reason: str) -> None:
    """Mark a scope unhealthy for a reason found later (a finding, an abnormal state)."""
    if reason not in h.reasons:
        h.reasons.append(reason)
    h.verdict = "unhealthy"
