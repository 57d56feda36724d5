"""Renderers of a typed ``Diagnosis``: text, Markdown, HTML, JSON, ``--explain`` and the chat
message. Each reads the same model; none guesses a shape from a dict."""

from __future__ import annotations

import json

from diagnoser.diagnosis.model import Diagnosis, to_json
from diagnoser.plumbing.printable import inert

FORMATS = ("text", "json", "markdown", "html", "csv")


def as_json(d: Diagnosis) -> str:
    return json.dumps(to_json(d), indent=2, sort_keys=False) + "\n"


def render(d: Diagnosis, fmt: str, colour: bool = False) -> str:
    """The report in ``fmt``. Text, Markdown and HTML pass through ``plumbing.printable.inert``:
    whatever Prometheus put in a value, no control character reaches the reader's terminal
    (each label value is already written with ``printable`` where it is placed)."""
    if fmt == "json":
        return as_json(d)
    if fmt == "csv":
        from diagnoser.report.csv import to_csv

        return inert(to_csv(d))
    if fmt == "markdown":
        from diagnoser.report.markdown import markdown

        return inert(markdown(d))
    if fmt == "html":
        from diagnoser.report.html import render as html

        return inert(html(d))
    from diagnoser.report.text import text

    return inert(text(d, colour=colour), sgr=colour)
