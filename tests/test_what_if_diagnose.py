"""diagnose --what-if against a real Prometheus: the finding's fix's levers predicted under it
(text, JSON, Markdown), nothing else in the report changed, and a what-if that cannot be made
said on each finding without changing the exit status."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
from clitest import one_line, run

from diagnoser.catalog.levers import parse_lever
from diagnoser.sim.scenario import load_scenario
from lab import harness
from lab.promserver import Prometheus
from lab.whatifbench import SERVER

pytestmark = pytest.mark.prometheus

HERE = Path(__file__).resolve().parent
SC = load_scenario(HERE / "scenarios" / "what-if-finding.yaml")
SETUP = SERVER  # the what-if test server, as the benchmark gives it


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    prepared = harness.prepare([SC], tmp_path_factory.mktemp("what-if-finding"))[SC.name]
    with Prometheus(prepared.data_dir) as prom:
        yield prom.url, prepared.end


def _diagnose(server, *args: str):
    url, end = server
    window = f"{int(SC.labels.window)}s"
    return run(
        "diagnose", "--prometheus-url", url, "--until", str(int(end)), "--since", window, *args
    )


def _without_timing(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    doc["stats"].pop("query_seconds")
    return doc


@pytest.fixture(scope="module")
def plain(server):
    res = _diagnose(server, "--format", "json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def predicted(server):
    res = _diagnose(server, "--what-if", *SETUP, "--format", "json")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)


def test_each_finding_carries_its_fixs_levers_predicted(predicted, catalog):
    (finding,) = predicted["findings"]
    assert finding["id"] == "oversized-batch"
    w = finding["what_if"]
    assert w["error"] is None and w["calibration"]["ok"] is True
    assert w["model"] == SC.models[0].name
    # The window diagnosed is the window fitted.
    assert w["window"]["start"] == predicted["window"]["start"]
    assert w["window"]["end"] == predicted["window"]["end"]
    levers = [parse_lever(t) for t in catalog["oversized-batch"].levers]
    assert [lever["lever"] for lever in w["levers"]] == [lever.text for lever in levers]
    for got, lever in zip(w["levers"], levers, strict=True):
        assert got["restart"] is lever.restart and got["error"] is None
        assert set(got["band"]) == set(got["predicted"])
    by = {lever["lever"]: lever["predicted"] for lever in w["levers"]}
    # A second server halves the batch: each stream's steps get faster.
    assert by["replicas:+1"]["itl_p95"] < 0.8 * w["today"]["itl_p95"]
    assert by["replicas:+1"]["tokens_per_second"] == pytest.approx(
        w["today"]["tokens_per_second"], rel=0.1
    )


def test_without_what_if_the_report_is_unchanged_and_with_it_only_added_to(plain, predicted):
    assert all("what_if" not in f for f in plain["findings"])
    added = _without_timing(predicted)
    for f in added["findings"]:
        f.pop("what_if")
    assert added == _without_timing(plain)


def test_the_text_report_prints_the_levers_under_the_finding(server):
    res = _diagnose(server, "--what-if", *SETUP)
    assert res.exit_code == 0, res.stderr
    finding = res.stdout.split("[oversized-batch]", 1)[1].split("\n\n", 1)[0]
    lines = finding.splitlines()
    head = next(i for i, ln in enumerate(lines) if "what-if, the window replayed" in ln)
    table = lines[head:]
    assert any(ln.split()[:1] == ["today"] for ln in table)
    assert any(ln.split()[:1] == ["max_num_seqs:x0.75*"] and "±" in ln for ln in table)
    assert any(ln.split()[:1] == ["replicas:+1"] and "±" in ln for ln in table)
    assert "max_num_seqs 256 -> 192" in " ".join(ln.strip() for ln in table)


def test_markdown_holds_the_same_table(server):
    res = _diagnose(server, "--what-if", *SETUP, "--format", "markdown")
    assert res.exit_code == 0, res.stderr
    block = res.stdout.split("**What-if.**", 1)[1].split("```")[1]
    assert "replicas:+1" in block and "today" in block


def test_a_what_if_that_cannot_be_made_is_said_on_its_finding_and_diagnose_stands(server, plain):
    # No preset: the served name is no model shape anyone knows.
    res = _diagnose(server, "--what-if", "--gpu", "H100-80GB", "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    (finding,) = doc["findings"]
    w = finding.pop("what_if")
    assert "give --model-config" in w["error"]
    assert all(lever["predicted"] is None and lever["error"] for lever in w["levers"])
    assert _without_timing(doc) == _without_timing(plain)
    text = _diagnose(server, "--what-if", "--gpu", "H100-80GB")
    assert text.exit_code == 0
    assert text.stdout.count("what-if: not predicted:") == 1
    assert "give --model-config" in " ".join(text.stdout.split())


def test_what_if_is_refused_where_it_is_not_shown(server):
    one_line(_diagnose(server, "--what-if", "--format", "csv"), 2, "--what-if")
    one_line(_diagnose(server, "--what-if", "--explain", "oversized-batch"), 2, "--what-if")


def test_the_python_api_asks_for_the_same_what_if_as_the_command_line(server, predicted):
    import diagnoser
    from diagnoser.whatif.setup import SetupOptions

    url, end = server
    setup = SetupOptions(
        preset="llama-2-7b",
        gpu_name="H100-80GB",
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        max_model_len=4096,
    )
    d = diagnoser.diagnose(url, since=SC.labels.window, until=end, what_if=setup)
    doc = d.to_json()
    assert [f["id"] for f in doc["findings"]] == [f["id"] for f in predicted["findings"]]
    api, cli = doc["findings"][0]["what_if"], dict(predicted["findings"][0]["what_if"])
    assert api.pop("seconds") > 0 and cli.pop("seconds") > 0  # how long each took
    assert api == cli
    # Without it, a finding carries no what-if at all (the JSON contract unchanged).
    assert (
        "what_if"
        not in diagnoser.diagnose(url, since=SC.labels.window, until=end).to_json()["findings"][0]
    )
    with pytest.raises(TypeError, match="what_if must be a bool or a SetupOptions"):
        diagnoser.diagnose(url, since=SC.labels.window, until=end, what_if="yes")  # type: ignore[arg-type]


def test_the_what_if_shares_the_diagnosiss_deadline_and_the_diagnosis_stands(server, plain):
    t0 = time.monotonic()
    res = _diagnose(server, "--what-if", *SETUP, "--timeout", "2.5", "--format", "json")
    took = time.monotonic() - t0
    assert took < 3.5, took  # the diagnosis and the what-if together, in the one --timeout
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    (finding,) = doc["findings"]
    w = finding.pop("what_if")
    assert "the deadline passed" in w["error"]
    assert all(lever["error"] for lever in w["levers"])
    assert _without_timing(doc) == _without_timing(plain)


def test_the_python_apis_what_if_keeps_its_timeout(server):
    import diagnoser
    from diagnoser.whatif.setup import SetupOptions

    url, end = server
    setup = SetupOptions(preset="llama-2-7b", gpu_name="H100-80GB", max_num_seqs=256)
    t0 = time.monotonic()
    d = diagnoser.diagnose(url, since=SC.labels.window, until=end, what_if=setup, timeout=2.5)
    assert time.monotonic() - t0 < 3.5
    (finding,) = d.to_json()["findings"]
    assert "the deadline passed" in finding["what_if"]["error"]


def test_an_answer_the_what_if_cannot_use_is_said_on_its_finding(server, plain):
    from loopback import serve
    from test_what_if import bad_bucket, hostile

    url, end = server
    with serve(hostile(url, bad_bucket)) as api:
        res = _diagnose((api.url, end), "--what-if", *SETUP, "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    (finding,) = doc["findings"]
    assert "le='abc', which is no bound" in finding.pop("what_if")["error"]
    assert _without_timing(doc) == _without_timing(plain)


def test_any_failure_of_a_what_if_is_one_line_on_its_finding(server, plain, monkeypatch):
    from diagnoser.whatif import setup

    def broken(*args, **kwargs):
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setattr(setup, "predict", broken)
    res = _diagnose(server, "--what-if", *SETUP, "--format", "json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    (finding,) = doc["findings"]
    said = finding.pop("what_if")["error"]
    assert said == "the what-if failed: RuntimeError: a bug over two lines"
    assert _without_timing(doc) == _without_timing(plain)
