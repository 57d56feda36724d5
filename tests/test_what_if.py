"""What-if against a real Prometheus: a scenario simulated at one configuration is fitted and
calibrated from its series, each lever is predicted, and the same scenario simulated at the
lever's configuration says whether the prediction was right. Plus the refusals: too little
traffic, a shape nobody knows, SGLang, a lever that does not exist, a replay that cannot
match."""

from __future__ import annotations

import copy
import dataclasses
import json
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pytest
from clitest import one_line, run
from loopback import Faulty, Respond, answer, serve

from diagnoser.catalog.levers import KNOBS, LeverError, parse_lever
from diagnoser.hardware import presets
from diagnoser.plumbing.source import PrometheusSource, Series
from diagnoser.sim.scenario import Scenario, load_scenario
from diagnoser.whatif import calibrate as calibration
from diagnoser.whatif.calibrate import MAX_REPLAYS, calibrate, with_factors
from diagnoser.whatif.fit import MIN_REQUESTS, SPAN, FitError, fit_window, measure
from diagnoser.whatif.levers import turn
from diagnoser.whatif.predict import band, what_if
from diagnoser.whatif.replay import Setup, baseline, replay
from diagnoser.whatif.setup import vllm_defaults
from diagnoser.whatif.stats import Buckets, fit_lognormal, quantile
from lab import harness
from lab.promserver import Prometheus

HERE = Path(__file__).resolve().parent
A = load_scenario(HERE / "scenarios" / "what-if-kv-pressure.yaml")
MODEL = A.models[0].name
WINDOW = 1800.0
SLO = (1.0, 0.1)
SETUP = Setup(presets.model("llama-2-7b"), presets.gpu("H100-80GB"), 256, 2048, 4096)
# The levers checked against the scenario run at their configuration, and that configuration.
CHECKED = {
    "max_num_batched_tokens:512": {"max_num_batched_tokens": 512},
    "kv_cache_dtype:fp8": {"kv_cache_dtype_bytes": 1},
}


def _variant(name: str, engine: dict[str, int]) -> Scenario:
    sc = copy.deepcopy(A)
    sc.name = f"{A.name}-{name}"
    for key, value in engine.items():
        setattr(sc.models[0].engine, key, value)
    return sc


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Prometheus serving configuration A, and each lever's configuration B, one apiece."""
    variants = {lever: _variant(str(i), e) for i, (lever, e) in enumerate(CHECKED.items())}
    prepared = harness.prepare([A, *variants.values()], tmp_path_factory.mktemp("what-if"))
    proms = {name: Prometheus(p.data_dir).start() for name, p in prepared.items()}
    end = prepared[A.name].end
    yield proms[A.name], {lever: proms[sc.name] for lever, sc in variants.items()}, end
    for prom in proms.values():
        prom.close()


@pytest.fixture(scope="module")
def fitted(servers):
    prom, _, end = servers
    return fit_window(PrometheusSource(prom.url), MODEL, end - WINDOW, end)


# --- the fit -------------------------------------------------------------------------------


@pytest.mark.prometheus
def test_the_fit_recovers_the_scenarios_workload_and_engine(fitted):
    m = A.models[0]
    assert fitted.instances == 1 and fitted.engines == 1
    assert fitted.cache.block_size == 16 and fitted.cache.gpu_memory_utilization == 0.8
    assert fitted.cache.num_gpu_blocks == m.engine.num_gpu_blocks(m.spec, m.gpu)
    assert fitted.prompt.median == pytest.approx(m.workload.prompt.median, rel=0.05)
    assert fitted.prompt.sigma == pytest.approx(m.workload.prompt.sigma, abs=0.08)
    assert fitted.output.median == pytest.approx(m.workload.output.median, rel=0.05)
    assert fitted.output.sigma == pytest.approx(m.workload.output.sigma, abs=0.08)
    # The cap that makes the measured share stop on length sits at the scenario's max_tokens.
    assert fitted.output.cap == pytest.approx(m.workload.max_tokens, rel=0.1)
    assert 0.01 < fitted.length_share < 0.08
    # Arrivals: what finished plus what is still inside, per minute, over the quarter hour of
    # the window replayed (its steadiest).
    lo, hi = fitted.window
    assert hi - lo == WINDOW and lo <= fitted.start and fitted.end <= hi
    assert fitted.rates.size == SPAN / 60 and fitted.seconds == SPAN
    assert fitted.mean_rate == pytest.approx(fitted.measured.finished / SPAN, rel=0.05)
    assert fitted.mean_rate == pytest.approx(m.workload.rate.mean, rel=0.1)


def test_the_length_fit_reads_a_capped_lognormal_from_its_histogram():
    rng = np.random.default_rng(3)
    x = np.minimum(np.rint(rng.lognormal(np.log(350), 0.6, 20000)), 1024)
    bounds = np.array([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000], dtype=float)
    cum = np.array([(x <= b).sum() for b in bounds] + [x.size], dtype=float)
    fit = fit_lognormal(Buckets(bounds, cum, float(x.sum())), float((x >= 1024).mean()))
    assert fit.median == pytest.approx(350, rel=0.03) and fit.sigma == pytest.approx(0.6, abs=0.03)
    assert fit.cap == pytest.approx(1024, rel=0.05)
    # histogram_quantile as Prometheus computes it: linear within the bucket.
    assert quantile(Buckets(bounds, cum, 0.0), 0.5) == pytest.approx(
        200 + 300 * (0.5 * x.size - cum[7]) / (cum[8] - cum[7])
    )


# --- predictions against the configuration simulated directly ------------------------------


@pytest.mark.prometheus
def test_each_lever_predicts_what_the_configuration_then_does(servers, fitted):
    _, truths, end = servers
    result = what_if(fitted, SETUP, [parse_lever(t) for t in CHECKED], SLO)
    cal = result.calibration
    assert cal.ok, cal.reason
    assert 0.5 < cal.prefill_factor < 2 and 0.5 < cal.decode_factor < 2
    for outcome in result.outcomes:
        assert outcome.error is None, outcome.error
        prom = truths[outcome.lever.text]
        truth = measure(
            PrometheusSource(prom.url), (f'model_name="{MODEL}"',), end - WINDOW, end
        ).figures(*SLO)
        got = outcome.predicted
        for name, tolerance in (("ttft_p95", 0.25), ("itl_p95", 0.25), ("tokens_per_second", 0.1)):
            assert got[name] == pytest.approx(truth[name], rel=tolerance), (
                outcome.lever.text,
                name,
                got[name],
                truth[name],
            )
        pre, true_pre = got["preemptions_per_second"], truth["preemptions_per_second"]
        assert (pre < 0.02 and true_pre < 0.02) or 0.5 <= pre / max(true_pre, 1e-9) <= 2
    # The levers move the figures they should, in the direction they should.
    by = {o.lever.text: o.predicted for o in result.outcomes}
    today = result.replayed
    assert by["max_num_batched_tokens:512"]["ttft_p95"] > 1.15 * today["ttft_p95"]
    assert by["kv_cache_dtype:fp8"]["kv_usage"] < 0.6 * today["kv_usage"]


@pytest.mark.prometheus
def test_the_calibration_refuses_a_window_the_replay_cannot_match(fitted):
    # The servers said their KV cache was 95% full; no speed factor makes the replay agree.
    measured = dataclasses.replace(fitted.measured, kv_usage=0.95)
    odd = dataclasses.replace(fitted, measured=measured)
    result = what_if(odd, SETUP, [parse_lever("replicas:+1")], SLO)
    assert not result.calibration.ok
    assert "kv usage" in (result.calibration.reason or "")
    assert all(not o.predicted for o in result.outcomes)


@pytest.mark.prometheus
def test_levers_replayed_beside_the_calibration_predict_what_one_after_another_does(servers):
    """Two workers replay levers while the calibration is not settled (and again when it
    fits a factor); one worker replays each only when it is needed. Same answers."""
    prom, _, end = servers
    short = fit_window(PrometheusSource(prom.url), MODEL, end - 600, end)
    # The same window from a server that prefills 30% faster (the replay at that speed taken as
    # what was measured): a factor is fitted.
    today, _ = baseline(short, SETUP)
    quick = replay(short, SETUP, with_factors(today, 1.3, 1.0, SETUP.gpu))
    faster = dataclasses.replace(short, measured=quick)
    levers = [parse_lever("replicas:+1"), parse_lever("max_num_seqs:x0.75")]
    for fit in (short, faster):
        apart = what_if(fit, SETUP, levers, SLO, workers=2)
        alone = what_if(fit, SETUP, levers, SLO, workers=1)
        assert apart.calibration == alone.calibration
        assert apart.replayed == alone.replayed
        assert [(o.change, o.predicted, o.band, o.error) for o in apart.outcomes] == [
            (o.change, o.predicted, o.band, o.error) for o in alone.outcomes
        ]
    # The factor is found again: prefill about 1.3 times as fast, decode as it was.
    fitted_cal = apart.calibration
    assert 2 <= fitted_cal.replays <= MAX_REPLAYS
    assert 1.15 < fitted_cal.prefill_factor < 1.45 and 0.95 < fitted_cal.decode_factor < 1.05
    # And what calibrating one replay after another, then replaying each lever at the
    # calibrated configuration, gives.
    cal, _ = calibrate(
        today, SETUP.gpu, faster.measured, lambda cfg: replay(faster, SETUP, cfg), SLO
    )
    assert cal == apart.calibration
    assert cal.ok, cal.reason
    for o in apart.outcomes:
        cfg, _ = turn(o.lever, cal.config, faster, SETUP)
        assert o.predicted == replay(faster, SETUP, cfg).figures(*SLO)


def test_a_band_is_relative_where_the_residual_is_whatever_the_figure_predicted():
    # 19% off on a measured 0.044 preemptions/s: a lever that ends them is 0 ± the margin of
    # noise, not ± 0.19 a second.
    noise = calibration.CHECKED["preemptions_per_second"]
    assert band("preemptions_per_second", 0.19, True, 0.0) == noise
    assert band("preemptions_per_second", 0.19, True, 0.5) == pytest.approx(0.095)
    # Measured near zero, the residual is absolute: so is the band.
    assert band("preemptions_per_second", 0.05, False, 0.6) == pytest.approx(0.05)
    assert band("ttft_p95", -0.1, True, 0.4) == pytest.approx(0.04)


# --- the command ---------------------------------------------------------------------------


def _cli(servers, *args: str):
    prom, _, end = servers
    return run(
        "what-if",
        "--prometheus-url",
        prom.url,
        "--until",
        str(int(end)),
        "--gpu",
        "H100-80GB",
        "--max-num-seqs",
        "256",
        "--max-num-batched-tokens",
        "2048",
        *args,
    )


@pytest.mark.prometheus
def test_the_command_prints_a_json_object_per_lever(servers):
    res = _cli(
        servers,
        "--since",
        "30m",
        "--preset",
        "llama-2-7b",
        "--max-model-len",
        "4096",
        "--lever",
        "replicas:+1",
        "--lever",
        "enable_prefix_caching",
        "--format",
        "json",
    )
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["model"] == MODEL and doc["calibration"]["ok"] is True
    assert doc["fit"]["engine"]["num_gpu_blocks"] > 0
    replicas, prefix = doc["levers"]
    assert replicas["lever"] == "replicas:+1" and replicas["restart"] is False
    assert replicas["change"] == "1 -> 2" and replicas["error"] is None
    assert replicas["predicted"]["kv_usage"] < doc["today"]["kv_usage"]
    assert set(replicas["band"]) == set(replicas["predicted"])
    # Prefix caching is on already: said, not replayed.
    assert prefix["restart"] is True and prefix["predicted"] is None
    assert "already on" in prefix["error"]


@pytest.mark.prometheus
def test_too_little_traffic_is_one_line_saying_how_much_is_needed(servers):
    res = _cli(servers, "--since", "30s", "--preset", "llama-2-7b")
    one_line(res, 2, f"at least {MIN_REQUESTS}", "a longer --since")


@pytest.mark.prometheus
def test_a_model_shape_nobody_knows_asks_for_its_config(servers):
    res = _cli(servers, "--since", "30m")
    one_line(res, 2, "give --model-config")


@pytest.mark.parametrize(
    ("lever", "says"),
    [
        ("warp_speed:+1", "unknown lever 'warp_speed'"),
        ("max_num_seqs:lots", "the change must be +N, -N, xN or N"),
        ("kv_cache_dtype:fp4", "one of fp8, auto"),
    ],
)
def test_a_bad_lever_is_one_line_before_any_query(lever, says):
    res = run("what-if", "--prometheus-url", "http://127.0.0.1:9", "--lever", lever)
    one_line(res, 2, "--lever", says)


class _Sglang:
    """A source where the model's series are SGLang's: no cache_config_info."""

    def query(self, expr: str, at: float) -> list[Series]:
        if "sglang:" in expr:
            return [Series({}, np.array([at]), np.array([4.0]))]
        return []

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        return []


def test_a_model_served_by_sglang_is_refused_naming_the_levers_it_lacks():
    with pytest.raises(FitError, match=r"served by SGLang.*vLLM flags SGLang does not have"):
        fit_window(_Sglang(), "qwen", 0.0, 3600.0)


# --- the levers' grammar and the catalog ------------------------------------------------------


def test_levers_parse_in_every_form_and_say_what_is_wrong():
    assert parse_lever("gpu_memory_utilization:+0.05").apply(0.8) == pytest.approx(0.85)
    assert parse_lever("max_num_seqs=x0.75").apply(256) == 192
    assert parse_lever("max_num_batched_tokens:512").apply(2048) == 512
    assert parse_lever("replicas").apply(2) == 3
    assert (
        parse_lever("gpu_memory_utilization:+0.5").apply(0.8) == KNOBS["gpu_memory_utilization"].hi
    )
    assert parse_lever("enable_prefix_caching:0.3").value == "0.3"
    assert parse_lever("kv_cache_dtype").value == "fp8"
    for bad in ("max_num_seqs:x0", "enable_prefix_caching:2", "replicas:0", "a b"):
        with pytest.raises(LeverError):
            parse_lever(bad)


def test_every_catalog_lever_parses_and_restarts_say_so(catalog):
    named = [t for pb in catalog for t in pb.levers]
    assert len(named) >= 10
    assert {parse_lever(t).name for t in named} >= {
        "gpu_memory_utilization",
        "kv_cache_dtype",
        "max_num_seqs",
        "replicas",
    }
    assert parse_lever("replicas:+1").restart is False
    assert parse_lever("max_num_seqs:x0.75").restart is True


def test_vllms_scheduler_defaults_follow_the_gpu():
    assert vllm_defaults(presets.gpu("H100-80GB")) == (1024, 8192)
    assert vllm_defaults(presets.gpu("A100-80GB")) == (256, 2048)
    assert vllm_defaults(presets.gpu("L40S")) == (256, 2048)


def test_every_lever_of_the_grammar_has_one_replay_and_no_replay_lacks_its_lever():
    from diagnoser.catalog.levers import KNOBS
    from diagnoser.whatif.levers import TURNS, turns

    assert sorted(TURNS) == sorted(KNOBS)
    with pytest.raises(ValueError, match="two replays"):
        turns("replicas")(TURNS["replicas"])


def test_without_model_what_if_names_the_models_when_there_is_not_one():
    from loopback import fleet

    with serve(fleet(2, sick=False)) as api:
        res = run("what-if", "--prometheus-url", api.url, "--gpu", "H100-80GB")
    assert res.exit_code == 2, res.output
    assert "give --model: what-if fits one model (in the window: model-00000, model-00001)" in (
        res.stderr
    )


# --- the deadline, and answers what-if cannot use ------------------------------------------


def hostile(url: str, answers: Callable[[str], list[dict[str, Any]] | None]) -> Respond:
    """A Prometheus in front of the one at ``url``: each query is answered as it answers it,
    except where ``answers(query)`` gives a result (an instant vector) of its own."""

    def respond(h: BaseHTTPRequestHandler, f: Faulty) -> None:
        body = getattr(h, "request_body", b"")
        asked = parse_qs(body.decode()) if body else parse_qs(urlsplit(h.path).query)
        own = answers(asked.get("query", [""])[0])
        if own is not None:
            answer(h, {"status": "success", "data": {"resultType": "vector", "result": own}})
            return
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
        req = urllib.request.Request(url + h.path, data=body or None, headers=headers)
        with urllib.request.urlopen(req, timeout=30) as got:
            answer(h, got.read())

    return respond


def bad_bucket(query: str) -> list[dict[str, Any]] | None:
    """A histogram with a bucket whose bound is no number, in what-if's reads of a window's
    histograms (a diagnosis reads none with ``increase``)."""
    if "_bucket" not in query or "increase(" not in query:
        return None
    return [
        {"metric": {"le": "abc"}, "value": [1, "5"]},
        {"metric": {"le": "+Inf"}, "value": [1, "9"]},
    ]


def infinite_gpu(query: str) -> list[dict[str, Any]] | None:
    """DCGM's framebuffer, used plus free, of +Inf MiB."""
    if "DCGM_FI_DEV_FB" not in query:
        return None
    return [{"metric": {"modelName": "NVIDIA H100 80GB HBM3"}, "value": [1, "+Inf"]}]


def _timed(servers, *args: str):
    t0 = time.monotonic()
    res = _cli(servers, "--since", "30m", "--preset", "llama-2-7b", "--format", "json", *args)
    return time.monotonic() - t0, res


@pytest.mark.prometheus
def test_the_timeout_bounds_every_replay_and_what_is_late_says_so(servers):
    took, res = _timed(servers, "--timeout", "2", "--lever", "replicas:+1")
    assert took < 3.0, took
    doc = json.loads(res.stdout)
    if res.exit_code == 0:  # the calibration fitted within 2 s; the lever's replay may be late
        assert doc["calibration"]["ok"] is True
        (lever,) = doc["levers"]
        if lever.get("error") is None:
            assert lever["predicted"], lever
        else:
            assert lever["error"] == "the deadline passed", lever
        return
    assert res.exit_code == 1, res.stderr  # nothing predicted
    assert doc["calibration"]["ok"] is False
    assert doc["calibration"]["reason"].startswith("the deadline passed before the calibration")
    assert [lever["error"] for lever in doc["levers"]] == ["the deadline passed"]


@pytest.mark.prometheus
def test_a_lever_given_many_times_is_replayed_once(servers):
    many = ["--lever", "replicas:+1", "--lever", "replicas", "--lever", "max_num_seqs=x0.5"] * 300
    took, res = _timed(servers, "--timeout", "2", *many)
    assert took < 3.0, took
    doc = json.loads(res.stdout)
    assert [lever["lever"] for lever in doc["levers"]] == ["replicas:+1", "max_num_seqs:x0.5"]


def test_a_window_longer_than_what_if_fits_names_the_limit_and_its_options():
    res = run("what-if", "--prometheus-url", "http://127.0.0.1:9", "--since", "30d")
    one_line(res, 2, "--since 30 d", "at most 7 d", "a shorter --since", "--until")


@pytest.mark.prometheus
def test_a_bucket_bound_that_is_no_number_is_one_line(servers):
    prom, _, end = servers
    with serve(hostile(prom.url, bad_bucket)) as api:
        res = run("what-if", "--prometheus-url", api.url, "--until", str(int(end)), "--since",
                  "30m", "--preset", "llama-2-7b", "--gpu", "H100-80GB")  # fmt: skip
    one_line(res, 3, "a bucket le='abc', which is no bound")


@pytest.mark.prometheus
def test_a_dcgm_framebuffer_of_inf_is_one_line_asking_for_the_gpu(servers):
    prom, _, end = servers
    with serve(hostile(prom.url, infinite_gpu)) as api:
        res = run("what-if", "--prometheus-url", api.url, "--until", str(int(end)), "--since",
                  "30m", "--preset", "llama-2-7b")  # fmt: skip
    one_line(res, 3, "DCGM reports the framebuffer", "as +Inf MiB", "give --gpu")


def test_a_today_that_does_not_replay_is_one_line(monkeypatch):
    from diagnoser.whatif import setup
    from diagnoser.whatif.replay import ReplayError

    def no_start(*args, **kwargs):
        raise ReplayError("the engine does not start at this configuration")

    monkeypatch.setattr(setup, "predict", no_start)
    res = run("what-if", "--prometheus-url", "http://127.0.0.1:9", "--model", "m")
    one_line(res, 1, "today's configuration cannot be replayed: the engine does not start")
