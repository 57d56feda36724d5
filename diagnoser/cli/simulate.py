"""``servediag simulate``: a scenario's metrics with vLLM's names, to a file or served live.

The simulator's own command: the only CLI module that imports ``diagnoser.sim``.
"""

from __future__ import annotations

from pathlib import Path

import click

from diagnoser.cli.options import catalog_option, fail, handles_errors, load_catalog
from diagnoser.cli.params import HOST_PORT, TIMESTAMP, FiniteRange
from diagnoser.plumbing.durations import format_duration


@click.command("simulate")
@click.argument("scenario", required=False)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write timestamped OpenMetrics here (for promtool tsdb create-blocks-from).",
)
@click.option(
    "--end",
    "end",
    type=TIMESTAMP,
    default=None,
    metavar="TIME",
    help="Time of the last sample: RFC 3339 or Unix seconds (default: now).",
)
@click.option(
    "--serve",
    "listen",
    type=HOST_PORT,
    default=None,
    metavar="HOST:PORT",
    help="Serve /metrics live, in real time, instead of writing a file.",
)
@click.option(
    "--speed",
    type=FiniteRange(min=0.01, max=1000),
    default=1.0,
    show_default=True,
    help="With --serve: simulated seconds per wall second.",
)
@click.option(
    "--proxy-buffer",
    "proxy_buffer",
    default=None,
    metavar="SECONDS|full",
    help="With --serve: a buffering proxy in front of the API that releases streams every "
    "SECONDS (simulated), or only when complete ('full').",
)
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--list", "list_", is_flag=True, help="List the library's scenarios and exit.")
@catalog_option
@handles_errors
def simulate_cmd(
    scenario: str | None,
    out: Path | None,
    end: float | None,
    listen: tuple[str, int] | None,
    speed: float,
    proxy_buffer: str | None,
    force: bool,
    list_: bool,
    catalog_dirs: tuple[Path, ...],
) -> None:
    """Simulate a scenario with vLLM's real metric names.

    SCENARIO is a name from the library (fixtures/scenarios) or a path to a YAML file. With
    --serve it runs in real time and also answers OpenAI-compatible requests
    (/v1/completions, /v1/chat/completions, streamed or not) with the timing its engine
    predicts.

    \b
    Examples:
      servediag simulate retrieval-launch --out incident.om
      promtool tsdb create-blocks-from openmetrics incident.om ./data
      servediag simulate healthy-diurnal --serve 127.0.0.1:8000
      servediag simulate healthy-steady --serve 127.0.0.1:8000 --proxy-buffer full
    """
    import time

    from diagnoser.sim import library

    if list_:
        for name in library.names():
            click.echo(name)
        return
    if scenario is None:
        fail("name a scenario (servediag simulate --list shows the library)")
    if (out is None) == (listen is None):
        fail("give exactly one of --out FILE or --serve HOST:PORT")
    if proxy_buffer is not None and listen is None:
        fail("--proxy-buffer needs --serve")
    proxy = None
    if proxy_buffer is not None:
        from diagnoser.sim.openai import ProxyBuffer

        try:
            proxy = ProxyBuffer.parse(proxy_buffer)
        except ValueError as exc:
            fail(f"--proxy-buffer: {exc}")
    from diagnoser.sim.scenario import check_labels

    sc = library.find(scenario)
    check_labels(sc, load_catalog(catalog_dirs).ids())
    if listen is not None:
        from diagnoser.sim.live import serve

        host, port = listen

        def listening() -> None:
            click.echo(
                f"serving {sc.name} on http://{host}:{port} (/metrics, /v1/models, "
                "/v1/completions, /v1/chat/completions; Ctrl-C to stop)",
                err=True,
            )

        try:
            serve(sc, host, port, speed=speed, proxy=proxy, listening=listening)
        except OSError as exc:
            fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
        except KeyboardInterrupt:
            pass
        return
    assert out is not None
    from diagnoser.plumbing.atomic import Staged, refusal

    why = refusal(out)
    if why is not None:
        fail(f"--out {out}: {why}")
    if out.exists() and not force:
        fail(f"{out} exists; pass --force to overwrite it")
    end_ts = end if end is not None else time.time()
    if end_ts - sc.duration < 0:
        fail(f"--end: the scenario's {format_duration(sc.duration)} would begin before 1970")
    from diagnoser.metrics.exposition import write_openmetrics
    from diagnoser.sim.run import simulate

    # Open the file first: an unwritable --out is said before minutes of simulation. It is a
    # new temporary file beside --out (a link planted at a guessable name is not followed),
    # renamed over --out once whole.
    staged = Staged()
    try:
        fh = staged.open_text(out)
    except OSError as exc:
        staged.discard()
        fail(f"cannot write {out}: {exc.strerror or exc}")
    t0 = time.monotonic()
    try:
        with staged:
            with fh:
                rec = simulate(sc, end_ts)
                write_openmetrics(rec, fh)
            staged.commit()
    except OSError as exc:
        fail(f"cannot write {out}: {exc.strerror or exc}")
    click.echo(
        f"{sc.name}: {sc.duration / 3600:g} h simulated in {time.monotonic() - t0:.1f} s,"
        f" {rec.sample_count()} samples -> {out}",
        err=True,
    )
