"""What-if against a real vLLM, replayed. Each recorded experiment (tests/data/real-what-if)
ran vLLM's CPU build at today's configuration and then at each lever's, with the same load;
here what-if is fitted and calibrated again from the answers its Prometheus gave, and each
lever's prediction, and what the server measured at that lever, must be the recorded ones
(``UPDATE_GOLDENS=1`` writes them again after a change to the simulator). And the command
itself, on the raw samples backfilled into a real Prometheus, predicts the same."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from clitest import run

from lab.real import whatif
from lab.real.record import raw_prometheus

RUNS = whatif.recorded()


def test_there_is_a_recorded_experiment():
    assert [d.name for d in RUNS] == whatif.names()


def _close(a: object, b: object, path: str = "") -> list[str]:
    """Where two JSON documents differ beyond float rounding."""
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return [d for k in sorted(keys) for d in _close(a.get(k), b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if a == pytest.approx(b, rel=1e-6, abs=1e-9) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.slow
@pytest.mark.parametrize("directory", RUNS, ids=lambda d: d.name)
def test_a_recorded_experiment_replays_to_its_recorded_result(directory: Path):
    result, _ = whatif.replayed(directory)
    got = json.loads(json.dumps(result.to_json()))
    path = directory / "result.json"
    if os.environ.get("UPDATE_GOLDENS"):
        path.write_text(json.dumps(got, indent=1) + "\n")
    want = json.loads(path.read_text())
    differ = _close(got, want)
    assert not differ, "\n".join(differ[:20])
    # Every lever was measured on a window with traffic in it, and predicted unless the
    # calibration refused (held-out stall-room does: see docs/lab/real-what-if.md).
    ok = got["calibration"]["ok"]
    assert ok or "does not match the window" in got["calibration"]["reason"]
    for lever in got["levers"]:
        assert lever["measured"]["requests_per_second"] > 0.2
        assert lever["error"] is None
        assert (lever["predicted"]["requests_per_second"] > 0.2) if ok else not lever["predicted"]


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    directory = RUNS[0]
    tmp = tmp_path_factory.mktemp("real-what-if")
    prov = json.loads((directory / "provenance.json").read_text())
    config = tmp / "config.json"
    config.write_text(json.dumps({**prov["model"], "max_position_embeddings": 32768}))
    with raw_prometheus(directory, tmp) as prom:
        yield prom, directory, prov, config


@pytest.mark.prometheus
def test_the_command_on_a_real_servers_window_predicts_what_the_lab_recorded(backfilled):
    prom, directory, prov, config = backfilled
    e = whatif.find(prov["experiment"])
    start, end = prov["windows"]["today"]
    levers = [a for t in e.trials for a in ("--lever", t.lever.text)]
    out = run(
        "what-if", "--prometheus-url", prom.url, "--since", f"{int(end - start)}s",
        "--until", str(end), "--gpu", "CPU", "--model-config", str(config),
        "--dtype", "float32", "--max-model-len", str(e.flag("--max-model-len", None)),
        *levers, "--format", "json",
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    doc = json.loads(out.stdout)
    recorded = json.loads((directory / "result.json").read_text())
    assert doc["calibration"]["ok"]
    assert doc["calibration"]["prefill_factor"] == recorded["calibration"]["prefill_factor"]
    predicted = {o["lever"]: o["predicted"] for o in doc["levers"]}
    for lever in recorded["levers"]:
        for name in ("ttft_p95", "itl_p95", "preemptions_per_second"):
            assert predicted[lever["lever"]][name] == pytest.approx(lever["predicted"][name])
