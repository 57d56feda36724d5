"""``make demo``: a simulated incident in a throwaway local Prometheus, examined end to end.

Steps, each with a progress line: load the catalog; check the generated rules with promtool;
simulate the scenario with vLLM's metric names; backfill it with promtool; start Prometheus on
a free loopback port; show the evidence (baseline against now); run ``diagnose`` and print its
report; write the HTML version to out/demo-report.html, stop Prometheus (checking that its
port is free again) and remove its data. A failing step is named in one line on stderr.

With ``--watch``, one more step before Prometheus stops: ``servediag watch`` runs as a process
of its own over that Prometheus (``--since`` the scenario's window, ``--every 10s``), and the
demo prints the ``servediag_finding`` lines its ``/metrics`` serves once the finding is held
(from its second cycle on, about 10 s), then stops it. The history was simulated up to the
minute the demo started, so the watch's sliding window, ending at the wall clock, holds the
incident as a live one would.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

import click

from diagnoser.diagnosis import Window, diagnose
from diagnoser.outputs import rules
from diagnoser.outputs.rules import PromtoolError
from diagnoser.plumbing.errors import UserError
from diagnoser.plumbing.source import PrometheusSource, SourceError
from diagnoser.plumbing.units import fmt
from diagnoser.report.html import render as render_html
from diagnoser.report.text import text as render_text
from diagnoser.site import Site
from lab.promserver import Prometheus, PrometheusError, backfill, free_port, listening

STEPS = 8
WATCH_EVERY = 10  # seconds between the watch's cycles: the shortest it takes
WATCH_BUDGET = 60.0  # seconds the watch has to serve a finding
SERVED = ("servediag_finding", "servediag_health")
HTML_REPORT = Path("out") / "demo-report.html"
SETUP_HINT = "run 'make setup' (as root it installs the Debian packages prometheus and "
SETUP_HINT += "prometheus-alertmanager)"


class DemoError(Exception):
    """A step found something wrong (the watch process exited, or served no finding)."""


class Progress:
    """Numbered progress lines; remembers the step under way for the failure message."""

    def __init__(self, steps: int = STEPS) -> None:
        self.n = 0
        self.steps = steps
        self.what = "starting"

    def __call__(self, text: str) -> None:
        self.n += 1
        self.what = text
        click.echo(f"[{self.n}/{self.steps}] {text}")


def _value(prom: Prometheus, site: Site, name: str, t: float) -> float | None:
    sig = site.vocabulary[name]
    result = prom.query(sig.render(site.scope(sig)), at=t)
    return max(float(r["value"][1]) for r in result) if result else None


def _show(value: float | None, unit: str) -> str:
    return "no data" if value is None else fmt(value, unit)


@click.command()
@click.option(
    "--scenario",
    default="retrieval-launch",
    show_default=True,
    help="A scenario from the library (servediag simulate --list).",
)
@click.option(
    "--watch",
    "watch",
    is_flag=True,
    help="After the diagnosis, run servediag watch over the same Prometheus and print the "
    "findings it serves on /metrics (about 15 s more).",
)
def main(scenario: str, watch: bool) -> None:
    """Walk through a simulated incident with what this build can do."""
    from diagnoser.sim import library
    from lab.args import refuse

    try:  # a scenario that is not there is said before Prometheus is started
        library.find(scenario)
    except (UserError, OSError) as exc:
        refuse("python -m lab.demo", f"--scenario {exc}")
    progress = Progress(STEPS + 1 if watch else STEPS)
    try:
        run(scenario, progress, watch)
    except KeyboardInterrupt:
        click.echo("\ndemo: interrupted; Prometheus stopped and its data removed", err=True)
        sys.exit(130)
    except (UserError, PrometheusError, PromtoolError, SourceError, DemoError, OSError) as exc:
        text = str(exc) if not isinstance(exc, OSError) else f"{exc.strerror or exc}"
        if isinstance(exc, OSError) and exc.filename:
            text += f": {exc.filename}"
        click.echo(
            f"demo: step {progress.n}/{progress.steps} ({progress.what}) failed: {text}", err=True
        )
        if "not found on PATH" in text:
            click.echo(f"demo: {SETUP_HINT}", err=True)
        click.echo("demo: nothing was left running", err=True)
        sys.exit(2 if isinstance(exc, UserError) else 1)


def run(scenario: str, step: Progress, watch: bool = False) -> None:
    from diagnoser.metrics.exposition import write_openmetrics
    from diagnoser.sim import library
    from diagnoser.sim.run import simulate

    start = time.monotonic()
    html_path = HTML_REPORT.resolve()
    step("loading the playbook catalog and the scenario")
    site = Site.default()
    catalog = site.catalog
    sc = library.find(scenario)
    click.echo(f"      {len(catalog)} playbooks, {len(catalog.detectable())} with alerts")

    with tempfile.TemporaryDirectory(prefix="servediag-demo-") as tmp:
        step("generating Prometheus rules and checking them with promtool")
        files = rules.render_files(site)
        paths = []
        for name in (rules.RECORDING_FILE, rules.ALERTS_FILE):
            path = Path(tmp) / name
            path.write_text(files[name], encoding="utf-8")
            paths.append(path)
        rules.check_rules(paths)
        click.echo("      promtool check rules: SUCCESS")

        step(f"simulating '{sc.name}' ({sc.duration / 3600:g} h) with vLLM's metric names")
        t0 = time.monotonic()
        end = float(int(time.time()) // 60 * 60)
        rec = simulate(sc, end)
        openmetrics = Path(tmp) / f"{sc.name}.om"
        with openmetrics.open("w", encoding="utf-8") as fh:
            write_openmetrics(rec, fh)
        click.echo(f"      {rec.sample_count():,} samples in {time.monotonic() - t0:.1f} s")
        click.echo(
            textwrap.fill(sc.description, 96, initial_indent=" " * 6, subsequent_indent=" " * 6)
        )

        step("backfilling it into a throwaway TSDB with promtool")
        t0 = time.monotonic()
        data_dir = Path(tmp) / "tsdb"
        backfill(openmetrics, data_dir)
        click.echo(f"      {time.monotonic() - t0:.1f} s")

        step("starting a throwaway Prometheus on a free loopback port (with our rules)")
        with Prometheus(data_dir, rule_files=paths) as prom:
            click.echo(f"      {prom.url}")
            before = end - sc.labels.window - 600
            shown = (
                catalog[sc.labels.expect[0]].evidence
                if sc.labels.expect
                else ("request_rate", "ttft_p95", "itl_p95", "kv_cache_usage", "requests_waiting")
            )
            step("the evidence, an hour before the window against now:")
            for name in shown:
                unit = site.vocabulary[name].unit
                then, now = _value(prom, site, name, before), _value(prom, site, name, end)
                click.echo(f"      {name:<28} {_show(then, unit):>12} -> {_show(now, unit):>12}")
            until = time.strftime("%H:%M", time.gmtime(end))
            step(
                f"diagnose --since {sc.labels.window / 3600:g}h --until {until} "
                f"--prometheus-url {prom.url}"
            )
            window = Window.plan(sc.labels.window, end)
            result = diagnose(PrometheusSource(prom.url), site, window)
            click.echo()
            click.echo(render_text(result, colour=sys.stdout.isatty()), nl=False)
            click.echo()
            if watch:
                step(
                    f"servediag watch --since {sc.labels.window / 3600:g}h --every "
                    f"{WATCH_EVERY}s --prometheus-url {prom.url}"
                )
                with (Path(tmp) / "watch.log").open("w+", encoding="utf-8") as log:
                    show_watch(prom.url, sc.labels.window, end, log)
            step("writing the HTML report; stopping Prometheus and removing its data")
        still_up = listening(prom.port)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(render_html(result), encoding="utf-8")
    if still_up:
        raise PrometheusError(f"Prometheus still listens on {prom.url} after being stopped")
    found = result.findings[0].playbook.id if result.findings else "none"
    want = sc.labels.expect[0] if sc.labels.expect else "none"
    verdict = "as labelled" if found == want else f"the scenario is labelled {want}"
    click.echo(f"      top finding: {found} ({verdict})")
    click.echo(f"      HTML report: {html_path}")
    click.echo(
        f"done in {time.monotonic() - start:.1f} s; Prometheus stopped, its data removed, "
        "nothing left running"
    )


def show_watch(url: str, since: float, end: float, log: IO[str]) -> None:
    """Run ``servediag watch`` over ``url`` until its /metrics serves a finding; print the
    finding and verdict lines it serves, then stop it (checking that its port is free)."""
    port = free_port()
    args = [sys.executable, "-m", "diagnoser", "watch", "--prometheus-url", url]
    args += [
        "--since",
        f"{since:g}s",
        "--every",
        f"{WATCH_EVERY}s",
        "--listen",
        f"127.0.0.1:{port}",
    ]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, text=True)
    click.echo(
        f"      http://127.0.0.1:{port}/metrics; the simulated history ends "
        f"{max(time.time() - end, 0):.0f} s before its first cycle"
    )
    try:
        lines = _served(f"http://127.0.0.1:{port}/metrics", proc, log, t0 + WATCH_BUDGET)
        click.echo(
            f"      served after {time.monotonic() - t0:.0f} s (a finding is served from the "
            "second cycle that names it):"
        )
        for line in lines:
            click.echo(f"      {line}")
    finally:
        if proc.poll() is None:
            proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if listening(port):
        raise DemoError(f"servediag watch still listens on 127.0.0.1:{port} after being stopped")


def _served(url: str, proc: subprocess.Popen[str], log: IO[str], deadline: float) -> list[str]:
    """The finding and verdict lines of ``url`` once it serves a finding."""
    while True:
        if proc.poll() is not None:
            log.seek(0)
            last = (log.read().strip().splitlines() or ["no output"])[-1]
            raise DemoError(f"servediag watch exited with status {proc.returncode}: {last}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                text = resp.read().decode()
        except (urllib.error.URLError, OSError):
            text = ""
        lines = [line for line in text.splitlines() if line.startswith(SERVED)]
        if any(line.startswith("servediag_finding{") for line in lines):
            return lines
        if time.monotonic() > deadline:
            raise DemoError(f"servediag watch served no finding within {WATCH_BUDGET:g} s")
        time.sleep(1.0)


if __name__ == "__main__":
    from lab.args import click_main

    click_main(main, "python -m lab.demo")
