"""One way into a diagnosis: what is asked (``Request``) and the one function that answers it
(``run``).

The command line, ``diagnoser.diagnose()`` and the webhook each turn their own inputs into a
``Request`` and call ``run``; none of them plans a window, escapes a matcher or attaches
what-if's predictions itself, so the three cannot drift apart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from diagnoser.diagnosis.run import DEFAULT_LOOKBACK
from diagnoser.diagnosis.window import Window
from diagnoser.metrics.promql import MATCHER, matcher

if TYPE_CHECKING:
    from diagnoser.diagnosis.model import Diagnosis
    from diagnoser.plumbing.source import MetricSource
    from diagnoser.site import Site
    from diagnoser.whatif.setup import SetupOptions

EXAMPLE_MATCHER = 'job="vllm" or pod=~"vllm-.*"'


class ScopeError(ValueError):
    """A scope that selects nothing meaningful: a value that is not text, a malformed matcher.
    Its message is one line and begins with the field's name (``match 'x' is not ...``),
    which the command line gives as its option (``--match 'x' is not ...``)."""


@dataclass(frozen=True)
class Scope:
    """Which series a diagnosis reads: one model, one scrape target's instance or job, any
    further label matchers, or an alert's labels as they are. Values are escaped, so they
    select and never widen; the matchers are built here and nowhere else."""

    model: str | None = None
    instance: str | None = None
    job: str | None = None
    match: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()  # exact values (an alert's model or target)

    def __post_init__(self) -> None:
        for option in ("model", "instance", "job"):
            value = getattr(self, option)
            if value is not None:
                _text(value, option)
        for m in self.match:
            _text(m, "match")
            if not MATCHER.fullmatch(m.strip()):
                raise ScopeError(f"match {m!r} is not a label matcher like {EXAMPLE_MATCHER}")

    def matchers(self) -> tuple[str, ...]:
        """The PromQL label matchers: the model's, the target's, the labels', then ``match``."""
        named = (("model_name", self.model), ("instance", self.instance), ("job", self.job))
        out = [matcher(label, value) for label, value in named if value]
        out += [matcher(label, value) for label, value in self.labels]
        return (*out, *(m.strip() for m in self.match))


def _text(value: object, option: str) -> None:
    """A value that is text (bytes that are not UTF-8 reach Python as lone surrogates, which no
    query can carry)."""
    if not isinstance(value, str):
        raise ScopeError(f"{option}: {value!r} is not text")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ScopeError(f"{option}: the value is not valid UTF-8 text") from None


@dataclass(frozen=True)
class Request:
    """A diagnosis asked for: of ``source`` for ``site``, over ``since`` seconds up to ``until``
    (None: now), compared with ``baseline`` (None: the period just before; else the window
    that many seconds back), within ``scope``.

    ``lookback``: how far back to date an onset (0: not at all). ``step``: the query
    resolution, rates over four steps (None: planned from the window). ``recorded_rules``:
    read each signal from the site's recording rule where one covers the window.
    ``what_if``: what is known of the servers, to predict what each finding's levers would
    buy (None: no what-if). ``timeout``: the deadline of the whole diagnosis, its queries and
    the work on their answers (None: the source's own).
    """

    source: MetricSource
    site: Site
    since: float
    until: float | None = None
    baseline: float | None = None
    scope: Scope = field(default_factory=Scope)
    lookback: float = DEFAULT_LOOKBACK
    step: float | None = None
    recorded_rules: bool = False
    what_if: SetupOptions | None = None
    timeout: float | None = None

    def window(self, now: float | None = None) -> Window:
        """The window, its baseline and its resolution; ``now`` where ``until`` is None."""
        end = self.until if self.until is not None else (time.time() if now is None else now)
        window = Window.plan(self.since, end, self.baseline)
        return window if self.step is None else window.with_step(self.step)


def run(request: Request, now: float | None = None) -> Diagnosis:
    """The diagnosis ``request`` asks for, with what-if's predictions under each finding whose
    fix has levers when it asks for them (a what-if that cannot be made is said on its
    finding and changes nothing else). Raises ``SourceError`` when the source fails."""
    from diagnoser.diagnosis.run import diagnose
    from diagnoser.plumbing.source import one_operation

    matchers = request.scope.matchers()
    source = one_operation(request.source, request.timeout)
    result = diagnose(
        source,
        request.site,
        request.window(now),
        matchers,
        lookback=request.lookback,
        recorded_rules=request.recorded_rules,
    )
    if request.what_if is not None:
        from diagnoser.whatif.findings import attach

        attach(result, source, request.site, request.what_if)
    return result
