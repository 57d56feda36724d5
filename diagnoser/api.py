"""servediag from Python: the diagnosis and the KV budget for a notebook or a script.

The command line's guarantees hold here too. Every query of one call shares one deadline
(``timeout``), each answer is bounded in size, a partial answer (Prometheus's ``warnings``)
is marked on the result, and anything wrong with the source raises ``SourceError`` whose
message is one line, printable as is, with no credential in it. ``source`` may be a URL,
a ``prometheus_api_client.PrometheusConnect`` already configured (its URL, headers, auth,
TLS settings and session are used), or any object with the ``query_range`` and ``query``
of ``diagnoser.plumbing.source.MetricSource`` (a recording, say).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from diagnoser.diagnosis.model import Diagnosis
    from diagnoser.kvbudget.budget import Budget
    from diagnoser.kvbudget.live import Live
    from diagnoser.plumbing.source import MetricSource
    from diagnoser.whatif.setup import SetupOptions

Seconds = float | int | str
When = float | int | str | datetime | None
PathLike = str | Path


def connect(source: Any, timeout: float = 60.0, max_response_mb: float = 64.0) -> MetricSource:
    """The metric source ``source`` names: a URL (``http://prometheus:9090``, credentials in
    it or not), a ``PrometheusConnect``, or a source as it is. A URL that is not http(s)
    raises ``ValueError``; so do a ``timeout`` and a ``max_response_mb`` out of the command
    line's ranges (``--timeout``: 1 to 600 seconds, ``--max-response-mb``: 1 to 4096)."""
    from diagnoser.plumbing.limits import MAX_RESPONSE_MB, TIMEOUT
    from diagnoser.plumbing.source import MIB, PrometheusSource

    timeout = TIMEOUT.check(timeout, "timeout")
    max_response_mb = MAX_RESPONSE_MB.check(max_response_mb, "max_response_mb")
    if isinstance(source, str):
        from diagnoser.plumbing.source import bad_url

        why = bad_url(source.strip())
        if why:
            raise ValueError(why)
        return PrometheusSource(
            source.strip(), timeout=timeout, max_bytes=int(max_response_mb * MIB)
        )
    if _is_prometheus_connect(source):
        from diagnoser.plumbing.connect import ConnectSource

        return ConnectSource(source, timeout=timeout, max_bytes=int(max_response_mb * MIB))
    if callable(getattr(source, "query_range", None)) and callable(getattr(source, "query", None)):
        return source  # type: ignore[no-any-return]
    raise TypeError(
        "source must be a URL, a prometheus_api_client.PrometheusConnect, or an object with "
        f"query_range() and query(); got {type(source).__name__}"
    )


def _is_prometheus_connect(source: Any) -> bool:
    """A ``prometheus_api_client.PrometheusConnect`` (or a subclass), without importing the
    library when it is not already in use."""
    import sys

    module = sys.modules.get("prometheus_api_client")
    cls = getattr(module, "PrometheusConnect", None) if module is not None else None
    return isinstance(cls, type) and isinstance(source, cls)


def seconds(value: Seconds, what: str, zero: bool = False) -> float:
    """``"1h"``, ``"90m"``, ``"30"`` or a number of seconds -> seconds, as the command line's
    options take them: longer than zero (or zero, when ``zero``) and at most ten years;
    ``ValueError`` naming ``what``."""
    from diagnoser.plumbing.durations import duration

    try:
        return duration(value, zero)
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def timestamp(value: When, what: str) -> float | None:
    """An RFC 3339 string, Unix seconds or a ``datetime`` (naive is UTC) -> Unix seconds."""
    from diagnoser.plumbing.durations import parse_time

    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            from datetime import timezone

            value = value.replace(tzinfo=timezone.utc)
        value = repr(value.timestamp())
    elif isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(f"{what}: {value!r} is neither RFC 3339 nor a Unix timestamp")
    try:  # within 1970 to 9999, as the command line's --until
        return parse_time(value if isinstance(value, str) else repr(float(value)))
    except (ValueError, OverflowError) as exc:
        raise ValueError(f"{what}: {exc}") from None


def _a_path(value: object) -> bool:
    """A ``str`` or ``Path`` that can name a file: not empty, no NUL in it."""
    return isinstance(value, (str, Path)) and str(value).strip() != "" and "\0" not in str(value)


def _site(config: PathLike | None, catalog: PathLike | Sequence[PathLike] | None) -> Any:
    from diagnoser.site import Site

    if config is not None and not _a_path(config):
        raise ValueError(f"config: {config!r} is not a path")
    if catalog is None:
        dirs: tuple[Path, ...] = ()
    elif _a_path(catalog):
        dirs = (Path(catalog),)  # type: ignore[arg-type]
    elif isinstance(catalog, (list, tuple)) and all(_a_path(c) for c in catalog):
        dirs = tuple(Path(c) for c in catalog)
    else:
        raise ValueError(f"catalog: {catalog!r} is not a directory or a list of them")
    if config is None and not dirs:
        return Site.default()
    return Site.load(Path(config) if config is not None else None, dirs)


def diagnose(
    source: Any,
    since: Seconds = "1h",
    until: When = None,
    model: str | None = None,
    config: PathLike | None = None,
    catalog: PathLike | Sequence[PathLike] | None = None,
    lookback: Seconds = "24h",
    *,
    match: str | Sequence[str] = (),
    baseline: Seconds | None = None,
    timeout: float = 60.0,
    recorded_rules: bool = False,
    what_if: bool | SetupOptions = False,
) -> Diagnosis:
    """Diagnose ``since`` up to ``until`` (default now), as ``servediag diagnose`` does.

    ``model`` keeps one ``model_name``; ``match`` adds label matchers (``'job="vllm"'``);
    ``config`` is a site config file and ``catalog`` directories of your own playbooks;
    ``lookback`` how far back to date an onset (``0`` for not at all); ``baseline`` a shift
    such as ``"1d"`` to compare with the same hours a day before (default: the period just
    before the window). ``recorded_rules`` reads each signal from the site's recording rules
    where they cover the window (``diagnose --recorded-rules``). ``what_if`` puts under each
    finding whose fix has levers what each lever would buy (``diagnose --what-if``): ``True``
    finds the model's shape from a preset of its served name and the GPU from DCGM, or give
    a ``diagnoser.SetupOptions(preset=..., gpu_name=..., max_num_seqs=...)``; the
    predictions are in ``Diagnosis.what_if`` and its JSON. Returns a ``Diagnosis``:
    ``findings`` likely cause first (those that still hold), ``resolved`` those that ended
    in the window, ``health`` per model, ``to_frame()`` and
    ``findings_frame()`` for pandas, ``to_json()`` for the JSON contract. Raises
    ``SourceError`` when the source fails, ``UserError`` for a bad config or catalog,
    ``ValueError`` for a bad argument.
    """
    from diagnoser.plumbing.limits import TIMEOUT
    from diagnoser.request import Request, Scope, run
    from diagnoser.whatif.setup import SetupOptions

    span = seconds(since, "since")
    back = seconds(lookback, "lookback", zero=True)
    offset = seconds(baseline, "baseline") if baseline is not None else None
    end = timestamp(until, "until")
    timeout = TIMEOUT.check(timeout, "timeout")
    if not isinstance(recorded_rules, bool):
        raise ValueError(f"recorded_rules: {recorded_rules!r} is not True or False")
    if what_if is True:
        setup: SetupOptions | None = SetupOptions()
    elif what_if is False:
        setup = None
    elif isinstance(what_if, SetupOptions):
        setup = what_if
    else:
        raise TypeError(f"what_if must be a bool or a SetupOptions; got {type(what_if).__name__}")
    scope = Scope(model=model, match=_matchers(match))
    request = Request(
        connect(source, timeout),
        _site(config, catalog),
        span,
        until=end,
        baseline=offset,
        scope=scope,
        lookback=back,
        recorded_rules=recorded_rules,
        what_if=setup,
    )
    return run(request)


def _matchers(match: object) -> tuple[str, ...]:
    """``match`` as label matchers: one string, or a list or tuple of them (each checked, and
    named in the error, by ``Scope``)."""
    if isinstance(match, str):
        return (match,)
    if isinstance(match, (list, tuple)):
        return tuple(match)
    raise ValueError(f"match: {match!r} is not a label matcher or a list of them")


def kv_budget(
    model: str | Path | None = None,
    *,
    source: Any = None,
    at: When = None,
    timeout: float = 60.0,
    **inputs: Any,
) -> tuple[Budget | None, Live | None]:
    """The KV-cache plan for ``model`` (a preset such as ``"llama-3.1-8b"`` or a
    ``config.json``), and with ``source`` each live engine's capacity read at ``at``
    (default now), as ``servediag kv-budget`` prints them. Either may be None when not
    asked for. ``inputs`` are the plan's, as the command line's options name them
    (``diagnoser.kvbudget.budget.PlanInputs``): ``gpu`` (default ``"H100-80GB"``),
    ``gpu_memory_gb``, ``gpu_memory_utilization``, ``weights_gb``, ``overhead_gb``,
    ``max_model_len``, ``context``, ``users``, ``tensor_parallel``, ``kv_cache_dtype``,
    ``block_size``, ``dtype`` and ``gpu_from`` (where the GPU came from, said in the plan);
    another name raises ``TypeError``. Raises ``UserError`` for what cannot be planned,
    ``SourceError`` when the source fails."""
    import time

    from diagnoser.kvbudget.budget import PlanInputs, make_budget
    from diagnoser.kvbudget.live import read_live
    from diagnoser.plumbing.limits import TIMEOUT

    if model is None and source is None:
        raise ValueError("give a model (a preset or a config.json), a source, or both")
    if isinstance(model, Path):
        model = str(model)
    TIMEOUT.check(timeout, "timeout")
    asked = PlanInputs(model, **inputs)
    when = timestamp(at, "at")
    prometheus = connect(source, timeout) if source is not None else None
    plan = make_budget(asked) if model is not None else None
    live = None
    if prometheus is not None:
        live = read_live(
            prometheus,
            time.time() if when is None else when,
            asked.max_model_len,
            asked.context,
        )
    return plan, live
