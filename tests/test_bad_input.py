"""Bad input never ends in a traceback: one line on stderr that names the option, the file or
the field, and the documented exit status (2 bad usage or input, 3 the metric source failed).
Also the simulator's own input checks (labels, timeline, --out, --serve), which used to be
found late or not at all."""

from __future__ import annotations

import contextlib
import json
import socket

import pytest
from clitest import SCENARIO, one_line, run
from loopback import answer, serve
from model_config import CONFIG

from lab.promserver import free_port


def unreachable() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def answering():
    """A loopback HTTP server that answers every request with one JSON document."""
    with contextlib.ExitStack() as servers:

        def start(doc: object, status: int = 200) -> str:
            body = json.dumps(doc).encode()
            return servers.enter_context(serve(lambda h, f: answer(h, body, status))).url

        yield start


# --- diagnose -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--until", "nan"), "--until: 'nan'"),
        (("--until", "inf"), "--until: 'inf'"),
        (("--until", "1e20"), "--until: '1e20'"),
        (("--since", "99999999999d"), "--since: '99999999999d'"),
        (("--lookback", "nan"), "--lookback: 'nan'"),
        (("--baseline", "99999999999d"), "--baseline: '99999999999d'"),
        (("--timeout", "nan"), "--timeout: 'nan'"),
        (("--format", "xml"), "--format: 'xml'"),
        (("--match", "foo"), "--match 'foo'"),
    ],
)
def test_diagnose_options_out_of_range_are_one_line_naming_the_option(args, says):
    one_line(run("diagnose", "--prometheus-url", unreachable(), *args), 2, says)


def test_a_token_file_that_is_not_text_is_one_line(tmp_path):
    token = tmp_path / "token"
    token.write_bytes(b"\xff\xfe\xfa\x00")
    res = run("diagnose", "--prometheus-url", unreachable(), "--bearer-token-file", str(token))
    one_line(res, 2, "--bearer-token-file", "not UTF-8")


@pytest.mark.parametrize(
    "series",
    [
        {"metric": None, "values": [[1_700_000_000, "1"]]},
        {"metric": ["model_name"], "values": [[1_700_000_000, "1"]]},
        {"metric": {}, "values": None},
        "a string where a series should be",
    ],
)
def test_an_answer_with_malformed_series_is_a_source_failure(answering, series):
    url = answering({"status": "success", "data": {"resultType": "matrix", "result": [series]}})
    res = run("diagnose", "--prometheus-url", url, "--until", "1700000000")
    one_line(res, 3, "not in Prometheus's format")


def test_an_unwritable_output_is_refused_before_any_query(tmp_path):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "report.html"
    res = run("diagnose", "--prometheus-url", unreachable(), "--output", str(out))
    one_line(res, 2, "--output", "not a directory")


# --- kv-budget ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "option", ["--gpu-memory-gb", "--gpu-memory-utilization", "--weights-gb", "--overhead-gb"]
)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_kv_budget_refuses_numbers_that_are_not_finite(option, value):
    res = run("kv-budget", "--model", "llama-3.1-8b", option, value)
    one_line(res, 2, option)


def test_kv_budget_at_nan_is_one_line():
    res = run("kv-budget", "--prometheus-url", unreachable(), "--at", "nan")
    one_line(res, 2, "--at: 'nan'")


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (json.dumps({**CONFIG, "hidden_size": 1e308}), "hidden_size: must be at most"),
        (json.dumps(CONFIG).replace("4096", "1" + "0" * 5000, 1), "thousands of digits"),
        (json.dumps({**CONFIG, "num_hidden_layers": 10**30}), "num_hidden_layers: must be at"),
        ("[" * 100_000 + "]" * 100_000, "nested deeper than"),
        ('{"a": ' * 100 + "1" + "}" * 100, "nested deeper than"),
        (json.dumps(CONFIG).replace("4096", "NaN", 1), "NaN is not a JSON number"),
        (json.dumps(CONFIG).replace("4096", "Infinity", 1), "Infinity is not a JSON number"),
        ("5", "must be a JSON object"),
        ('"a string"', "must be a JSON object"),
    ],
)
def test_kv_budget_refuses_absurd_config_json_in_one_line(tmp_path, content, says):
    path = tmp_path / "config.json"
    path.write_text(content)
    one_line(run("kv-budget", "--model", str(path)), 2, str(path), says)


def test_kv_budget_refuses_a_binary_config_in_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(bytes(range(256)) * 4)
    one_line(run("kv-budget", "--model", str(path)), 2, str(path), "not UTF-8 text")


def test_kv_budget_reads_odd_live_labels_without_failing(answering):
    labels = {
        "__name__": "vllm:cache_config_info",
        "job": "j",
        "instance": "i:8000",
        "engine": "0",
        "block_size": "-100000",
        "num_gpu_blocks": "1" + "0" * 5000,
        "kv_cache_size_tokens": "nan",
    }
    url = answering(
        {
            "status": "success",
            "data": {"resultType": "vector", "result": [{"metric": labels, "value": [1, "1"]}]},
        }
    )
    res = run("kv-budget", "--prometheus-url", url, "--max-model-len", "8192", "--format", "json")
    assert res.exit_code == 0, res.stderr
    (engine,) = json.loads(res.stdout)["live"]["engines"]
    assert engine["block_size"] is None and engine["capacity_tokens"] is None


# --- simulate -------------------------------------------------------------------------------


def scenario(tmp_path, old: str = "", new: str = "", name: str = "s"):
    assert old in SCENARIO
    path = tmp_path / f"{name}.yaml"
    path.write_text(SCENARIO.replace(old, new, 1) if old else SCENARIO)
    return path


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ("seed: 1", "seed: abc", "seed: must be a whole number"),
        ("seed: 1", "seed: 1.5", "seed: must be a whole number"),
        ("scrape_interval: 15s", "scrape_interval: 0s", "scrape_interval: must be at least 1 s"),
        ("scrape_interval: 15s", "scrape_interval: 1ms", "scrape_interval: must be at least 1 s"),
        ("duration: 20m", "duration: 400d", "duration: 400 d is 2,304,000 scrapes"),
        ("duration: 20m", "duration: " + "9" * 400 + "d", "duration: '999"),
        ("window: 10m", "window: " + "9" * 400 + "d", "labels.window: '999"),
        (
            "      output: {median: 100, sigma: 0.4}\n",
            "      output: {median: 100, sigma: 0.4}\n    timeline: x\n",
            "models[0].timeline: must be a list of changes",
        ),
        ("rate: {mean: 1}", "rate: {mean: .nan}", "rate.mean: must be a finite number"),
        ("window: 10m", "window: 0s", "labels.window: must be at least 1 s"),
        ("expect: []", "expect: kv-cache-pressure", "labels.expect: must be a list"),
        (
            "expect: []",
            "expect: [kv-cache-presure]",
            "labels.expect[0]: unknown playbook 'kv-cache-presure'; did you mean "
            "'kv-cache-pressure'?",
        ),
        (
            "absent: []",
            "absent: [no-such-playbook]",
            "labels.absent[0]: unknown playbook 'no-such-playbook'",
        ),
        (
            "      output: {median: 100, sigma: 0.4}\n",
            "      output: {median: 100, sigma: 0.4}\n"
            "    timeline:\n      - {at: 3h, set: {workload.rate.mean: 2}}\n",
            "models[0].timeline[0].at: 3 h is after the scenario's end (20 min)",
        ),
    ],
)
def test_simulate_refuses_a_bad_scenario_in_one_line(tmp_path, old, new, says):
    path = scenario(tmp_path, old, new)
    res = run("simulate", str(path), "--out", str(tmp_path / "x.om"))
    one_line(res, 2, str(path), says)
    assert not (tmp_path / "x.om").exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (bytes(range(256)) * 4, "not UTF-8 text"),
        (b"a: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested deeper than"),
        (b"5\n", "must be a YAML mapping"),
        (b"- " * 5_000 + b"x\n", "nested deeper than"),
        (
            b'a: &a ["x","x","x","x","x","x","x","x","x","x"]\n'
            + b"".join(
                f"{c}: &{c} [{','.join(['*' + p] * 10)}]\n".encode()
                for p, c in zip("abcdefg", "bcdefgh", strict=True)
            ),
            "expands to more than",
        ),
    ],
)
def test_simulate_refuses_a_file_that_is_not_a_scenario_in_one_line(tmp_path, content, says):
    path = tmp_path / "odd.yaml"
    path.write_bytes(content)
    one_line(run("simulate", str(path), "--out", str(tmp_path / "x.om")), 2, str(path), says)


@pytest.mark.parametrize("end", ["nan", "inf", "1e20", "-5"])
def test_simulate_end_out_of_range_is_one_line(tmp_path, end):
    res = run("simulate", str(scenario(tmp_path)), "--out", str(tmp_path / "x.om"), "--end", end)
    one_line(res, 2, "--end")
    assert not (tmp_path / "x.om").exists()


def test_simulate_refuses_an_end_that_puts_the_start_before_1970(tmp_path):
    res = run("simulate", str(scenario(tmp_path)), "--out", str(tmp_path / "x.om"), "--end", "60")
    one_line(res, 2, "--end", "before 1970")


def test_an_unwritable_out_is_found_before_simulating(tmp_path, monkeypatch):
    import diagnoser.sim.run

    def must_not_run(*args, **kwargs):
        raise AssertionError("simulated before finding that --out cannot be written")

    monkeypatch.setattr(diagnoser.sim.run, "simulate", must_not_run)
    (tmp_path / "a-file").write_text("")
    res = run("simulate", str(scenario(tmp_path)), "--out", str(tmp_path / "a-file" / "x.om"))
    one_line(res, 2, "cannot write", "x.om")


def test_serve_on_a_busy_port_says_so_without_claiming_to_serve(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        res = run("simulate", str(scenario(tmp_path)), "--serve", f"127.0.0.1:{port}")
    line = one_line(res, 2, f"cannot listen on 127.0.0.1:{port}")
    assert "serving" not in line


# --- catalog, generate and the site config --------------------------------------------------


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (bytes(range(256)) * 4, "not UTF-8 text"),
        (b"id: x\ntitle: " + b"[" * 100_000 + b"]" * 100_000 + b"\n", "nested deeper than"),
        (b"5\n", "must be a YAML mapping"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "generate"])
def test_a_playbook_file_that_is_not_yaml_is_one_line(tmp_path, content, says, command):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "x.yaml").write_bytes(content)
    if command == "validate":
        res = run("catalog", "validate", str(mine))
    else:
        res = run("generate", "--catalog", str(mine), "--out", str(tmp_path / "out"))
    one_line(res, 2, str(mine / "x.yaml"), says)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"\xff\xfe selector: x", "not UTF-8 text"),
        (b"selector: " + b"[" * 10_000 + b"]" * 10_000 + b"\n", "nested deeper than"),
        (b"5\n", "must be a YAML mapping"),
    ],
)
def test_a_site_config_that_is_not_yaml_is_one_line(tmp_path, content, says):
    cfg = tmp_path / "site.yaml"
    cfg.write_bytes(content)
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    one_line(res, 2, str(cfg), says)


@pytest.mark.parametrize("value", ['"', 'job="vllm"} or vector(1) or up{a="', "job=vllm"])
def test_vllm_targets_must_be_label_matchers(tmp_path, value):
    cfg = tmp_path / "site.yaml"
    cfg.write_text(f"vllm_targets: {json.dumps(value)}\n")
    res = run("generate", "--config", str(cfg), "--out", str(tmp_path / "out"))
    one_line(res, 2, f"{cfg}: vllm_targets:", "is not label matchers")
    assert not (tmp_path / "out").exists()


@pytest.mark.prometheus
def test_generate_into_an_unwritable_out_is_one_line(tmp_path):
    (tmp_path / "a-file").write_text("")
    res = run("generate", "--out", str(tmp_path / "a-file" / "deploy"))
    one_line(res, 2, "cannot write under --out")


# --- usage errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("diagnose", "--nope"), "--nope"),
        (("diagnose", "--since"), "--since"),
        (("kv-budget", "--tp", "0"), "--tensor-parallel-size"),
        (("kv-budget", "--block-size", "0"), "--block-size"),
        (("simulate", "x", "--serve", "nope"), "--serve: 'nope' is not HOST:PORT"),
        (("simulate", "x", "--serve", "127.0.0.1:1", "--speed", "nan"), "--speed"),
        (("webhook", "--listen", "x"), "--listen"),
        (("probe", "--target", "http://127.0.0.1:1", "--classes", "nan"), "--classes"),
        (("probe", "--target", "http://127.0.0.1:1", "--every", "inf"), "--every"),
        (("catalog", "validate"), "DIRECTORY"),
    ],
)
def test_usage_errors_are_one_line_naming_the_option(args, says):
    one_line(run(*args), 2, says)


@pytest.mark.prometheus
def test_a_throwaway_prometheus_refuses_a_second_start(tmp_path):
    from lab.promserver import Prometheus, PrometheusError

    with Prometheus(tmp_path) as prom:
        url = prom.url
        with pytest.raises(PrometheusError, match="already running"):
            prom.start()
        assert prom.url == url and prom.proc is not None and prom.proc.poll() is None
