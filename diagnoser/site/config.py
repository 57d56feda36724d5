"""The site config: a deployment's knobs, in the manner of a monitoring mixin's ``_config``.

Users set these in one YAML file (``--config FILE`` or ``$SERVEDIAG_CONFIG``) instead of
editing generated output; the same file reaches the rules, the dashboards, ``diagnose``, the
webhook and ``kv-budget``. Every knob has a default that works on a stock vLLM scrape.
"""

from __future__ import annotations

import math
import re
import string
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from diagnoser.metrics import engines
from diagnoser.metrics.buckets import (
    CUSTOM_FAMILIES,
    DEFAULT_BOUNDS,
    BucketsError,
    is_bound,
    parse_custom,
    read_at,
)
from diagnoser.metrics.promql import MATCHER
from diagnoser.plumbing.durations import LONGEST, parse_duration
from diagnoser.plumbing.errors import UserError, load_yaml
from diagnoser.site.slo import SloConfig, SloError
from diagnoser.site.slo import parse as parse_slo

DEFAULT_RUNBOOK_URL = "https://github.com/servediag/servediag/blob/main/runbooks/{id}.md"
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
FOR = re.compile(r"[0-9]+[smhd]")
# vllm_targets: one matcher or several, comma-separated, as they go inside {...}.
MATCHERS = re.compile(rf"{MATCHER.pattern}(?:\s*,\s*{MATCHER.pattern})*")
INTERVAL = re.compile(r"[1-9][0-9]*(ms|s|m|h)")
# Labels the rules aggregate by themselves: a group label of that name would repeat it in the
# same ``by`` or ``on`` clause, which Prometheus refuses (or sums the buckets it must keep).
RESERVED_GROUP_LABELS = ("model_name", "le", "__name__")
# The sides of a disaggregated deployment a site may name its servers of (``<side>_targets``).
ROLES = ("prefill", "decode")
# Longer than any scrape interval: the dashboards' step would skip whole hours of data.
LONGEST_SCRAPE = 3600.0


class ConfigError(UserError):
    """A config file that cannot be used; the message is one line."""


@dataclass(frozen=True)
class AlertOverride:
    for_: str | None = None
    severity: str | None = None
    params: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class SiteConfig:
    # Label matchers added to every selector (vLLM, SGLang, API server), e.g. ['cluster="a"'].
    selector: tuple[str, ...] = ()
    # Labels kept in every aggregation besides model_name (e.g. ['cluster'] or ['namespace']),
    # so the same model served by two deployments is not summed together.
    group_labels: tuple[str, ...] = ()
    # Selects the scrape targets of vLLM servers for alerts on `up`.
    vllm_targets: str = 'job=~".*vllm.*"'
    # The same for SGLang servers.
    sglang_targets: str = 'job=~".*sglang.*"'
    # Disaggregated prefill and decode: the servers of each side, where their series cannot
    # tell (a KV connector other than NIXL, a proxy that does not send max_tokens=1 to the
    # prefill side), e.g. 'pod=~"chat-prefill-.*"'. Empty: each side is read from the series.
    prefill_targets: str = ""
    decode_targets: str = ""
    # Stamped on every alert as annotations.runbook_url; {id} is the playbook id.
    runbook_url: str = DEFAULT_RUNBOOK_URL
    # An alert needs at least this many finished requests per second: idle models never alert.
    traffic_floor_rps: float = 0.1
    # SLO thresholds for the attainment signals, read at the largest bucket bound at or
    # below each (the threshold itself where it is one).
    ttft_slo_seconds: float = 1.0
    itl_slo_seconds: float = 0.1
    # Per-alert overrides by alert name: for, severity, params.
    alerts: dict[str, AlertOverride] = field(default_factory=dict)
    # Service-level objectives per model (see site.slo): availability, TTFT and ITL.
    slo: SloConfig = field(default_factory=SloConfig)
    # Prometheus' scrape interval for vLLM: the dashboards' minimum query step (no panel asks
    # for points closer together than samples are).
    scrape_interval: str = "15s"
    # The bounds the servers' histograms have where the site sets its own with vLLM's
    # --custom-histogram-buckets, by the flag's family key: ((family, bounds), ...). An SLO
    # threshold is read at the largest of them at or below it.
    histogram_buckets: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        # The SLO thresholds are the top-level ones unless an override sets its own.
        d = self.slo.default
        if (d.ttft_seconds, d.itl_seconds) != (self.ttft_slo_seconds, self.itl_slo_seconds):
            default = replace(
                d, ttft_seconds=self.ttft_slo_seconds, itl_seconds=self.itl_slo_seconds
            )
            object.__setattr__(self, "slo", replace(self.slo, default=default))

    @property
    def roles(self) -> tuple[str, str]:
        """The matchers of the site's prefill and decode servers (empty: read from series)."""
        return (self.prefill_targets, self.decode_targets)

    @property
    def by(self) -> tuple[str, ...]:
        return (*self.group_labels, "model_name")

    def targets(self, engine: str) -> str:
        """The matcher that selects one engine's scrape targets: the site's
        ``<engine>_targets``, or the engine's default where the site has no such field."""
        own = getattr(self, f"{engine}_targets", None)
        return own if isinstance(own, str) else engines.get(engine).targets

    def runbook_for(self, playbook_id: str) -> str:
        return self.runbook_url.format(id=playbook_id)

    def bounds(self, family: str) -> tuple[float, ...]:
        """The bounds of a histogram family at this site (vLLM's defaults unless set)."""
        return dict(self.histogram_buckets).get(family) or DEFAULT_BOUNDS[family]

    def bucket_sets(self) -> tuple[tuple[str, tuple[tuple[float, ...], ...]], ...]:
        """The site's histogram bounds by metric name, as a Scope takes them."""
        return tuple(
            (metric, (bounds,))
            for family, bounds in self.histogram_buckets
            for metric in CUSTOM_FAMILIES[family]
        )

    def off_bound(self) -> list[str]:
        """One line per SLO threshold that is not a bucket bound of its histogram at this
        site: where the share is read instead."""
        out = []
        seen: set[tuple[str, float]] = set()
        for ttft, itl in self.slo.thresholds():
            for what, family, threshold in (
                ("TTFT", "time_to_first_token", ttft),
                ("ITL", "inter_token_latency", itl),
            ):
                bounds = self.bounds(family)
                if (family, threshold) in seen or is_bound(threshold, bounds):
                    continue
                seen.add((family, threshold))
                at = read_at(threshold, (bounds,))
                out.append(
                    f"the {what} SLO threshold {threshold:g} s is not a bucket bound of "
                    f"{family} ({', '.join(f'{b:g}' for b in bounds)}): its share is read at "
                    f"{at[0]:g} s, a stricter threshold"
                )
        return out


def _error(path: Path, where: str, message: str) -> ConfigError:
    return ConfigError(f"{path}: {where}: {message}" if where else f"{path}: {message}")


def load_config(path: Path | None) -> SiteConfig:
    if path is None:
        return SiteConfig()
    raw = load_yaml(path, _error) or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: must be a YAML mapping")
    known = {f.name for f in fields(SiteConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(known))})")
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("selector", "group_labels"):
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"{path}: {key}: must be a list of strings")
            pattern, what = (
                (MATCHER, 'label matcher like job="vllm"')
                if key == "selector"
                else (
                    LABEL,
                    "label name",
                )
            )
            for i, v in enumerate(value):
                if not pattern.fullmatch(v.strip()):
                    raise ConfigError(f"{path}: {key}[{i}]: {v!r} is not a {what}")
                if key == "group_labels" and v.strip() in RESERVED_GROUP_LABELS:
                    raise ConfigError(
                        f"{path}: {key}[{i}]: {v.strip()!r} is aggregated by the rules "
                        "themselves; a group label is another label (cluster, namespace)"
                    )
                if key == "group_labels" and v.strip() in (w.strip() for w in value[:i]):
                    raise ConfigError(f"{path}: {key}[{i}]: {v.strip()!r} is listed twice")
            kwargs[key] = tuple(v.strip() for v in value)
        elif key == "alerts":
            kwargs[key] = _overrides(path, value)
        elif key == "slo":
            continue
        elif key == "histogram_buckets":
            kwargs[key] = _histogram_buckets(path, value)
        elif key in ("traffic_floor_rps", "ttft_slo_seconds", "itl_slo_seconds"):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                raise ConfigError(f"{path}: {key}: must be a non-negative number")
            kwargs[key] = float(value)
        elif key == "scrape_interval":
            if not isinstance(value, str) or not INTERVAL.fullmatch(value.strip()):
                raise ConfigError(f"{path}: {key}: must be a duration like 15s, 30s or 1m")
            if _seconds(value) > LONGEST_SCRAPE:
                raise ConfigError(f"{path}: {key}: must be at most 1h")
            kwargs[key] = value.strip()
        else:
            if not isinstance(value, str):
                raise ConfigError(f"{path}: {key}: must be a string")
            targets = key in {f"{e}_targets" for e in (*engines.names(), *ROLES)}
            if targets and not MATCHERS.fullmatch(value.strip()):
                raise ConfigError(f'{path}: {key}: {value!r} is not label matchers like job="vllm"')
            if key == "runbook_url":
                problem = runbook_url_problem(value)
                if problem is not None:
                    raise ConfigError(f"{path}: runbook_url: {problem}")
            kwargs[key] = value.strip() if targets else value
    ttft = kwargs.get("ttft_slo_seconds", SiteConfig.ttft_slo_seconds)
    itl = kwargs.get("itl_slo_seconds", SiteConfig.itl_slo_seconds)
    try:
        kwargs["slo"] = parse_slo(raw.get("slo"), ttft, itl)
    except SloError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    config = SiteConfig(**kwargs)
    _readable(path, config)
    return config


def _histogram_buckets(path: Path, value: Any) -> tuple[tuple[str, tuple[float, ...]], ...]:
    try:
        return tuple(parse_custom(value).items())
    except BucketsError as exc:
        where = ".".join(p for p in ("histogram_buckets", exc.where) if p)
        raise ConfigError(f"{path}: {where}: {exc}") from None


def _readable(path: Path, config: SiteConfig) -> None:
    """Every SLO threshold has a bound at or below it to be read at."""
    for ttft, itl in config.slo.thresholds():
        for family, threshold in (("time_to_first_token", ttft), ("inter_token_latency", itl)):
            bounds = config.bounds(family)
            if not read_at(threshold, (bounds,)):
                raise ConfigError(
                    f"{path}: an SLO threshold of {threshold:g} s is below the lowest bucket "
                    f"bound of {family} ({bounds[0]:g} s): no share can be read at it"
                )


def _seconds(duration: str) -> float:
    """A duration the pattern already accepted; one of hundreds of digits is infinitely long."""
    try:
        return parse_duration(duration.strip())
    except ValueError:
        return math.inf


def runbook_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the runbook link template, or None. It is filled in with
    ``str.format(id=...)``, so its only field may be a plain ``{id}``: any other (``{x}``,
    ``{}``, ``{id.__class__}``, ``{id!r}``) would fail at render time or reach into Python
    objects; a brace of its own is written ``{{`` or ``}}``. The link lands in reports, chat
    messages and alerts, where only http(s) is a page (``javascript:`` would run a script)."""
    try:
        parts = list(string.Formatter().parse(url))
    except ValueError as exc:
        return f"{exc} (a brace of the URL's own is written {{{{ or }}}})"
    found = [(name, spec, conv) for _, name, spec, conv in parts if name is not None]
    for name, spec, conv in found:
        if name != "id" or spec or conv:
            field_text = name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "")
            return (
                f"{{{field_text}}} is not a field it can hold: the only one is {{id}} (a brace "
                "of the URL's own is written {{ or }})"
            )
    if not found:
        return "must contain {id}"
    parts_of = urlsplit(url.replace("{id}", "id"))
    if parts_of.scheme.lower() not in ("http", "https") or not parts_of.netloc:
        return f"{url!r} is not an http:// or https:// URL"
    return None


def _overrides(path: Path, value: Any) -> dict[str, AlertOverride]:
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: alerts: must map alert names to overrides")
    out: dict[str, AlertOverride] = {}
    for name, ov in value.items():
        if not isinstance(ov, dict) or set(ov) - {"for", "severity", "params"}:
            raise ConfigError(f"{path}: alerts.{name}: may set only for, severity and params")
        if ov.get("severity") not in (None, "critical", "warning", "info"):
            raise ConfigError(f"{path}: alerts.{name}.severity: must be critical, warning or info")
        if "for" in ov and not (isinstance(ov["for"], str) and FOR.fullmatch(ov["for"])):
            raise ConfigError(f"{path}: alerts.{name}.for: must be a duration like 10m")
        if "for" in ov and _seconds(ov["for"]) > LONGEST:
            raise ConfigError(f"{path}: alerts.{name}.for: must be at most 3650d")
        params = ov.get("params", {})
        if not isinstance(params, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in params.values()
        ):
            raise ConfigError(f"{path}: alerts.{name}.params: must map names to numbers")
        out[str(name)] = AlertOverride(
            ov.get("for"), ov.get("severity"), {k: float(v) for k, v in params.items()}
        )
    return out
