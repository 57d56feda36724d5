"""A diagnosis's findings as CSV (``diagnose --format csv``), for a spreadsheet: the rows
``diagnosis.rows`` builds, written with the standard library alone."""

from __future__ import annotations

import csv
import io
from typing import Any

from diagnoser.diagnosis.model import Diagnosis
from diagnoser.diagnosis.rows import finding_columns, finding_rows

# A cell a spreadsheet would take for a formula (OWASP's CSV injection): what a label value
# from outside starts with gets a leading apostrophe.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


def to_csv(d: Diagnosis) -> str:
    """The findings table as CSV: a header row (also when nothing was found), then one row
    per finding and condition; empty cells for no number, and a text cell that a
    spreadsheet would run as a formula (``=``, ``+``, ``-``, ``@``) behind an apostrophe."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=finding_columns(d), lineterminator="\n")
    writer.writeheader()
    for row in finding_rows(d):
        writer.writerow({k: _cell(v) for k, v in row.items()})
    return out.getvalue()
