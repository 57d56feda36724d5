"""``make bench``: figures for the parts that exist (catalog, rules, CLI start-up)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from diagnoser import rules
from diagnoser.catalog import load_catalog
from diagnoser.config import RulesConfig


def timed(fn: Callable[[], object], runs: int = 5) -> float:
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    catalog = load_catalog()
    load_s = timed(load_catalog)
    render_s = timed(lambda: rules.render_files(catalog, RulesConfig()))

    def cli(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "diagnoser", *args], check=True, capture_output=True)

    help_s = timed(lambda: cli("--help"))
    diag_help_s = timed(lambda: cli("diagnose", "--help"), runs=3)
    list_s = timed(lambda: cli("catalog", "list"))
    files = rules.render_files(catalog, RulesConfig())
    n_rec = files[rules.RECORDING_FILE].count("- record:")
    n_alert = files[rules.ALERTS_FILE].count("- alert:")
    print(f"catalog load ({len(catalog)} playbooks, schema-validated): {load_s * 1000:.0f} ms")
    print(f"rules render ({n_rec} recording, {n_alert} alerting): {render_s * 1000:.0f} ms")
    print(f"servediag --help (process start to exit): {help_s * 1000:.0f} ms")
    print(f"servediag diagnose --help: {diag_help_s * 1000:.0f} ms")
    print(f"servediag catalog list: {list_s * 1000:.0f} ms")


if __name__ == "__main__":
    main()
