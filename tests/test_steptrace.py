"""The lab's step trace: the hook vLLM's processes load, and what a trace's steps say. The
hook is tried on a stand-in for vLLM's scheduler module (the real one is traced in the lab:
``python -m lab.real.steptrace``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnoser.sim import costs
from lab.real import steptrace
from lab.real.server import VllmServer

HOOK = Path(steptrace.__file__).resolve().parent / "stephook"

# vLLM V1's scheduler as far as the hook reads it: schedule() counts a request's tokens as
# computed once it has scheduled them, as vLLM's _update_after_schedule does.
STAND_IN = """
from types import SimpleNamespace as NS

class Scheduler:
    def __init__(self):
        self.requests = {"req-0001": NS(num_computed_tokens=0, num_prompt_tokens=40,
                                        num_output_tokens=0)}
        self.running, self.waiting = [], ["w"]
        self.kv_cache_manager = NS(usage=0.25)

    def schedule(self):
        r = self.requests["req-0001"]
        r.num_computed_tokens += 40
        self.running = ["req-0001"]
        return NS(num_scheduled_tokens={"req-0001": 40}, scheduled_new_reqs=[r],
                  scheduled_cached_reqs=NS(resumed_req_ids=set()), preempted_req_ids=None)

    def update_from_output(self, so, mo):
        return "updated"
"""


@pytest.mark.parametrize("traced", ["yes", "no", "unwritable"])
def test_the_hook_writes_each_step_of_vllms_scheduler_and_nothing_untraced(tmp_path, traced):
    pkg = tmp_path / "vllm" / "v1" / "core" / "sched"
    pkg.mkdir(parents=True)
    for d in (pkg, *pkg.parents):
        if d == tmp_path:
            break
        (d / "__init__.py").write_text("")
    (pkg / "scheduler.py").write_text(STAND_IN)
    trace = tmp_path / "steps"
    env = {**os.environ, "PYTHONPATH": f"{HOOK}{os.pathsep}{tmp_path}"}
    env.pop("SERVEDIAG_STEP_TRACE", None)
    if traced != "no":
        where = trace if traced == "yes" else tmp_path / "no-such-directory" / "steps"
        env["SERVEDIAG_STEP_TRACE"] = str(where)
    code = (
        "from vllm.v1.core.sched.scheduler import Scheduler\n"
        "s = Scheduler(); print(s.update_from_output(s.schedule(), None))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "updated"  # the scheduler's own answers pass through
    files = list(tmp_path.glob("steps.*"))
    if traced != "yes":  # nothing written; a trace that cannot be written leaves vLLM running
        assert files == []
        assert ("not traced" in done.stderr) == (traced == "unwritable")
        return
    (file,) = files
    (step,) = steptrace.read([file])
    assert step["reqs"] == [["req-0001", 40, 40, 40, 0]]
    assert (step["new"], step["resumed"], step["preempted"]) == (1, 0, 0)
    assert (step["running"], step["waiting"], step["kv"]) == (1, 1, 0.25)
    assert step["t1"] >= step["t0"]


def test_a_traced_server_loads_the_hook_and_says_where_to_write(tmp_path):
    server = VllmServer(tmp_path, tmp_path, 1, [], tmp_path / "log", trace=tmp_path / "t")
    assert server.trace == tmp_path / "t"
    assert (HOOK / "sitecustomize.py").is_file()


def _step(t: float, seconds: float, reqs: list[list[object]], **more: int) -> dict[str, object]:
    return {"t0": t, "t1": t + seconds, "reqs": reqs, "new": 0, "resumed": 0, "preempted": 0,
            "running": 2, "waiting": 0, "kv": 0.5, **more}  # fmt: skip


def test_the_summary_counts_the_tokens_that_waited_behind_a_prefill():
    # Two streams decode in 50 ms steps; a 200-token prompt's prefill step of 0.6 s carries
    # them once; then one is preempted and recomputed in a step of 0.2 s.
    steps, t = [], 0.0
    for k in range(20):
        steps.append(_step(t, 0.05, [["a", 1, 100 + k, 90, 10 + k], ["b", 1, 60 + k, 50, 10 + k]]))
        t += 0.05
    prefill = [["c", 200, 200, 200, 0], ["a", 1, 120, 90, 30], ["b", 1, 80, 50, 30]]
    steps.append(_step(t, 0.6, prefill, new=1))
    t += 0.6
    steps.append(_step(t, 0.05, [["a", 1, 121, 90, 31], ["c", 1, 201, 200, 1]], preempted=1))
    t += 0.05
    steps.append(_step(t, 0.2, [["b", 80, 81, 50, 31], ["a", 1, 122, 90, 32]], resumed=1))
    got = steptrace.summarise(steps)
    kinds = got["kinds"]
    assert kinds["decode"]["steps"] == 21 and kinds["prefill+decode"]["steps"] == 1
    assert kinds["recompute+decode"]["median"] == pytest.approx(0.2)
    assert (got["new"], got["preempted"], got["resumed"]) == (1, 1, 1)
    gaps = got["gaps"]
    # 19 + 19 decode gaps at 50 ms, a and b behind the prefill (0.6 s), a at 50 ms, b after
    # its preemption (0.25 s) and a again at 0.2 s; c's first token is no gap, its second is.
    assert gaps["count"] == 38 + 2 + 1 + 1 + 1 + 1
    assert gaps["slow_over"] == pytest.approx(0.1)
    assert gaps["slow_share"] == pytest.approx(4 / 44)
    assert steptrace.lines(got)[-1].endswith("(twice the median decode step)")
    # The first seconds can be left out; nothing left is said in one line.
    assert steptrace.summarise(steps, skip=0.475)["steps"] == len(steps) - 10
    assert steptrace.lines(steptrace.summarise(steps, skip=60)) == ["no steps traced"]


@pytest.mark.parametrize(
    "line, lacks", [(json.dumps({"t0": 1}), "kv"), ("5", "JSON object"), ("{", "JSON object")]
)
def test_a_file_that_is_not_a_trace_is_one_line_and_exit_2(tmp_path, capsys, line, lacks):
    bad = tmp_path / "steps.1"
    bad.write_text(line + "\n")
    with pytest.raises(SystemExit) as exc:
        steptrace.main(["--read", str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"steptrace: {bad}:1: not a step of a trace (no {lacks})"


def test_without_vllms_cpu_build_the_run_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        steptrace.main(["chunk-room", "--venv", str(tmp_path / "none"), "--seconds", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"steptrace: no vLLM CPU build in {tmp_path / 'none'} (make real installs it)"


def test_each_step_is_priced_as_the_simulators_engine_would_charge_it(tmp_path, capsys):
    """A decode step at twice its modelled time reads 2.0; a prefill chunk is charged its
    linear layers and its attention after the tokens already computed; ``--read`` with an
    experiment prints the table."""
    built, spec = steptrace.experiment_costs("chunk-room")
    decode = built.step(2, 160 + 110)
    chunk = built.step(0, 0, 200, costs.attention_flops(spec, 0, 200))
    steps = [
        _step(0.0, 2 * decode, [["a", 1, 160, 150, 10], ["b", 1, 110, 100, 10]]),
        _step(1.0, chunk, [["c", 200, 200, 300, 0]]),
        _step(2.0, 0.5, []),  # nothing scheduled: no step to price
    ]
    table = steptrace.price(steps, built, spec)
    assert set(table) == {"decode", "prefill"}
    assert table["decode"]["ratio"] == pytest.approx(2.0)
    assert table["prefill"]["ratio"] == pytest.approx(1.0)
    assert table["prefill"]["modelled"] == pytest.approx(chunk)
    # The calibration's factors price the steps at the fitted speeds: at half the decode
    # speed, a decode step costs more (its reads and host costs twice over), a chunk as much.
    slower, _ = steptrace.experiment_costs("chunk-room", 1.0, 0.5)
    again = steptrace.price(steps, slower, spec)
    assert again["decode"]["ratio"] == pytest.approx(2 * decode / slower.step(2, 270))
    assert 1.0 < again["decode"]["ratio"] < 1.2
    assert again["prefill"]["ratio"] == pytest.approx(
        chunk / slower.step(0, 0, 200, costs.attention_flops(spec, 0, 200))
    )
    trace = tmp_path / "steps.1"
    trace.write_text("".join(json.dumps(s) + "\n" for s in steps))
    steptrace.main(["chunk-room", "--read", str(trace), "--skip", "0"])
    out = capsys.readouterr().out
    assert "priced by the simulator's cost model" in out and "median ratio 2.00" in out


def test_pricing_by_an_unknown_experiment_is_one_line_before_any_summary(tmp_path, capsys):
    trace = tmp_path / "steps.1"
    trace.write_text(json.dumps(_step(0.0, 0.05, [["a", 1, 11, 10, 1]])) + "\n")
    with pytest.raises(SystemExit) as exc:
        steptrace.main(["nope-room", "--read", str(trace)])
    assert exc.value.code == 2
    got = capsys.readouterr()
    assert got.out == ""
    assert got.err.startswith("python -m lab.real.steptrace: error: no experiment 'nope-room'")
    assert len(got.err.strip().splitlines()) == 1
