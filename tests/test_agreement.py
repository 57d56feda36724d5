"""Alerts and diagnose agree: on every library scenario, the generated alert rules are
evaluated over the scenario's history (recording rules backfilled with promtool), and the
playbook of every cause alert that fires in the window is among ``diagnose``'s findings for
that window and model, or a finding whose playbook explains it is (and is then ranked
first); the webhook's record of the alert ranks it first (behind the cause that explains it,
when there is one). For every symptom alert that fires (an SLO burning, a target down),
``diagnose`` says the model is unhealthy. A healthy scenario fires no alert at all. An alert
for an incident the labels say ended (``resolved``, ``ended``) is reported as ended instead.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from diagnoser.diagnosis import Window, diagnose
from diagnoser.diagnosis.model import Diagnosis
from diagnoser.plumbing.source import PrometheusSource
from diagnoser.request import Scope
from diagnoser.sim import library
from diagnoser.webhook.payload import FiringAlert
from diagnoser.webhook.receiver import Webhook, scope_of
from lab.alerts import backfill_rules, firing, needed
from lab.promserver import Prometheus

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules"
RECORDING, ALERTS = RULES / "recording.rules.yaml", RULES / "alerts.rules.yaml"
# The recording rules the alerts read (diagnose reads none): only these are backfilled.
READ = needed(RECORDING, ALERTS)


@pytest.mark.promtool
@pytest.mark.parametrize("name", library.names())
def test_every_alert_that_fires_is_diagnosed_and_ranked_first(
    name, scenario_library, site, tmp_path
):
    sc = library.find(name)
    prepared = scenario_library[name]
    data = tmp_path / "tsdb"
    shutil.copytree(prepared.data_dir, data)
    window = Window.plan(sc.labels.window, prepared.end)
    with Prometheus(data) as prom:
        backfill_rules(prom, RECORDING, window.first - 3600, window.end, only=READ)
        fired = firing(prom, ALERTS, window.start, window.end)
        if sc.labels.healthy:
            assert not fired, f"{name}: a healthy scenario fired {[f.alert for f in fired]}"
            return
        # One diagnosis per scope: the alerts of one model ask the same question.
        diagnosed: dict[tuple[tuple[str, str], ...], Diagnosis] = {}
        for f in fired:
            alert = FiringAlert(f.alert, "firing", f.labels, {})
            scope = scope_of(alert, site.config)
            key = tuple(sorted(scope.items()))
            if key not in diagnosed:
                diagnosed[key] = diagnose(
                    PrometheusSource(prom.url),
                    site,
                    window,
                    Scope(labels=tuple(scope.items())).matchers(),
                )
            result = diagnosed[key]
            ids = [m.playbook.id for m in result.findings]
            ended = [m.playbook.id for m in (*result.resolved, *result.ended_before)]
            if "playbook" not in f.labels:
                sick = [h for h in result.health if h.verdict == "unhealthy"]
                # After a recovery the model may be healthy again while a burn-rate alert,
                # which looks back hours, still fires for the incident that ended.
                assert sick or sc.labels.recovered, (
                    f"{name}: {f.alert} fired for {scope}, diagnose says {result.health}"
                )
                continue
            if f.labels["playbook"] in ended and f.labels["playbook"] not in ids:
                # An alert for an incident that ended in the window: reported as ended.
                assert f.labels["playbook"] in {*sc.labels.resolved, *sc.labels.ended}, (
                    f"{name}: {f.alert} fired, diagnose says its incident ended"
                )
                continue
            hook = Webhook(PrometheusSource(prom.url), site, lambda r: None)
            record = hook.record(alert, "g", scope, result, None)
            if f.labels["playbook"] not in ids:
                # Only a cause the catalog says accounts for the alert's symptoms may stand in
                # for its playbook, and it is then named first.
                assert record["explained_by"] and record["top_finding"] == record["explained_by"], (
                    f"{name}: {f.alert} fired at {f.at:.0f} for {scope}, diagnose found {ids}"
                )
                continue
            rank = record["playbook_rank"]
            ordered = result.for_alert(f.labels["playbook"])
            explained = ordered[rank - 1].explained_by == ordered[0].playbook.id
            assert rank == 1 or (rank == 2 and explained), (name, f.alert, record["top_finding"])


def test_only_the_recording_rules_the_alerts_read_are_backfilled(tmp_path):
    rec, alerts = tmp_path / "recording.yaml", tmp_path / "alerts.yaml"
    rec.write_text(
        "groups:\n- name: g\n  rules:\n"
        "  - {record: 'm:x:rate5m', expr: 'rate(x[5m])'}\n"
        "  - {record: 'm:x:rate5m_max', expr: 'max(m:x:rate5m)'}\n"
        "  - {record: 'm:y:ratio', expr: 'm:x:rate5m / 2'}\n"
        "  - {record: 'm:z:rate5m', expr: 'rate(z[5m])'}\n"
    )
    alerts.write_text(
        "groups:\n- name: a\n  rules:\n  - {alert: A, expr: 'm:y:ratio > 1 and on() up'}\n"
    )
    # Through m:y:ratio to m:x:rate5m; not the longer name that starts like it, nor m:z.
    assert needed(rec, alerts) == {"m:y:ratio", "m:x:rate5m"}
    generated = RECORDING.read_text().count("- record: ")
    assert 0 < len(READ) < generated


def test_a_page_on_a_healthy_stretch_is_one_that_began_there():
    from lab.alertbench import Case
    from lab.alerts import Episode, _runs

    # Evaluations every 30 s with a gap after 90: two runs.
    assert _runs([0.0, 30.0, 60.0, 90.0, 300.0, 330.0], 30.0) == [(0.0, 90.0), (300.0, 330.0)]
    began_inside = Episode("A", {}, pending=1200.0, at=1320.0, until=1500.0)
    carried_over = Episode("B", {}, pending=900.0, at=1020.0, until=1300.0)
    before = Episode("C", {}, pending=0.0, at=120.0, until=600.0)
    case = Case("c", "healthy", ((1000.0, 2000.0),), (began_inside, carried_over, before))
    assert case.pages() == [began_inside]
    assert case.carried() == [carried_over]
    assert case.hours == 1000.0 / 3600.0
