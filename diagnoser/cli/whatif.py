"""``servediag what-if``: replay the live workload through the calibrated engine, with and
without each lever of a fix."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from diagnoser.cli.options import (
    EXIT_FOUND,
    SourceOptions,
    config_option,
    fail,
    handles_errors,
    load_site,
    source_options,
)
from diagnoser.cli.shared import setup_options, since_option, until_option
from diagnoser.whatif.setup import SetupOptions


@click.command("what-if")
@since_option("Fit this much time up to --until.")
@until_option
@source_options("http://localhost:9090", "Prometheus-compatible API (also PROMETHEUS_URL).")
@click.option("--model", default=None, help="The model_name (default: the only one serving).")
@setup_options
@click.option(
    "--lever",
    "levers",
    multiple=True,
    metavar="NAME[:CHANGE]",
    help="A lever to predict, e.g. gpu_memory_utilization:+0.05, max_num_seqs:x0.75, "
    "kv_cache_dtype:fp8, replicas:+1 (repeatable; default: every lever of the catalog's "
    "fixes).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@config_option
@handles_errors
def what_if_cmd(
    since: float,
    until: float | None,
    source: SourceOptions,
    model: str | None,
    setup: SetupOptions,
    levers: tuple[str, ...],
    fmt: str,
    config_path: Path | None,
) -> None:
    """Predict what each fix's lever would do, from the live workload of one model.

    Fits the window's workload (arrival rate, prompt and output lengths, the share stopping
    on length, prefix-cache hits) and engine (vllm:cache_config_info, the scheduler limits,
    the GPU, the model's shape), replays it through the simulator and fits two speed
    factors until the replay matches what was measured (TTFT and ITL p50/p95, KV usage,
    preemptions, the queue, within 30%), then replays each lever: predicted TTFT and ITL
    p95, throughput, preemptions and SLO attainment next to today's, with the calibration's
    residual as a ± band. --timeout bounds all of it, the queries, the fit and every replay:
    a lever not replayed by then says "not predicted: the deadline passed", and the command
    ends with what it has. Exit status: 0 predicted, 1 nothing predicted (the calibration
    refused: the replay does not match the window; the deadline passed before it finished;
    today's configuration does not replay), 2 bad input (too little traffic to fit, a
    window longer than 7 days, an unknown model shape, a lever the engine does not have), 3
    the metric source cannot be reached or answers garbage.

    \b
    Examples:
      servediag what-if --since 1h --model llama-3.1-8b --preset llama-3.1-8b
      servediag what-if --model-config ./config.json --gpu H100-80GB \\
          --lever gpu_memory_utilization:+0.05 --lever max_num_seqs:x0.75 --format json
    """
    import time

    from diagnoser.catalog.levers import LeverError, parse_lever
    from diagnoser.whatif import report
    from diagnoser.whatif.fit import check_window
    from diagnoser.whatif.predict import unique
    from diagnoser.whatif.replay import ReplayError
    from diagnoser.whatif.setup import catalog_levers, predict, the_model

    check_window(since)
    prometheus = source.connect().operation()  # the deadline: from here, all of it
    site = load_site(config_path)
    try:
        chosen = unique([parse_lever(t) for t in levers]) or catalog_levers(site)
    except LeverError as exc:
        fail(f"--lever: {exc}")
    end = until if until is not None else time.time()
    start = end - since
    selector = site.config.selector
    if model is None:
        model = the_model(prometheus, selector, start, end)
    try:
        result = predict(
            prometheus, site, {"model_name": model}, (start, end), selector, setup, chosen
        )
    except ReplayError as exc:  # today's configuration does not serve: nothing to calibrate
        fail(f"today's configuration cannot be replayed: {exc}", EXIT_FOUND)
    for warning in prometheus.warnings:
        click.echo(f"servediag: warning: partial answer: {warning}", err=True)
    if fmt == "json":
        click.echo(json.dumps(report.to_json(result), indent=2))
    else:
        click.echo(report.text(result), nl=False)
    if not result.calibration.ok:
        sys.exit(EXIT_FOUND)
