"""servediag: the command line. A thin layer: parse options, call the library, render.

One module per command (``catalog``, ``generate``, ``simulate``, ``probe``, ``diagnose``,
``webhook``, ``watch``, ``kvbudget``, ``whatif``); shared options in ``options``, parameter types in
``params``.
Exit status: 0 success; 1 a check found something (stale generated files); 2 bad usage, a
bad playbook or config; 3 the metric source cannot be reached or answers garbage. Heavy
modules are imported inside commands so ``--help`` stays fast.
"""

from __future__ import annotations

import click

from diagnoser.cli.catalog import catalog
from diagnoser.cli.diagnose import diagnose_cmd, diagnose_main
from diagnoser.cli.generate import generate_cmd, runbook_cmd, signals_cmd
from diagnoser.cli.kvbudget import kv_budget_cmd
from diagnoser.cli.options import EXIT_FOUND, EXIT_SOURCE, EXIT_USAGE, OneLineGroup
from diagnoser.cli.probe import probe_cmd
from diagnoser.cli.simulate import simulate_cmd
from diagnoser.cli.watch import watch_cmd
from diagnoser.cli.webhook import webhook_cmd
from diagnoser.cli.whatif import what_if_cmd

__all__ = ["EXIT_FOUND", "EXIT_SOURCE", "EXIT_USAGE", "diagnose_main", "main"]


@click.group(cls=OneLineGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="servediag")
def main() -> None:
    """Diagnose LLM inference servers (vLLM) from Prometheus.

    \b
    Examples:
      servediag catalog list
      servediag runbook kv-cache-pressure
      servediag generate --check
      servediag diagnose --since 1h
    """


for command in (
    catalog,
    signals_cmd,
    generate_cmd,
    runbook_cmd,
    simulate_cmd,
    probe_cmd,
    diagnose_cmd,
    webhook_cmd,
    watch_cmd,
    kv_budget_cmd,
    what_if_cmd,
):
    main.add_command(command)
