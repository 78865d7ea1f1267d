"""The one CSV writer of the project: RFC 4180 quoting, ``\\n`` line ends, and cells defused so
that no spreadsheet evaluates them.

Everything mpigate exports as CSV (``mpigate audit export --format csv``, ``mpigate report
--format csv``) holds text a tenant chose: TrainJob and user names, messages that quote them. A cell
that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is a formula to Excel,
LibreOffice and Google Sheets (``=HYPERLINK(...)`` exfiltrates the sheet, ``=cmd|...`` ran
commands in older Excel). OWASP's rule ("CSV Injection"): prefix such a cell with a single quote,
which the spreadsheet shows as text and keeps out of the value. Numbers (``int``/``float``) are
written as numbers; only text is defused.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from typing import IO, Any, Final

__all__ = ["FORMULA_PREFIXES", "SafeCsvWriter", "cell"]

# OWASP, CSV Injection: "Ensure that no cells begin with any of the following characters".
FORMULA_PREFIXES: Final = ("=", "+", "-", "@", "\t", "\r")


def cell(value: Any) -> str:
    """One cell: ``None`` empty, booleans ``true``/``false``, numbers as written, text defused."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    text = str(value)
    return "'" + text if text.startswith(FORMULA_PREFIXES) else text


class SafeCsvWriter:
    """Rows of cells (:func:`cell` applied to each) to a text stream opened with ``newline=""``.

    The csv module quotes a cell only for the delimiter, the quote and the characters of its line
    terminator: with ``"\n"`` a lone carriage return inside a cell went out bare, and a spreadsheet
    starts a new row there (a tenant's name could add rows). So each row is formatted with the
    terminator ``"\r\n"`` — every cell holding a CR or an LF is quoted — and ends in ``"\n"``."""

    def __init__(self, out: IO[str]) -> None:
        self._out = out
        self._row = io.StringIO()
        self._writer = csv.writer(self._row, lineterminator="\r\n")

    def writerow(self, values: Iterable[Any]) -> None:
        row = self._row
        row.seek(0)
        row.truncate()
        self._writer.writerow([cell(v) for v in values])
        self._out.write(row.getvalue()[:-2] + "\n")
