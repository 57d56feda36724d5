"""lab.recovery: how long after a recovery a window of each length reads clean, on a small
scenario in a real Prometheus, and its arithmetic on hand-built readings."""

from __future__ import annotations

import pytest

from lab import recovery
from lab.recovery import Reading, Row

SCENARIO = """\
description: >-
  Llama 3.1 8B on one H100 with --max-num-seqs 24 at about 3 requests a second; arrivals
  double for ten minutes, the batch is pinned at 24 and requests queue, then fall back.
duration: 45m
scrape_interval: 15s
seed: 31
labels:
  window: 10m
  expect: []
  ended: [batch-slot-limit]
models:
  - name: m
    preset: llama-3.1-8b
    gpu: H100-80GB
    engine: {max_num_seqs: 24, max_num_batched_tokens: 8192, max_model_len: 32768}
    workload:
      rate: {mean: 3.0, noise: 0.05}
      prompt: {median: 800, sigma: 0.5}
      output: {median: 300, sigma: 0.6}
      max_tokens: 2048
    timeline:
      - {at: 20m, set: {workload.rate.mean: 6.2}}
      - {at: 30m, set: {workload.rate.mean: 3.0}}
"""


def _reading(end: float, *current: str, health: str = "healthy") -> Reading:
    return Reading(end, tuple(current), (), (), (health,))


def test_clean_from_is_the_first_window_clean_for_good():
    rows = Row(
        300.0,
        1000.0,
        (
            _reading(1000, "batch-slot-limit", health="unhealthy"),
            _reading(1060),  # clean once, then not again: not yet for good
            _reading(1120, health="unhealthy"),
            _reading(1180),
            _reading(1240),
        ),
    )
    assert rows.clean_from == rows.readings[3] and rows.minutes == pytest.approx(3.0)
    never = Row(300.0, 1000.0, (_reading(1000), _reading(1060, "queue-saturation")))
    assert never.clean_from is None and never.minutes is None
    assert recovery.ends(1000.0, 1095.0, 30.0) == [1000.0, 1030.0, 1060.0, 1090.0]
    (head, line) = recovery.table([rows])
    assert head.startswith("--since") and line.split()[:5] == ["5", "min", "5", "3.0", "min"]


@pytest.mark.slow
@pytest.mark.prometheus
def test_a_short_window_reads_clean_some_minutes_after_the_recovery(tmp_path, capsys):
    path = tmp_path / "spike.yaml"
    path.write_text(SCENARIO)
    assert recovery.main([str(path), "--since", "5m", "--every", "1m"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("spike: recovery 30 min into the scenario")
    since, _, windows, after, unit = out[2].split()[:5]  # "5 min  16  4.0 min  ..."
    assert (since, windows, unit) == ("5", "16", "min"), out
    # A five-minute window holds none of the incident from five minutes after it ended.
    assert 0 <= float(after) <= 10, out
