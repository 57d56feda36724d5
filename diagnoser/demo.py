"""``make demo``: a simulated incident in a throwaway local Prometheus, examined end to end.

Steps: load the catalog; check the generated rules with promtool; simulate the scenario with
vLLM's metric names; backfill it into a Prometheus on a free loopback port; show the evidence
(baseline against now); run ``diagnose`` and print its report, writing the HTML version to
out/demo-report.html; stop Prometheus and remove its data.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import click

from diagnoser import report, rules
from diagnoser.catalog import load_catalog
from diagnoser.config import RulesConfig
from diagnoser.diagnosis import Window, diagnose, to_json
from diagnoser.errors import UserError
from diagnoser.promserver import Prometheus, PrometheusError
from diagnoser.report_html import render as render_html
from diagnoser.signals import SIGNALS
from diagnoser.source import PrometheusSource

STEPS = 6
HTML_REPORT = Path("out") / "demo-report.html"


def step(n: int, text: str) -> None:
    click.echo(f"[{n}/{STEPS}] {text}")


def _value(prom: Prometheus, name: str, t: float) -> float | None:
    result = prom.query(SIGNALS[name].render(), at=t)
    return max(float(r["value"][1]) for r in result) if result else None


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "no data"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    if unit == "ratio":
        return f"{value:.1%}"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


@click.command()
@click.option(
    "--scenario",
    default="retrieval-launch",
    show_default=True,
    help="A scenario from the library (servediag simulate --list).",
)
def main(scenario: str) -> None:
    """Walk through a simulated incident with what this build can do."""
    try:
        run(scenario)
    except (UserError, PrometheusError, rules.PromtoolError) as exc:
        click.echo(f"demo: error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, UserError) else 1)


def run(scenario: str) -> None:
    from diagnoser.sim import harness, library

    start = time.monotonic()
    html_path = HTML_REPORT.resolve()
    step(1, "loading the playbook catalog")
    catalog = load_catalog()
    sc = library.find(scenario)
    click.echo(f"      {len(catalog)} playbooks, {len(catalog.detectable())} with alerts")

    with tempfile.TemporaryDirectory(prefix="servediag-demo-") as tmp:
        step(2, "generating Prometheus rules and checking them with promtool")
        files = rules.render_files(catalog, RulesConfig())
        paths = []
        for name in (rules.RECORDING_FILE, rules.ALERTS_FILE):
            path = Path(tmp) / name
            path.write_text(files[name], encoding="utf-8")
            paths.append(path)
        rules.check_rules(paths)
        click.echo("      promtool check rules: SUCCESS")

        step(
            3,
            f"simulating '{sc.name}' ({sc.duration / 3600:g} h) with vLLM's metric names, "
            "and backfilling it with promtool",
        )
        prepared = harness.prepare([sc.name], Path(tmp) / "tsdb")[sc.name]
        click.echo(
            f"      {prepared.samples:,} samples; simulated in "
            f"{prepared.simulate_seconds:.1f} s, backfilled in "
            f"{prepared.backfill_seconds:.1f} s"
        )
        click.echo(f"      {sc.description}")

        step(4, "starting a throwaway Prometheus on a free loopback port (with our rules)")
        with Prometheus(prepared.data_dir, rule_files=paths) as prom:
            click.echo(f"      {prom.url}")
            end = prepared.end
            before = end - sc.labels.window - 600
            shown = (
                catalog[sc.labels.expect[0]].evidence
                if sc.labels.expect
                else ("request_rate", "ttft_p95", "itl_p95", "kv_cache_usage", "requests_waiting")
            )
            step(5, "the evidence, an hour before the window against now:")
            for name in shown:
                sig = SIGNALS[name]
                then, now = _value(prom, name, before), _value(prom, name, end)
                click.echo(
                    f"      {name:<28} {_fmt(then, sig.unit):>12} -> {_fmt(now, sig.unit):>12}"
                )
            until = time.strftime("%H:%M", time.gmtime(end))
            step(
                6,
                f"diagnose --since {sc.labels.window / 3600:g}h --until {until} "
                f"--prometheus-url {prom.url}",
            )
            window = Window.plan(sc.labels.window, end)
            result = diagnose(PrometheusSource(prom.url), catalog, window)
            doc = to_json(result)
    click.echo()
    click.echo(report.text(doc, colour=sys.stdout.isatty()), nl=False)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    html_path.write_text(render_html(result, doc), encoding="utf-8")
    found = doc["findings"][0]["id"] if doc["findings"] else "none"
    want = sc.labels.expect[0] if sc.labels.expect else "none"
    verdict = "as labelled" if found == want else f"the scenario is labelled {want}"
    click.echo(f"\ntop finding: {found} ({verdict}); HTML report: {html_path}")
    click.echo(
        f"done in {time.monotonic() - start:.1f} s; Prometheus stopped, its data removed, "
        "nothing left running"
    )


if __name__ == "__main__":
    main()
