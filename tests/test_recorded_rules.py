"""``diagnose --recorded-rules``: the site's recording rules read in place of the servers'
series, in a real Prometheus with the generated rules backfilled over a scenario's history.

Evaluated on the grid the diagnosis reads (every 15 s from a minute on its step grid), the
rules hold at each step exactly what the expression gives there, so the diagnosis must be the
same, finding for finding and number for number. Off that grid (rules evaluated at other
seconds, as a live Prometheus does), each step reads the rule's value of up to an interval
before: the same cause comes first and every model gets the same verdict, while a finding on
the edge of its thresholds may come or go, as it does when the window moves by seconds.
Where the recorded series cannot stand in (a matcher on a label they do not keep, a window
read at rates under five minutes, rules deployed since the baseline began), nothing is read
from them, and the report says why.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import diagnoser
from diagnoser.diagnosis import Window, diagnose
from diagnoser.diagnosis.model import Diagnosis
from diagnoser.plumbing.source import OverLimit, PrometheusSource
from diagnoser.report import render
from diagnoser.sim import library
from lab.alerts import backfill_rules, levels
from lab.promserver import Prometheus
from tests.clitest import run

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "rules" / "recording.rules.yaml"
SCENARIOS = ("kv-cache-pressure", "healthy-steady", "mixed-fleet-retrieval", "the-128k-upgrade")


def _said(d: Diagnosis) -> dict[str, object]:
    """Everything the JSON report says but how it read the store."""
    doc = json.loads(render(d, "json"))
    doc.pop("stats")
    return doc


def _served(prepared, tmp_path: Path, name: str) -> Path:
    data = tmp_path / name
    shutil.copytree(prepared.data_dir, data)
    return data


@pytest.mark.promtool
@pytest.mark.parametrize("name", SCENARIOS)
def test_the_recorded_rules_give_the_same_diagnosis(name, scenario_library, site, tmp_path):
    prepared = scenario_library[name]
    window = Window.plan(library.find(name).labels.window, prepared.end)
    with Prometheus(_served(prepared, tmp_path, "tsdb")) as prom:
        # Every 15 s from ten minutes before the first step: on every step (60 s, 75 s).
        backfill_rules(prom, RECORDING, window.first - 600, window.end, 15, stale=True)
        source = PrometheusSource(prom.url)
        raw = diagnose(source, site, window)
        recorded = diagnose(source, site, window, recorded_rules=True)
        api = diagnoser.diagnose(
            prom.url, since=window.end - window.start, until=window.end, recorded_rules=True
        )
    assert raw.recorded == 0 and raw.not_recorded is None
    # Every model-level signal the scenario's servers give: 52 of the 64 for a vLLM without
    # the probe, LoRA, a KV connector or speculative decoding (their rules record nothing).
    assert recorded.recorded >= 50, recorded.not_recorded
    assert recorded.queries == raw.queries + 3
    assert _said(recorded) == _said(raw)
    assert "signals read from the site's recording rules" in render(recorded, "text")
    # The Python API asks for the same reading.
    assert api.recorded == recorded.recorded
    assert _said(api) == _said(recorded)


@pytest.mark.promtool
def test_rules_evaluated_at_other_seconds_find_the_same_causes(scenario_library, site, tmp_path):
    name = "kv-cache-pressure"
    prepared = scenario_library[name]
    window = Window.plan(library.find(name).labels.window, prepared.end)
    with Prometheus(_served(prepared, tmp_path, "tsdb")) as prom:
        backfill_rules(prom, RECORDING, window.first - 617, window.end, stale=True)
        source = PrometheusSource(prom.url)
        raw = diagnose(source, site, window)
        recorded = diagnose(source, site, window, recorded_rules=True)
    assert recorded.recorded >= 50
    assert recorded.findings[0].playbook.id == raw.findings[0].playbook.id == name
    assert [h.verdict for h in recorded.health] == [h.verdict for h in raw.health]
    # What differs is on the edge: 17 s earlier, half the window's minutes over five waiting
    # requests is one minute more (0.508 against the threshold's 0.5), and queue-saturation
    # comes second at 0.28.
    assert all(m.confidence < 0.5 for m in recorded.findings[1:] + raw.findings[1:])


@pytest.mark.promtool
def test_where_the_records_cannot_stand_in_nothing_is_read_from_them(
    scenario_library, site, tmp_path
):
    name = "kv-cache-pressure"
    prepared = scenario_library[name]
    window = Window.plan(library.find(name).labels.window, prepared.end)
    with Prometheus(_served(prepared, tmp_path, "tsdb")) as prom:
        source = PrometheusSource(prom.url)
        # No rule deployed.
        none = diagnose(source, site, window, recorded_rules=True)
        assert none.recorded == 0
        assert none.not_recorded == "no recording rule of this site's signals is held"
        # Rules deployed half an hour ago: the baseline has none.
        backfill_rules(prom, RECORDING, window.end - 1800, window.end, stale=True)
        source = PrometheusSource(prom.url)
        late = diagnose(source, site, window, recorded_rules=True)
        assert late.recorded == 0
        assert late.not_recorded.startswith("the recording rules' series begin at ")
        assert _said(late) == _said(diagnose(source, site, window))
        # A matcher on a label the recorded series do not keep.
        scoped = diagnose(source, site, window, ['instance=~".+"'], recorded_rules=True)
        assert scoped.recorded == 0
        assert scoped.not_recorded == "the recorded series have no instance label"
        # A window of minutes, read at rates under the rules' five minutes.
        short = Window.plan(600, window.end).with_step(15)
        fine = diagnose(source, site, short, recorded_rules=True)
        assert fine.recorded == 0
        assert fine.not_recorded == "the window's rates (60s) are under the rules' 5m"
        args = ["--since", "1h", "--until", f"{window.end:.0f}", "--match", 'instance=~".+"']
        text = run("diagnose", "--prometheus-url", prom.url, "--recorded-rules", *args)
    assert text.exit_code == 0, text.output
    assert "no recording rule read: the recorded series have no instance label" in text.output


class _Refusing:
    """A store that refuses every query as over its sample limit."""

    def query(self, expr: str, at: float) -> list:
        raise OverLimit("http://store", "query", "query processing would load too many samples")

    def query_range(self, expr: str, start: float, end: float, step: float) -> list:
        return self.query(expr, start)


def test_a_store_that_refuses_the_rules_probe_is_named_in_one_line(site):
    from diagnoser.diagnosis import recorded
    from diagnoser.diagnosis.fetch import needed_signals

    window = Window.plan(3600, 1_800_000_000)
    with pytest.raises(OverLimit) as exc:
        recorded.plan(_Refusing(), site, site, needed_signals(site), window)
    said = str(exc.value)
    assert "the query for the recording rules' series (--recorded-rules)" in said
    assert "\n" not in said and "narrow the diagnosis" in said


def _rules_from_the_future(at: float):
    """A store holding the recording rules, whose request-rate record's only point is at
    ``at`` (1e12 s: the year 33658; 1e18 s: no year at all), and the servers' from the
    window's first step; every other query has no series."""
    from urllib.parse import parse_qs, urlsplit

    from loopback import EMPTY, answer

    def respond(h, f) -> None:
        params = {k: v[0] for k, v in parse_qs(urlsplit(h.path).query).items()}
        expr = params.get("query", "")
        result: list[dict[str, object]] = []
        if expr.startswith("group by (__name__)"):
            result = [
                {"metric": {"__name__": n}, "value": [float(params["time"]), "1"]}
                for n in ("model_name:vllm_request_success:rate5m",)
            ]
        elif expr.startswith("count(model_name:vllm_request_success:rate5m"):
            result = [{"metric": {}, "values": [[at, "1"]]}]
        elif expr.startswith("count("):
            result = [{"metric": {}, "values": [[float(params["start"]), "1"]]}]
        answer(h, {**EMPTY, "data": {"resultType": "matrix", "result": result}})

    return respond


@pytest.mark.parametrize("at", [1e12, 1e18])
def test_a_record_dated_past_any_calendar_is_left_out_with_a_note(at, site):
    from loopback import post_alerts, serve, wait_for
    from notifications import alert, notification
    from webhooks import running

    from diagnoser.webhook.receiver import Webhook

    said = f"1 series whose times are not dates between 1970 and 9999 (one at {at:g} s)"
    with serve(_rules_from_the_future(at)) as prom:
        args = ["--since", "1h", "--until", "1800000000", "--recorded-rules", "--format", "json"]
        res = run("diagnose", "--prometheus-url", prom.url, *args)
        assert res.exit_code == 0, res.output
        stats = json.loads(res.stdout)["stats"]
        assert stats["recorded_signals"] == 0
        assert stats["not_recorded"].startswith("the recording rules' series are not in")
        assert any(said in w for w in stats["warnings"]), stats["warnings"]
        # The webhook reads the rules too: its record says the same, with no error.
        records: list[dict] = []
        source = PrometheusSource(prom.url)
        hook = Webhook(source, site, records.append, recorded_rules=True, now=lambda: 1.8e9)
        with running(hook) as url:
            assert post_alerts(url, notification(alert()))[0] == 200
            (record,) = wait_for(lambda: records, 30)
    assert record["error"] is None
    assert any(said in w for w in record["diagnosis"]["stats"]["warnings"])


def test_rules_that_read_other_rules_are_backfilled_after_them():
    """Evaluated at once on the raw series, the availability ratios would find no recorded
    downtime to read (Prometheus evaluates them after the rule that records it)."""
    first, *later = levels(RECORDING)
    assert "model_name:slo_availability:all_down" in first
    assert later and "model_name:slo_availability:error_ratio_rate1h" in later[0]
    assert "model_name:slo_availability:error_ratio_rate1h" not in first
