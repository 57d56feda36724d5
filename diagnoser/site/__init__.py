"""The site: the catalog, the site config and the signal vocabulary built from them, made
once (by the CLI, the webhook or a test) and handed to every output.

The config's alert overrides are applied here, to the catalog itself: a parameter bound to a
signature condition changes that condition too, so the alert and the diagnosis test the same
number; ``for`` and ``severity`` change the alert. Everything downstream reads the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from diagnoser.catalog import Catalog, Playbook, load_catalog, with_param
from diagnoser.metrics import engines
from diagnoser.metrics.buckets import CUSTOM_FAMILIES, read_at
from diagnoser.metrics.promql import Scope
from diagnoser.metrics.signals import Signal, Vocabulary
from diagnoser.site.config import AlertOverride, ConfigError, SiteConfig, load_config

__all__ = ["ConfigError", "Site", "SiteConfig", "load_config"]


@dataclass(frozen=True)
class Site:
    config: SiteConfig
    catalog: Catalog
    vocabulary: Vocabulary
    # The bounds the servers' histograms were read to have (``diagnose``), by metric name;
    # where empty, the site config's ``histogram_buckets`` (or vLLM's defaults) hold.
    buckets: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...] = ()

    @classmethod
    def build(cls, config: SiteConfig, catalog: Catalog) -> Site:
        try:
            vocabulary = Vocabulary(
                ttft_slo=config.ttft_slo_seconds, itl_slo=config.itl_slo_seconds
            )
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return cls(config, _overridden(catalog, config), vocabulary)

    @classmethod
    def load(cls, config: Path | None = None, catalog_dirs: Sequence[Path] = ()) -> Site:
        return cls.build(load_config(config), load_catalog(*catalog_dirs))

    @staticmethod
    @cache
    def default() -> Site:
        """The built-in catalog with the default config."""
        return Site.build(SiteConfig(), load_catalog())

    def scope(
        self,
        signal: Signal | None = None,
        *,
        instance: bool = False,
        window: str = "5m",
        matchers: Sequence[str] = (),
    ) -> Scope:
        """Where a signal is evaluated at this site: the site's selector (and ``matchers``),
        aggregated by the site's model grouping (or by target for target-level signals)."""
        if signal is not None and signal.target_level:
            by = signal.by
        else:
            by = (*self.config.by, "instance") if instance else self.config.by
        return Scope(
            matchers=(*self.config.selector, *matchers),
            by=by,
            window=window,
            targets=tuple(self.config.targets(e) for e in engines.names()),
            buckets=self.buckets or self.config.bucket_sets(),
            roles=self.config.roles,
        )

    def with_buckets(self, found: tuple[tuple[str, tuple[tuple[float, ...], ...]], ...]) -> Site:
        """This site, reading its thresholds at the bounds the servers were found to have
        (the config's for the families not found)."""
        read = {metric for metric, _ in found}
        kept = tuple(b for b in self.config.bucket_sets() if b[0] not in read)
        return replace(self, buckets=(*found, *kept))

    def read_at(self, family: str, threshold: float) -> tuple[float, ...]:
        """The bounds a share at or below ``threshold`` of this family is read at here."""
        sets = dict(self.buckets or self.config.bucket_sets())
        metric = next((m for m in CUSTOM_FAMILIES[family] if m in sets), None)
        bound_sets = sets[metric] if metric else (self.config.bounds(family),)
        return read_at(threshold, bound_sets)

    def runbook(self, playbook_id: str) -> str:
        return self.config.runbook_for(playbook_id)


def _overridden(catalog: Catalog, config: SiteConfig) -> Catalog:
    by_alert = catalog.by_alert()
    stray = sorted(set(config.alerts) - set(by_alert))
    if stray:
        raise ConfigError(f"alerts: no alert named {stray[0]!r}")
    changed: list[Playbook] = []
    for name, ov in sorted(config.alerts.items()):
        changed.append(_apply(by_alert[name], name, ov))
    return catalog.replaced(changed) if changed else catalog


def _apply(pb: Playbook, name: str, ov: AlertOverride) -> Playbook:
    assert pb.alert is not None
    unknown = sorted(set(ov.params) - set(pb.alert.params))
    if unknown:
        known = ", ".join(sorted(pb.alert.params)) or "none"
        raise ConfigError(
            f"alerts.{name}.params: unknown parameter {unknown[0]!r} (known: {known})"
        )
    for param, value in sorted(ov.params.items()):
        pb = with_param(pb, param, value)
    current = pb.alert
    assert current is not None
    alert = replace(current, for_=ov.for_ or current.for_, severity=ov.severity or current.severity)
    return replace(pb, alert=alert)
