"""Fetch the series a diagnosis needs: one ``query_range`` per signal, covering the baseline
and the window for every scope at once (so the cost grows with signals and models, not
instances), run concurrently and sorted into one ``ScopeData`` per scope.

A model scope is keyed by the site's model grouping (``model_name`` and the site's group
labels, as the alerts are); a target scope by (job, instance).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from diagnoser.catalog import Catalog
from diagnoser.diagnosis.frozen import thawed
from diagnoser.diagnosis.match import ScopeData
from diagnoser.diagnosis.targets import Served, Target, by_model, served
from diagnoser.diagnosis.window import Window, rate_text
from diagnoser.metrics import engines as registry
from diagnoser.metrics.buckets import CUSTOM_FAMILIES
from diagnoser.metrics.family import family
from diagnoser.metrics.promql import agg, selector
from diagnoser.metrics.signals import STAND_IN_LABEL, Signal, Vocabulary
from diagnoser.metrics.signals.server import servers_of, target_up_of
from diagnoser.plumbing.durations import parse_seconds
from diagnoser.plumbing.source import MetricSource, OverLimit, Series
from diagnoser.site import Site

SLO_SIGNALS = ("ttft_slo_attainment", "itl_slo_attainment")
# Read for every model: traffic, load, scrape health, and the health summary's SLIs.
ALWAYS = (
    "request_rate",
    "requests_running",
    "target_up",
    "target_served",
    "targets_down",
    "targets_total",
    "engine_restarts",
    "http_request_rate",
    "http_5xx_share",
    "finished_error_share",
    "finished_abort_share",
    "ttft_slo_attainment",
    "itl_slo_attainment",
    "generation_tokens_rate",
)


@dataclass
class Fetched:
    models: dict[tuple[str, ...], ScopeData] = field(default_factory=dict)
    targets: dict[tuple[str, str], ScopeData] = field(default_factory=dict)
    queries: int = 0
    query_seconds: float = 0.0
    # Each target's model over the lookback, and how far back the data went.
    owners: dict[tuple[str, str], Served] = field(default_factory=dict)
    first_seen: float | None = None


def needed_signals(site: Site, catalog: Catalog | None = None) -> list[Signal]:
    names: set[str] = set(ALWAYS)
    for engine in registry.others():  # which models it serves, and its targets' health
        names |= {servers_of(engine.name), target_up_of(engine.name)}
    for pb in (catalog or site.catalog).detectable():
        assert pb.signature is not None
        names |= set(pb.evidence)
        for sig in filter(None, (pb.signature, pb.signature.otherwise)):
            names.update((*sig.requires, *filter(None, (sig.onset,))))
        for c in pb.signature.conditions():
            names.update(c.needs())
    names |= {site.vocabulary[n].ceiling for n in names} - {""}
    names |= {i.signal for n in list(names) for i in site.vocabulary[n].stand_in.values()}
    return [site.vocabulary[n] for n in sorted(names)]


def query(site: Site, sig: Signal, window: Window, matchers: Sequence[str] = ()) -> str:
    """The signal's PromQL for this site, window and scope."""
    extra = (*matchers, site.config.targets(sig.engine)) if sig.target_level else tuple(matchers)
    rate = window.rate_window
    if sig.least_window > parse_seconds(rate):
        rate = rate_text(int(sig.least_window))
    return sig.render(site.scope(sig, window=rate, matchers=extra))


def bucket_query(site: Site, matchers: Sequence[str] = ()) -> str:
    """One query for the ``le`` labels the latency histograms have on each scope's servers
    (a site may set its own with ``--custom-histogram-buckets``), each answer labelled with
    its metric in ``histogram``."""
    scope = site.scope(matchers=matchers)
    parts = [
        f"label_replace({agg('count', scope, selector(metric + '_bucket', scope.matchers), 'le')}"
        f', "histogram", "{metric}", "", "")'
        for metrics in CUSTOM_FAMILIES.values()
        for metric in metrics
    ]
    return " or ".join(parts)


def server_buckets(
    source: MetricSource, site: Site, window: Window, matchers: Sequence[str] = ()
) -> tuple[tuple[str, tuple[tuple[float, ...], ...]], ...]:
    """The distinct sets of bounds each latency histogram has at the window's end, by metric
    (one point of a range query, so that recordings keep it)."""
    try:
        series = source.query_range(
            bucket_query(site, matchers), window.end, window.end, window.step
        )
    except OverLimit as exc:
        raise exc.about("the latency histograms' bucket bounds") from None
    sets: dict[str, dict[tuple[str, ...], set[float]]] = {}
    for s in series:
        metric, le = s.labels.get("histogram", ""), s.labels.get("le", "")
        try:
            bound = float(le)
        except ValueError:
            continue
        if math.isfinite(bound):
            scope = tuple(v for k, v in sorted(s.labels.items()) if k not in ("histogram", "le"))
            sets.setdefault(metric, {}).setdefault(scope, set()).add(bound)
    return tuple(
        (metric, tuple(sorted({tuple(sorted(b)) for b in by_scope.values()})))
        for metric, by_scope in sorted(sets.items())
    )


SCRAPE_SPAN = 600.0  # seconds of ``up`` the scrape interval is read from, at most


def scrape_interval(source: MetricSource, site: Site, window: Window) -> float | None:
    """The shortest scrape interval of the reference engine's targets at the window's end,
    from how many ``up`` samples the last minutes hold (one point of a range query, so that
    recordings keep it); None where no target was scraped then."""
    span = int(min(SCRAPE_SPAN, max(60.0, window.end - window.start)))
    # The targets alone: a scope's matchers name labels ``up`` does not have.
    up = selector("up", (site.config.targets(registry.reference().name),))
    expr = f"max(count_over_time({up}[{span}s]))"
    try:
        series = source.query_range(expr, window.end, window.end, window.step)
    except OverLimit as exc:
        raise exc.about("the scrape interval") from None
    counts = [float(v) for s in series for v in s.v if np.isfinite(v) and v >= 2]
    return span / max(counts) if counts else None


def fetch(
    source: MetricSource,
    site: Site,
    signals: Sequence[Signal],
    window: Window,
    matchers: Sequence[str] = (),
    workers: int = 8,
    lookback: float = 0.0,
    records: Mapping[str, str] | None = None,
    unasked: AbstractSet[str] = frozenset(),
) -> Fetched:
    """``lookback``: how far back (from the window's end) a target's model is remembered.
    ``records``: the recording rule each signal is read from instead (``recorded.plan``).
    ``unasked``: signals known to have no series (their exporter is not scraped): not asked."""
    queried = [s for s in signals if not s.attributed and s.name not in unasked]
    records = records or {}

    def one(sig: Signal, own: bool = True) -> tuple[Signal, list[Series], float]:
        """``own``: the signal is the vocabulary's, whose record ``records`` names (not an
        SLO attainment at a model's own thresholds)."""
        t0 = time.perf_counter()
        record = records.get(sig.name) if own else None
        # A record's series from a stand-in are left to the stand-in's own (``_stand_ins``).
        unlabelled = (f'{STAND_IN_LABEL}=""',) if sig.stand_in else ()
        expr = (
            selector(record, (*matchers, *unlabelled))
            if record
            else query(site, sig, window, matchers)
        )
        try:
            series = source.query_range(expr, window.first, window.end, window.step)
        except OverLimit as exc:  # which query, so that on-call knows what to narrow
            named = f"{sig.name} ({sig.families[0]})" if sig.families else sig.name
            raise exc.about(named) from None
        # What no scope can take is dropped as it arrives, not held until every query is in.
        kept = [s for s in series if sig.target_level or "model_name" in s.labels]
        return sig, kept, time.perf_counter() - t0

    def owners() -> tuple[dict[Target, Served], float | None, float]:
        t0 = time.perf_counter()
        start = min(window.first, window.end - lookback)
        found, first = served(source, site, start, window.end, matchers)
        return found, first, time.perf_counter() - t0

    # Models whose SLO overrides set other thresholds read their attainment at those.
    extra = [
        (pair, Vocabulary(*pair)[name])
        for pair in site.config.slo.thresholds()[1:]
        for name in SLO_SIGNALS
        if any(s.name == name for s in queried)
    ]

    def at_threshold(
        item: tuple[tuple[float, float], Signal],
    ) -> tuple[Signal, list[Series], float]:
        return one(item[1], own=False)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        mapped = pool.submit(owners)
        answers = list(pool.map(one, queried))
        overridden = list(pool.map(at_threshold, extra))
        found, first, map_seconds = mapped.result()
    out = Fetched(
        queries=len(answers) + 1,
        query_seconds=sum(sec for _, _, sec in answers) + map_seconds,
        owners=found,
        first_seen=first,
    )
    by = site.config.by
    partial: list[tuple[Signal, Series]] = []
    for sig, series, _ in answers:
        for s in series:
            if sig.target_level:
                key = (s.labels.get("job", ""), s.labels.get("instance", ""))
                data = out.targets.setdefault(key, ScopeData({"job": key[0], "instance": key[1]}))
                data.series[sig.name] = s
            elif "model_name" not in s.labels:
                continue
            elif any(k not in s.labels for k in by):
                partial.append((sig, s))
            else:
                mkey = tuple(s.labels[k] for k in by)
                data = out.models.setdefault(mkey, ScopeData(dict(zip(by, mkey, strict=True))))
                _put(data, sig, s)
    spread = _Spread(out, by)
    for sig, s in partial:
        spread.put(sig, s)
    _engines(out, signals)
    _stand_ins(out, signals)
    _ceilings(out, signals)
    _latency_ceilings(out, signals, site)
    for (pair, _), (sig, series, sec) in zip(extra, overridden, strict=True):
        out.queries += 1
        out.query_seconds += sec
        for s in series:
            owner = out.models.get(tuple(s.labels.get(k, "") for k in by))
            if owner is None:
                continue
            slo = site.config.slo.for_labels(owner.scope)
            if (slo.ttft_seconds, slo.itl_seconds) == pair:
                owner.series[sig.name] = s
    if any(s.attributed for s in signals):
        _attribute(out, by)
    smoothing, scrape = parse_seconds(window.rate_window), window.scrape or 0.0
    for data in (*out.models.values(), *out.targets.values()):
        data.smoothing, data.scrape = smoothing, scrape
    out.models = {key: thawed(data) for key, data in out.models.items()}
    return out


def _stand_ins(out: Fetched, signals: Sequence[Signal]) -> None:
    """A model scope without a signal's series of its own reads its engine's stand-in in its
    place (``Signal.stand_in``: SGLang without its optional token histograms), and keeps
    what it read, for the evidence to say."""
    for data in out.models.values():
        engine = data.engine or registry.reference().name
        for sig in signals:
            alt = sig.stand_in.get(engine)
            if alt is not None and not data.has(sig.name) and alt.signal in data.series:
                data.series[sig.name] = data.series[alt.signal]
                data.stand_ins[sig.name] = f"{alt.signal}: {alt.what}"


def _ceilings(out: Fetched, signals: Sequence[Signal]) -> None:
    """Each quantile learns its histogram's top finite bound on the scope's servers: a value
    at it fell in the +Inf bucket (a lower bound)."""
    for sig in signals:
        for data in out.models.values():
            top = data.series.get(sig.ceiling) if sig.ceiling else None
            if top is not None:
                bounds = np.unique(top.v[np.isfinite(top.v)])
                data.ceilings[sig.name] = tuple(float(b) for b in bounds)


def _latency_ceilings(out: Fetched, signals: Sequence[Signal], site: Site) -> None:
    """A latency quantile's top finite bounds, from the bounds the servers were read to have
    (or vLLM's defaults): a p99 at the top of a site's short custom buckets is a lower bound.
    Not on SGLang's scopes, whose histograms have their own bounds."""
    scope = site.scope()
    for sig in signals:
        if not sig.quantile_of or sig.ceiling:
            continue
        read = dict(scope.buckets)
        # The names the servers were found to have; where none, every name's defaults.
        names = [n for n in sig.quantile_of if n in read] or sig.quantile_of
        tops: set[float] = set()
        for name in names:
            default = family(name).buckets
            if isinstance(default, tuple):
                tops |= {max(b) for b in scope.bound_sets(name, default) if b}
        for data in out.models.values():
            if not data.gaps and data.has(sig.name):
                data.ceilings[sig.name] = tuple(sorted(tops))


def _engines(out: Fetched, signals: Sequence[Signal]) -> None:
    """The scopes another engine than the reference serves learn which signals that engine
    cannot give them, and why."""
    gaps = {
        e.name: {s.name: s.gap(e.name) for s in signals if not s.on(e.name) and s.gap(e.name)}
        for e in registry.others()
    }
    for data in out.models.values():
        for name, lacking in gaps.items():
            servers = data.series.get(servers_of(name))
            if servers is not None and servers.v.size and np.nanmax(servers.v, initial=0.0) > 0:
                data.gaps, data.engine = dict(lacking), name
                break


def target_ups(out: Fetched) -> dict[Target, Series]:
    """Each scrape target's ``up``, whichever engine it serves."""
    return {
        key: d.series[name]
        for key, d in out.targets.items()
        for name in (*(target_up_of(e.name) for e in registry.others()), "target_up")
        if name in d.series
    }


def _attribute(out: Fetched, by: tuple[str, ...]) -> None:
    """The model-level scrape-health series, from each target's ``up`` and its owner."""
    up = target_ups(out)
    for key, s in up.items():  # served within the lookback: it came up at least once
        served = 1.0 if key in out.owners else 0.0
        out.targets[key].series["target_served"] = Series(
            {"job": key[0], "instance": key[1]}, s.t, np.where(np.isfinite(s.v), served, np.nan)
        )
    for model, (down, total) in by_model(up, out.owners).items():
        data = out.models.setdefault(model, ScopeData(dict(zip(by, model, strict=True))))
        labels = dict(data.scope)
        data.series["targets_down"] = Series(labels, down.t, down.v)
        data.series["targets_total"] = Series(labels, total.t, total.v)


def _put(data: ScopeData, sig: Signal, s: Series) -> None:
    bucket = s.labels.get("prompt_bucket")
    if bucket is not None:
        data.classes.setdefault(sig.name, {})[bucket] = s
    else:
        data.series[sig.name] = s


class _Spread:
    """A series without some of the site's group labels (a probe scraped outside the
    clusters, say) belongs to every scope of its model that agrees on the labels it has, where
    that scope has no series of its own for the signal. The scopes are found by the labels a
    series has, from an index made once per set of labels (a scan of every scope for every
    such series was quadratic in the number of models)."""

    def __init__(self, out: Fetched, by: tuple[str, ...]):
        self.out, self.by = out, by
        self._index: dict[tuple[str, ...], dict[tuple[str, ...], list[ScopeData]]] = {}

    def _scopes(self, names: tuple[str, ...], values: tuple[str, ...]) -> list[ScopeData]:
        index = self._index.get(names)
        if index is None:
            index = {}
            for d in self.out.models.values():
                if all(k in d.scope for k in names):
                    index.setdefault(tuple(d.scope[k] for k in names), []).append(d)
            self._index[names] = index
        return index.get(values, [])

    def put(self, sig: Signal, s: Series) -> None:
        names = tuple(k for k in self.by if k in s.labels)
        values = tuple(s.labels[k] for k in names)
        scopes = self._scopes(names, values)
        if not scopes:
            known = dict(zip(names, values, strict=True))
            key = tuple(known.get(k, "") for k in self.by)
            data = self.out.models.get(key)
            if data is None:
                data = self.out.models[key] = ScopeData(known)
                for index_names, index in self._index.items():  # the new scope, indexed
                    if all(k in known for k in index_names):
                        index.setdefault(tuple(known[k] for k in index_names), []).append(data)
            scopes = [data]
        bucket = s.labels.get("prompt_bucket")
        for data in scopes:
            own = data.classes.get(sig.name, {}) if bucket is not None else data.series
            if (bucket if bucket is not None else sig.name) not in own:
                _put(data, sig, s)
