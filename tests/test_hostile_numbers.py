"""Hostile numbers and shapes end in one line and the documented exit status, or in a right
answer, never in a traceback: whole numbers of hundreds or thousands of digits in every file
and answer servediag reads, booleans and strings where numbers go, values that overflow to
infinity, NaN and infinities in the JSON report, JSON nested thousands deep in a server's
stream or a client's request, and an ``slo.overrides`` that is not a list."""

from __future__ import annotations

import json
import textwrap
import urllib.error
import urllib.request

import pytest
from clitest import SCENARIO, diagnose_answered, one_line, run
from live_simulator import live_simulator
from loopback import answer, post_alerts, serve
from model_config import CONFIG
from webhooks import running

from lab.promserver import free_port

BIG = "1" * 400  # Python reads it, but no float holds it
HUGE = "1" * 5000  # past the 4,300 digits Python agrees to read at all
HEX = "0x" + "f" * 6000  # a YAML integer read in base 16, which has no digit limit


def strict_json(text: str):
    """JSON as every other parser reads it: ``NaN`` and ``Infinity`` are not JSON."""

    def refuse(word: str):
        raise ValueError(f"{word} is not JSON")

    return json.loads(text, parse_constant=refuse)


# --- the site config ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (f"traffic_floor_rps: {BIG}", "traffic_floor_rps: a whole number of about 400 digits"),
        (f"ttft_slo_seconds: {BIG}", "ttft_slo_seconds: a whole number of about 400 digits"),
        (f"slo: {{availability: {BIG}}}", "slo.availability: a whole number of about 400"),
        (f"slo: {{period: {BIG}}}", "slo.period: a whole number"),
        (
            f"alerts: {{VllmKvCachePressure: {{params: {{kv_usage: {BIG}}}}}}}",
            "alerts.VllmKvCachePressure.params.kv_usage: a whole number",
        ),
        (f"{BIG}: x", "(top level): a whole number"),
        (f"traffic_floor_rps: {HUGE}", "holds a number of thousands of digits"),
        (f"traffic_floor_rps: {HEX}", "traffic_floor_rps: a whole number of about 72"),
        (f"scrape_interval: {BIG}s", "scrape_interval: must be at most 1h"),
        (
            f"alerts: {{VllmKvCachePressure: {{for: {BIG}d}}}}",
            "alerts.VllmKvCachePressure.for: must be at most 3650d",
        ),
        ("traffic_floor_rps: true", "traffic_floor_rps: must be a non-negative number"),
        ("traffic_floor_rps: '0.5'", "traffic_floor_rps: must be a non-negative number"),
        ("slo: {overrides: 5}", "slo.overrides: must be a list of overrides"),
        ("slo: {overrides: {match: 'model_name=\"m\"'}}", "slo.overrides: must be a list"),
        ("slo: {overrides: [5]}", "slo.overrides[0]: needs match"),
    ],
)
def test_a_site_config_with_a_hostile_number_is_one_line(tmp_path, content, says):
    cfg = tmp_path / "site.yaml"
    cfg.write_text(content + "\n")
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    one_line(res, 2, str(cfg), says)
    assert not (tmp_path / "out").exists()


# --- a playbook and a scenario --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "says"),
    [
        (BIG, "signature.absolute[0].above: a whole number of about 400 digits"),
        (HUGE, "holds a number of thousands of digits"),
        ("true", "signature.absolute[0].above: True is not of type 'number'"),
    ],
)
def test_a_playbook_with_a_hostile_threshold_is_one_line(tmp_path, site, value, says):
    text = site.catalog["queue-saturation"].path.read_text()
    old = "{signal: requests_waiting, above: 5, held: 0.5, param: waiting}"
    assert old in text
    text = text.replace(old, old.replace("above: 5", f"above: {value}"))
    text = text.replace("id: queue-saturation", "id: queue-saturation-mine")
    text = text.replace("VllmRequestQueueSaturated", "VllmRequestQueueSaturatedMine")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "queue-saturation-mine.yaml").write_text(text)
    one_line(run("catalog", "validate", str(mine)), 2, "queue-saturation-mine.yaml", says)


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("rate: {mean: 1}", f"rate: {{mean: {BIG}}}", "models[0].workload.rate.mean: a whole"),
        ("median: 400", f"median: {BIG}", "models[0].workload.prompt.median: a whole number"),
        ("sigma: 0.4}\n      output", f"sigma: {BIG}}}\n      output", "prompt.sigma: a whole"),
        ("duration: 20m", f"duration: {BIG}", "duration: a whole number of about 400 digits"),
        ("scrape_interval: 15s", f"scrape_interval: {BIG}", "scrape_interval: a whole number"),
        ("window: 10m", f"window: {BIG}", "labels.window: a whole number"),
        ("seed: 1", f"seed: {HUGE}", "holds a number of thousands of digits"),
    ],
)
def test_a_scenario_with_a_hostile_number_is_one_line(tmp_path, old, new, says):
    assert old in SCENARIO
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.replace(old, new, 1))
    one_line(run("simulate", str(path), "--out", str(tmp_path / "x.om")), 2, str(path), says)
    assert not (tmp_path / "x.om").exists()


# --- a model's config.json ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantization", "says"),
    [
        ('{"quant_method": "gptq", "bits": ' + BIG + "}", "bits: must be a whole number of bits"),
        ('{"quant_method": "gptq", "bits": true}', "quantization_config.bits: must be a whole"),
        (
            '{"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": '
            '{"num_bits": ' + BIG + "}}}}",
            "config_groups.g.weights.num_bits: must be a whole number of bits",
        ),
    ],
)
def test_a_config_json_with_a_hostile_width_is_one_line(tmp_path, quantization, says):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG)[:-1] + ', "quantization_config": ' + quantization + "}")
    line = one_line(run("kv-budget", "--model", str(path)), 2, str(path), says)
    assert BIG not in line  # the number is not printed whole


# --- a Prometheus answer --------------------------------------------------------------------


def _matrix(values: list, metric: dict | None = None) -> bytes:
    series = {"metric": metric or {"model_name": "m"}, "values": values}
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": [series]}}
    ).encode()


@pytest.mark.parametrize(
    "body",
    [
        _matrix([[0, "1"]]).replace(b"[0,", b"[" + BIG.encode() + b","),  # a time of 400 digits
        _matrix([[1700000000, "1"]]).replace(b"1700000000", b"1e400"),  # a time past floats
        _matrix([[True, "1"]]),
        _matrix([[1700000000, True]]),
        _matrix([[1700000000, None]]),
        _matrix([[1700000000, "1"]], {"model_name": 5}),
        _matrix([[1700000000, "1"]], {"model_name": {"nested": "object"}}),
    ],
    ids=[
        "time-400-digits",
        "time-1e400",
        "time-true",
        "value-true",
        "value-null",
        "label-5",
        "label-object",
    ],
)
def test_an_answer_with_hostile_numbers_or_shapes_is_a_source_failure(body):
    res = diagnose_answered(body, "--until", "1700000000")
    one_line(res, 3, "not in Prometheus's format")


def _every_query(value: str, every: int = 2) -> bytes:
    """Every series of every query: a target of model m whose samples are ``value`` (one in
    ``every``, the others 1)."""
    labels = {"model_name": "m", "instance": "i:8000", "job": "vllm"}
    pts = [[1700000000 - 15 * i, value if i % every == 0 else "1"] for i in range(480)]
    return _matrix(pts, labels)


def test_series_of_nan_only_are_no_value_not_a_warning():
    body = _every_query("NaN", every=1)  # numpy warns on the peak of an all-NaN series
    res = diagnose_answered(body, "--until", "1700000000")
    assert res.exit_code == 0 and not res.stderr, res.stderr[-2000:]


@pytest.mark.parametrize("value", ["1e308", "-1e308", "1e200", "+Inf", "NaN"])
@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_values_that_overflow_are_reported_not_a_traceback(value, fmt):
    body = _every_query(value)
    res = diagnose_answered(body, "--until", "1700000000", "--timeout", "60", "--format", fmt)
    assert res.exit_code == 0, res.stderr[-2000:]
    if fmt == "json":
        doc = strict_json(res.stdout)
        assert isinstance(doc["non_finite"], list)


def test_json_writes_nan_and_infinity_as_null_and_says_where():
    body = _every_query("1e200")  # sums and shares overflow to infinity, or NaN
    res = diagnose_answered(body, "--until", "1700000000", "--format", "json")
    assert res.exit_code == 0, res.stderr[-2000:]
    doc = strict_json(res.stdout)
    assert doc["non_finite"], "1e200 in every series should overflow somewhere"
    for item in doc["non_finite"]:
        assert item["value"] in ("NaN", "+Inf", "-Inf")
        node = doc
        for part in item["field"].replace("]", "").replace("[", ".").split("."):
            node = node[int(part)] if isinstance(node, list) else node[part]
        assert node is None, item


def test_finite_replaces_every_non_finite_number_and_names_it():
    from diagnoser.plumbing.finite import finite

    doc, found = finite({"a": [1.0, float("nan")], "b": {"c": float("-inf")}, "d": "NaN"})
    assert doc == {"a": [1.0, None], "b": {"c": None}, "d": "NaN"}
    assert found == [{"field": "a[1]", "value": "NaN"}, {"field": "b.c", "value": "-Inf"}]


def test_counts_that_overflow_are_whole_numbers():
    import numpy as np

    from diagnoser.catalog.shapes.base import MOST_COUNTED, events, whole

    assert events(np.array([1e308, 1e308, -1e308, 1e308])) == MOST_COUNTED
    assert whole(float("inf")) == MOST_COUNTED and whole(float("nan")) == 0
    assert whole(-3.0) == 0 and whole(2.4) == 2


# --- the probe's stream ---------------------------------------------------------------------


def _sse(*events: bytes):
    def respond(h, f):
        body = b"".join(b"data: " + e + b"\n\n" for e in events)
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    return respond


TOKEN = json.dumps({"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}).encode()


@pytest.mark.parametrize("count", [BIG, "true", "-5", "1.5", '"128"'])
def test_a_usage_count_that_cannot_be_one_is_not_shown(count):
    usage = b'{"choices": [], "usage": {"prompt_tokens": ' + count.encode() + b"}}"
    with serve(_sse(TOKEN, usage, b"[DONE]")) as target:
        res = run("probe", "--target", target.url, "--model", "m", "--once", "--classes", "128")
    assert res.exit_code == 0, res.stderr[-2000:]
    row = res.stdout.splitlines()[1]
    assert row.split()[:4] == ["128", "128", "-", "ok"], row


def test_the_probe_exports_a_usage_count_it_can_read():
    usage = b'{"choices": [], "usage": {"prompt_tokens": 135}}'
    with serve(_sse(TOKEN, usage, b"[DONE]")) as target:
        res = run("probe", "--target", target.url, "--model", "m", "--once", "--classes", "128")
    assert res.exit_code == 0, res.stderr[-2000:]
    assert res.stdout.splitlines()[1].split()[:4] == ["128", "128", "135", "ok"]


@pytest.mark.parametrize(
    "chunk", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000]
)
def test_json_nested_thousands_deep_in_the_stream_is_an_error_outcome(chunk):
    with serve(_sse(TOKEN, chunk, b"[DONE]")) as target:
        res = run("probe", "--target", target.url, "--model", "m", "--once", "--classes", "128")
    assert res.exit_code == 1, res.stderr[-2000:]
    assert "http_error" in res.stdout and "the stream carries invalid JSON" in res.stdout


def test_json_nested_thousands_deep_from_v1_models_is_one_line():
    deep = b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with serve(lambda h, f: answer(h, deep)) as target:
        res = run("probe", "--target", target.url, "--once", "--classes", "128")
    one_line(res, 3, "/v1/models", "the answer is not JSON")


# --- the simulator's OpenAI endpoint --------------------------------------------------------


@pytest.fixture
def simulator(tmp_path):
    from diagnoser.sim.scenario import load_scenario

    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(SCENARIO))
    with live_simulator(load_scenario(path)) as address:
        yield f"http://{address}"


def _post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": '
        + b'{"a":' * 50_000
        + b"1"
        + b"}" * 50_000
        + b"}",
    ],
)
def test_the_simulators_chat_endpoint_answers_deep_json_400_and_keeps_serving(simulator, body):
    status, doc = _post(simulator, body)
    assert status == 400 and "nested too deeply" in doc["error"]["message"]
    ok = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
    assert _post(simulator, ok)[0] == 200


# --- the webhook ----------------------------------------------------------------------------


def test_a_webhook_body_with_a_number_of_thousands_of_digits_is_answered_400(site):
    from diagnoser.plumbing.source import PrometheusSource
    from diagnoser.webhook.receiver import Webhook

    records: list = []
    hook = Webhook(PrometheusSource(f"http://127.0.0.1:{free_port()}"), site, records.append)
    with running(hook, drain=5.0) as url:
        body = b'{"version": "4", "groupKey": "g", "alerts": [], "x": ' + HUGE.encode() + b"}"
        code, answered = post_alerts(url, body)
        assert code == 400 and "digits (at most" in answered["error"]
        assert post_alerts(url, {"version": "4", "groupKey": "g", "alerts": []})[0] == 200
