"""Work in proportion to what is diagnosed, on real loopback sockets where there is a source:
a fleet of thousands of models, a label value of megabytes. Each case here took minutes, or
never ended, while some step scanned every model for every model, or copied what was left of
a long word for every line it filled; and the webhook's diagnosis ends at its deadline."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from loopback import elapsed, fleet, serve, wait_for
from loopback import post_alerts as post

from diagnoser.catalog.shapes import Periods
from diagnoser.diagnosis.fetch import fetch, needed_signals
from diagnoser.diagnosis.health import Health
from diagnoser.diagnosis.match import Match
from diagnoser.diagnosis.model import Diagnosis, to_json
from diagnoser.diagnosis.window import Window
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.report import render
from diagnoser.report.format import WIDTH, wrap
from diagnoser.site import Site, SiteConfig
from diagnoser.webhook import http as webhook_http
from diagnoser.webhook.receiver import Webhook
from lab.promserver import free_port

pytestmark = pytest.mark.slow

END = 1_800_000_000.0


def test_a_word_of_megabytes_is_wrapped_in_time_in_proportion_to_it():
    word = "x" * 8_000_000  # a label value; 6 MB took 18 s in the text report, 10 MB forever
    took, lines = elapsed(lambda: wrap(f"model_name={word}: below the traffic floor", "   "))
    assert took < 15, took
    assert all(len(line) <= WIDTH and line.startswith("   ") for line in lines)
    assert "".join(lines).replace(" ", "") == f"model_name={word}:belowthetrafficfloor"


def _fleet_diagnosis(site: Site, models: int) -> Diagnosis:
    """A diagnosis of ``models`` model scopes, half of them explained by a finding, half
    unhealthy with no cause found and two near misses each."""
    window = Window.plan(3600, END)
    d = Diagnosis(window, site)
    pbs = list(site.catalog.detectable())[:3]
    periods = Periods(window.baseline, window.span, window.span, None)
    for i in range(models):
        scope = {"model_name": f"model-{i:05d}"}
        d.scopes.append(scope)
        d.health.append(Health(scope, "unhealthy", reasons=["availability 90% (SLO 99.9%)"]))
        if i % 2:
            d.findings.append(Match(pbs[0], scope, "matched", 0.8, periods, basis="window"))
        else:
            d.checked += [Match(pb, scope, "not_matched", periods=periods) for pb in pbs[1:]]
    return d


def test_the_reports_of_a_fleet_take_time_in_proportion_to_it(site):
    d = _fleet_diagnosis(site, 10_000)
    took, _ = elapsed(lambda: (render(d, "text"), render(d, "markdown"), to_json(d)))
    assert took < 30, took  # each model's findings and near misses were found by a scan
    doc = to_json(d)
    assert sum(1 for h in doc["health"] if h.get("cause") == "unknown") == 5_000


def test_series_without_the_group_labels_are_spread_in_time_in_proportion(site):
    # A site grouped by cluster, and a fleet whose series carry no cluster label (a probe
    # scraped outside the clusters): each such series went to every model that agrees on
    # the labels it has, found by a scan of all models.
    grouped = Site.build(SiteConfig(group_labels=("cluster",)), site.catalog)
    window = Window.plan(3600, END)
    with serve(fleet(2_000, points=2, sick=False)) as api:
        source = PrometheusSource(api.url, timeout=300).operation()
        took, out = elapsed(lambda: fetch(source, grouped, needed_signals(grouped), window))
    assert not isinstance(out, Exception), out
    assert took < 60, took
    assert len(out.models) == 2_000
    assert all(d.scope.keys() == {"model_name"} for d in out.models.values())
    assert all("request_rate" in d.series for d in out.models.values())


def test_the_webhooks_diagnosis_of_a_fleet_ends_at_its_deadline(site):
    # The queries of a fleet of 1,500 models are answered in a few seconds; their analysis
    # took a minute, and the record came that late, long past --timeout.
    timeout = 8.0
    records: list[dict[str, Any]] = []
    firing = {
        "status": "firing",
        "labels": {"alertname": "VllmHighQueue", "severity": "warning", "model_name": "m"},
        "annotations": {},
        "startsAt": "2026-11-29T03:00:00Z",
    }
    with serve(fleet(1_500, points=2)) as api:
        hook = Webhook(PrometheusSource(api.url, timeout=timeout), site, records.append)
        port, ready, stop = free_port(), threading.Event(), threading.Event()
        server = threading.Thread(
            target=webhook_http.serve, args=(hook, "127.0.0.1", port, ready, stop, 60.0)
        )
        server.start()
        try:
            assert ready.wait(10)
            t0 = time.monotonic()
            status, _ = post(
                f"http://127.0.0.1:{port}",
                {"version": "4", "groupKey": "g", "status": "firing", "alerts": [firing]},
            )
            assert status == 200
            wait_for(lambda: records, 90)
            took = time.monotonic() - t0
        finally:
            stop.set()
            server.join(90)
    assert records[0]["outcome"] == "failed", records[0]["outcome"]
    assert f"within {timeout:g} s" in records[0]["error"], records[0]["error"]
    assert took < timeout + 6, took
