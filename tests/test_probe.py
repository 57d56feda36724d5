"""servediag probe: timing against known delays, outcomes, the live simulator end to end, a
buffering proxy, and the probe's real /metrics through a real Prometheus and the signals."""

from __future__ import annotations

import contextlib
import json
import random
import re
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from statistics import median
from typing import IO

import pytest
from click.testing import CliRunner
from live_simulator import live_simulator

from diagnoser.cli import main
from diagnoser.metrics.buckets import prompt_bucket_label
from diagnoser.metrics.tokens import WORDS, approx_tokens
from diagnoser.probe.prompts import Approximation, load_counter, parse_classes
from diagnoser.probe.runner import ProbeConfig, Prober
from diagnoser.probe.stream import Endpoint, stream
from diagnoser.sim.openai import ProxyBuffer
from diagnoser.sim.scenario import Probe, load_scenario
from lab.promserver import Prometheus, free_port, listening

ROOT = Path(__file__).resolve().parent.parent

# --- a minimal real streaming server --------------------------------------------------------


class Script:
    """What the minimal server does with the next POST (one server per test)."""

    def __init__(self, **kw: object):
        self.status = 200
        self.first_delay = 0.0  # before the first token
        self.gap = 0.0  # between tokens
        self.tokens = 5
        self.stall_after = -1  # stop sending (but keep the connection) after this many tokens
        self.error_after = -1  # an error object in the stream after this many tokens
        self.done = True  # data: [DONE] at the end
        self.finish = True  # finish_reason on the last token
        self.__dict__.update(kw)
        self.headers: list[dict[str, str]] = []  # of each POST received


@pytest.fixture
def sse_server():
    """``sse_server(Script(...))`` -> (base URL, the JSON bodies received)."""
    started: list[ThreadingHTTPServer] = []
    release = threading.Event()  # set at teardown: stalled handlers return

    def start(script: Script) -> tuple[str, list[dict]]:
        bodies: list[dict] = []

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"  # the stream ends when the connection closes

            def do_GET(self) -> None:
                body = json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                script.headers.append(dict(self.headers))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._answer()

            def _event(self, obj: object) -> None:
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")

            def _answer(self) -> None:
                s = script
                if s.status != 200:
                    self.send_response(s.status)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self._event_free({"error": {"message": "engine overloaded", "code": s.status}})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if release.wait(s.first_delay):
                    return
                for k in range(s.tokens):
                    if k and release.wait(s.gap):
                        return
                    if k == s.stall_after:
                        release.wait(30)
                        return
                    if k == s.error_after:
                        self._event({"error": {"message": "the engine died", "code": 500}})
                        return
                    last = k == s.tokens - 1
                    choice = {"index": 0, "text": f" w{k}", "finish_reason": None}
                    if last and s.finish:
                        choice["finish_reason"] = "length"
                    self._event({"choices": [choice]})
                self._event({"choices": [], "usage": {"prompt_tokens": 42}})
                if s.done:
                    self.wfile.write(b"data: [DONE]\n\n")

            def _event_free(self, obj: object) -> None:
                self.wfile.write(json.dumps(obj).encode())

            def log_message(self, format: str, *args: object) -> None:
                return

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", bodies

    yield start
    release.set()
    for server in started:
        server.shutdown()
        server.server_close()


def _probe(url: str, timeout: float = 5.0, **kw: object):
    return stream(Endpoint(url), "completions", {"model": "tiny", "prompt": "hi", **kw}, timeout)


# --- prompts and classes --------------------------------------------------------------------


def test_classes_use_the_simulators_bucket_labels():
    sizes = parse_classes("16k,128,4k,1k")
    assert sizes == [128, 1024, 4096, 16384]
    assert [prompt_bucket_label(n) for n in sizes] == [
        Probe.bucket_label(n) for n in Probe().buckets
    ]
    assert [prompt_bucket_label(n) for n in parse_classes("100,2k,1536")] == ["100", "1536", "2k"]


def test_approximate_prompts_have_exactly_their_class_length_by_the_simulators_count():
    rng = random.Random(3)
    for n in (1, 128, 4096):
        text, counted = Approximation().prompt(n, rng)
        assert counted == n == approx_tokens(text)
    a, _ = Approximation().prompt(64, rng)
    b, _ = Approximation().prompt(64, rng)
    assert a.split()[:8] != b.split()[:8]  # no shared prefix for the server's prefix cache


def _tokenizer_json(path: Path) -> Path:
    """A small BPE tokenizer that splits the probe's words into several tokens each."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.BPEDecoder(suffix="</w>")
    trainer = trainers.BpeTrainer(
        vocab_size=80, special_tokens=["[UNK]"], end_of_word_suffix="</w>"
    )
    tok.train_from_iterator([" ".join(WORDS)] * 4, trainer)
    tok.save(str(path))
    return path


def test_a_tokenizer_json_sets_the_prompt_length_in_its_own_tokens(tmp_path, sse_server):
    from tokenizers import Tokenizer

    path = _tokenizer_json(tmp_path / "tokenizer.json")
    counter, warning = load_counter(path)
    assert warning is None and counter.source == "tokenizer"
    url, bodies = sse_server(Script(tokens=2))
    res = CliRunner().invoke(
        main,
        [
            "probe",
            "--target",
            url,
            "--api",
            "completions",
            "--classes",
            "300",
            "--once",
            "--tokenizer",
            str(path),
        ],
    )
    assert res.exit_code == 0, res.output
    assert f"prompt tokens: tokenizer: {path}" in res.stderr
    prompt = bodies[0]["prompt"]
    assert len(Tokenizer.from_file(str(path)).encode(prompt, add_special_tokens=False).ids) == 300
    assert approx_tokens(prompt) < 300  # words of several tokens each: not the approximation


def test_without_the_tokenizers_package_the_approximation_is_used_and_said(
    tmp_path, monkeypatch, sse_server
):
    path = _tokenizer_json(tmp_path / "tokenizer.json")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # as if not installed
    counter, warning = load_counter(path)
    assert counter.source == "approximation" and warning and "not installed" in warning
    url, _ = sse_server(Script(tokens=2))
    res = CliRunner().invoke(
        main, ["probe", "--target", url, "--classes", "128", "--tokenizer", str(path), "--once"]
    )
    assert res.exit_code == 0
    assert "servediag: warning: the 'tokenizers' package is not installed" in res.stderr
    assert "prompt tokens: approximation" in res.stderr


# --- one request against a minimal real streaming server ------------------------------------


def test_timing_matches_the_servers_known_delays(sse_server):
    url, bodies = sse_server(Script(first_delay=0.3, gap=0.1, tokens=5))
    res = _probe(url, max_tokens=5)
    assert res.outcome == "ok", res.detail
    assert res.tokens == 5 and len(res.gaps) == 4 and res.prompt_tokens == 42
    assert res.ttft is not None and res.e2e is not None
    assert 0.3 <= res.ttft < 0.3 + 0.5  # it cannot arrive before it was sent
    assert res.e2e >= 0.3 + 4 * 0.1
    assert 0.05 < median(res.gaps) < 0.3
    assert bodies[0]["stream"] is True


@pytest.mark.parametrize(
    ("script", "timeout", "outcome", "says"),
    [
        (Script(status=500), 5.0, "http_error", "HTTP 500: engine overloaded"),
        (Script(error_after=2), 5.0, "http_error", "error in the stream: the engine died"),
        (Script(first_delay=5.0), 0.5, "timeout", "not finished within 0.5 s"),
        (Script(stall_after=2), 0.5, "timeout", "(2 token(s) received)"),
        (Script(done=False, finish=False), 5.0, "truncated", "without [DONE]"),
        (Script(done=False), 5.0, "ok", ""),  # a finish_reason ends the stream properly
    ],
    ids=["http-500", "error-event", "no-first-token", "stalled", "truncated", "finish-only"],
)
def test_outcomes(sse_server, script, timeout, outcome, says):
    url, _ = sse_server(script)
    res = _probe(url, timeout=timeout)
    assert res.outcome == outcome, res.detail
    assert says in res.detail


def test_a_closed_port_is_a_connection_error():
    res = _probe(f"http://127.0.0.1:{free_port()}")
    assert res.outcome == "connection_error" and res.detail == "connection refused"


# --- the command line -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "give --target URL"),
        (["--target", "ftp://x"], "is not an http(s):// URL"),
        (["--classes", "128,lots"], "--classes: 'lots' is not a prompt length"),
        (["--classes", "1k,1024"], "given twice"),
        (["--every", "0s"], "--every: '0s' must be longer than zero"),
        (["--timeout", "soon"], "--timeout: 'soon' is not a duration"),
        (["--budget", "many/min"], "--budget 'many' must be a whole number"),
        (["--max-in-flight", "0"], "--max-in-flight: 0 is not in the range 1<=x<=64"),
        (["--header", "NoSeparator"], "--header: 'NoSeparator' must be NAME:VALUE"),
        (["--listen", "nowhere"], "--listen: 'nowhere' is not HOST:PORT"),
        (["--tokenizer", "missing.json"], "--tokenizer missing.json: no such file"),
        (["--bearer-token-file", "no-token"], "cannot read --bearer-token-file no-token"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, says):
    base = [] if not args or args[0] == "--target" else ["--target", "http://127.0.0.1:1"]
    res = CliRunner().invoke(main, ["probe", *base, *args, "--once"])
    assert res.exit_code == 2, res.output
    assert res.stderr.count("\n") == 1 and says in res.stderr, res.stderr


def test_a_file_that_is_not_a_tokenizer_is_exit_2(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    res = CliRunner().invoke(
        main, ["probe", "--target", "http://127.0.0.1:1", "--tokenizer", str(bad), "--once"]
    )
    assert res.exit_code == 2 and "not a tokenizer.json" in res.stderr
    assert res.stderr.count("\n") == 1


def test_headers_and_the_bearer_token_reach_the_server_and_stay_out_of_the_output(
    tmp_path, sse_server
):
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    script = Script(tokens=1)
    url, _ = sse_server(script)
    args = ["--header", "X-Tenant: blue", "--header", "X-Scope-OrgID=team-a"]
    args += ["--bearer-token-file", str(token), "--classes", "128"]
    res = CliRunner().invoke(main, ["probe", "--target", url, *args, "--once"])
    assert res.exit_code == 0, res.output
    sent = script.headers[0]
    assert sent["Authorization"] == "Bearer s3cret-token"
    assert sent["X-Tenant"] == "blue" and sent["X-Scope-OrgID"] == "team-a"
    assert "s3cret" not in res.output


def test_an_unreachable_target_is_exit_3_in_one_line():
    res = CliRunner().invoke(main, ["probe", "--target", f"http://127.0.0.1:{free_port()}"])
    assert res.exit_code == 3
    assert res.stderr.count("\n") == 1 and "(/v1/models): connection refused" in res.stderr


# --- the live simulator ---------------------------------------------------------------------


def test_a_proxy_buffer_releases_chunks_at_its_flushes():
    from diagnoser.sim.openai import Relay

    now = [0.0]
    written: list[tuple[float, bytes]] = []

    def run(proxy: ProxyBuffer | None, chunks: list[tuple[bytes, float]]) -> None:
        now[0] = 0.0
        written.clear()
        relay = Relay(
            lambda b: written.append((now[0], b)),
            lambda t: t / 2,  # simulated seconds at speed 2
            0.0,
            proxy,
            sleep=lambda s: now.__setitem__(0, now[0] + s),
            clock=lambda: now[0],
        )
        for data, at in chunks:
            relay.send(data, at)
        relay.close()

    chunks = [(b"a", 0.2), (b"b", 0.6), (b"c", 3.0)]
    run(None, chunks)
    assert written == [(0.1, b"a"), (0.3, b"b"), (1.5, b"c")]
    run(ProxyBuffer(seconds=2.0), chunks)
    assert written == [(1.0, b"a"), (1.0, b"b"), (2.0, b"c")]
    run(ProxyBuffer(full=True), chunks)
    assert written == [(1.5, b"abc")]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--proxy-buffer", "soon", "--serve", "127.0.0.1:1"], "neither 'full' nor seconds"),
        (["--proxy-buffer", "0", "--serve", "127.0.0.1:1"], "above zero"),
        (["--proxy-buffer", "full", "--out", "x.om"], "--proxy-buffer needs --serve"),
    ],
)
def test_bad_proxy_buffer_is_one_line_and_exit_2(args, says):
    res = CliRunner().invoke(main, ["simulate", "healthy-steady", *args])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and says in res.stderr


SCENARIO = """\
description: One small model for the probe's tests.
duration: 10m
scrape_interval: 1s
seed: 11
labels: {{window: 5m, expect: [], absent: []}}
models:
  - name: {name}
    preset: llama-3.1-8b
    gpu: H100-80GB
    engine: {{max_model_len: 32768}}
    workload:
      rate: {{mean: {rate}}}
      prompt: {{median: 400, sigma: 0.4}}
      output: {{median: 100, sigma: 0.4}}
"""


@pytest.fixture
def live_sim(tmp_path):
    """``live_sim(name, proxy=None)`` -> base URL of a simulator serving that model."""
    with contextlib.ExitStack() as running:

        def start(name: str, proxy: ProxyBuffer | None = None, rate: float = 0.5) -> str:
            path = tmp_path / f"{name}.yaml"
            path.write_text(textwrap.dedent(SCENARIO.format(name=name, rate=rate)))
            sc = load_scenario(path)
            return f"http://{running.enter_context(live_simulator(sc, proxy=proxy))}"

        yield start


def _metric(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        body = resp.read().decode()
    out = []
    for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} (\S+)$", body, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        out.append((labels, float(m.group(2))))
    return out


def test_once_against_the_live_simulator_goes_through_its_engine(live_sim):
    url = live_sim("probe-llm", rate=0.01)
    res = CliRunner().invoke(main, ["probe", "--target", url, "--once"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "probing probe-llm" in res.stderr and "prompt tokens: approximation" in res.stderr
    rows = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines()[1:]}
    assert set(rows) == {"128", "1k", "4k", "16k"}
    for row in rows.values():
        _label, prompt, server, outcome, _ttft, _itl, _e2e, out = row[:8]
        assert outcome == "ok" and out == "16", row
        assert int(server) == int(prompt) + 7  # the chat template's tokens, as the server counts
    assert float(rows["16k"][4].rstrip("s")) > float(rows["128"][4].rstrip("s"))  # prefill cost
    time.sleep(1.2)  # the next scrape of the simulation
    prompt_hist = {lb["le"]: v for lb, v in _metric(url, "vllm:request_prompt_tokens_bucket") if v}
    assert prompt_hist["20000.0"] - prompt_hist["10000.0"] >= 1  # the 16k prompt was served


def test_a_buffering_proxy_delays_the_first_token_the_server_does_not(live_sim):
    direct, buffered = live_sim("direct", rate=0.01), live_sim("held", ProxyBuffer(full=True), 0.01)

    def probe_round(url: str, model: str):
        cfg = ProbeConfig(Endpoint(url), model, classes=(128, 1024), max_tokens=32, budget=100)
        return [a.result for a in Prober(cfg).round()]

    for res in probe_round(direct, "direct"):
        assert res.outcome == "ok" and res.ttft < 0.5 * res.e2e
    held = probe_round(buffered, "held")
    for res in held:
        assert res.outcome == "ok" and res.ttft > 0.9 * res.e2e  # the stream arrives in one burst
    time.sleep(1.2)
    (server_sum,) = [v for _, v in _metric(buffered, "vllm:time_to_first_token_seconds_sum")]
    (server_count,) = [v for _, v in _metric(buffered, "vllm:time_to_first_token_seconds_count")]
    assert server_count >= 2
    assert min(r.ttft for r in held) > 3 * server_sum / server_count


# --- the probe's real /metrics in a real Prometheus -----------------------------------------


def _start_probe(url: str, port: int, log: IO[bytes], classes: str) -> subprocess.Popen[bytes]:
    args = ["--target", url, "--listen", f"127.0.0.1:{port}", "--classes", classes]
    args += ["--every", "2s", "--budget", "600/min", "--max-tokens", "32", "--timeout", "10s"]
    return subprocess.Popen(
        [sys.executable, "-m", "diagnoser", "probe", *args], stdout=subprocess.DEVNULL, stderr=log
    )


@pytest.mark.prometheus
def test_the_probe_signals_alert_and_panels_read_the_real_probe(live_sim, tmp_path):
    from diagnoser.catalog.shapes.growth import grows_with
    from diagnoser.metrics.promql import Scope
    from diagnoser.metrics.signals import SIGNALS

    # Enough traffic for the alerts' floor (0.1 finished requests a second over 5 minutes).
    sims = {
        "direct-llm": live_sim("direct-llm", rate=5.0),
        "buffered-llm": live_sim("buffered-llm", ProxyBuffer(2.0), rate=5.0),
    }
    ports = {name: free_port() for name in sims}
    classes = {"direct-llm": "128,1k,4k,16k", "buffered-llm": "128,1k"}
    logs = {name: (tmp_path / f"{name}.log").open("wb") for name in sims}
    probes = [
        _start_probe(url, ports[name], logs[name], classes[name]) for name, url in sims.items()
    ]
    # Each probe holds its port before Prometheus picks one, or both may pick the same.
    deadline = time.monotonic() + 20
    while not all(listening(p) for p in ports.values()) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in probes), "a probe exited at start"
        time.sleep(0.1)
    scrape = [
        {
            "job_name": "vllm",
            "scrape_interval": "1s",
            # Each simulator lists its targets with the labels Kubernetes would give them.
            "http_sd_configs": [
                {"url": f"{u}/targets", "refresh_interval": "1s"} for u in sims.values()
            ],
        },
        {
            "job_name": "llm-probe",
            "scrape_interval": "1s",
            "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports.values()]}],
        },
    ]
    rules = [ROOT / "rules" / "recording.rules.yaml", ROOT / "rules" / "alerts.rules.yaml"]
    try:
        with Prometheus(
            tmp_path / "data",
            rule_files=rules,
            scrape_configs=scrape,
            config={"global": {"evaluation_interval": "1s"}},
        ) as prom:

            def by_model(signal: str, scope: Scope | None = None) -> dict[str, float]:
                out = {}
                for r in prom.query(SIGNALS[signal].render(scope)):
                    key = r["metric"]["model_name"]
                    if "prompt_bucket" in r["metric"]:
                        key += "/" + r["metric"]["prompt_bucket"]
                    out[key] = float(r["value"][1])
                return out

            def pending() -> set[str]:
                alerts = prom.query('ALERTS{alertname="VllmLatencyOutsideEngine"}')
                return {a["metric"]["model_name"] for a in alerts}

            deadline = time.monotonic() + 45
            while time.monotonic() < deadline:
                buckets = by_model("probe_ttft_p50_by_bucket")
                if len([k for k in buckets if k.startswith("direct-llm/")]) == 4 and pending():
                    break
                time.sleep(1)
            for p, name in zip(probes, sims, strict=True):
                assert p.poll() is None, (tmp_path / f"{name}.log").read_text()
            # The by-bucket signal: the probe's label values, one series per class.
            direct = {k.split("/")[1]: v for k, v in buckets.items() if k.startswith("direct-")}
            assert set(direct) == {"128", "1k", "4k", "16k"}, buckets
            assert direct["16k"] > direct["128"]
            assert grows_with(1.2, direct).holds is not None  # superlinear-prefill can decide
            # latency-outside-engine: the alert's expression holds for the buffered model only.
            assert pending() == {"buffered-llm"}
            assert by_model("ttft_outside_engine")["buffered-llm"] > 1.0
            # Behind the proxy the first token comes with the rest, for every prompt class;
            # direct, the short classes' first token is a small part of their request.
            share = by_model("probe_first_token_share_of_e2e")
            assert share["buffered-llm"] > 0.7 > 0.5 > share["direct-llm"]
            assert by_model("probe_error_share") == {"direct-llm": 0.0, "buffered-llm": 0.0}
            # A site selector for the vLLM job must not hide the probe (scraped as its own job).
            scoped = by_model("probe_ttft_p95", Scope(matchers=('job="vllm"',)))
            assert set(scoped) == {"direct-llm", "buffered-llm"}
            # The dashboards' probe panels show the probe's data.
            empty = [title for title, expr in _probe_panels() if not prom.query(expr)]
            assert not empty
    finally:
        for p in probes:
            p.terminate()
        codes = [p.wait(10) for p in probes]
        for log in logs.values():
            log.close()
    assert codes == [0, 0]  # SIGTERM stops the probe cleanly
    assert "metrics on http://127.0.0.1:" in (tmp_path / "direct-llm.log").read_text()


def _chosen(expr: str) -> str:
    """The panel as a user sees it with one job, instance and engine chosen (not All)."""
    chosen = {
        "$job": "vllm",
        "$model_name": ".*",
        "$instance": ".*-0:8000",
        "$engine": "0",
        "$__rate_interval": "5m",
    }
    for var, value in chosen.items():
        expr = expr.replace(var, value)
    return expr


def _probe_panels() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for t in panel.get("targets", []):
                if "llm_probe_" in t["expr"]:
                    out.append((f"{path.stem}: {panel['title']}", _chosen(t["expr"])))
    assert out
    return out
