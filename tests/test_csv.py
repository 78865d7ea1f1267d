"""The project's one CSV writer (issue 18 item 7): OWASP's formula rule on every text cell, a CR
inside a cell quoted, and no other CSV writer in the source."""

from __future__ import annotations

import csv
import io
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpigate._csv import FORMULA_PREFIXES, SafeCsvWriter, cell
from tests.conftest import REPO


def _roundtrip(rows: list[list[object]]) -> list[list[str]]:
    buffer = io.StringIO(newline="")
    writer = SafeCsvWriter(buffer)
    for row in rows:
        writer.writerow(row)
    text = buffer.getvalue()
    assert text.endswith("\n") or not rows  # rows end in \n
    return list(csv.reader(io.StringIO(text, newline="")))


@pytest.mark.parametrize("prefix", FORMULA_PREFIXES)
def test_text_starting_a_formula_is_defused(prefix: str) -> None:
    assert cell(f"{prefix}SUM(A1)") == f"'{prefix}SUM(A1)"
    assert _roundtrip([[f"{prefix}1+1"]]) == [[f"'{prefix}1+1"]]


def test_numbers_stay_numbers_and_none_is_empty() -> None:
    assert [cell(v) for v in (-3, 2.5, None, True, False, "-3")] == ["-3", "2.5", "", "true", "false", "'-3"]


def test_a_carriage_return_cannot_start_a_row() -> None:
    assert _roundtrip([["a", "x\ry", "b"], ["next"]]) == [["a", "x\ry", "b"], ["next"]]


@given(st.lists(st.lists(st.one_of(st.text(), st.integers(), st.none()), min_size=1, max_size=5), max_size=5))
def test_every_cell_reads_back_and_none_is_a_formula(rows: list[list[object]]) -> None:
    read = _roundtrip(rows)
    assert read == [[cell(v) for v in row] for row in rows]
    assert not any(
        c.startswith(FORMULA_PREFIXES) for row in read for c in row if not re.fullmatch(r"-\d+", c)
    )


def test_no_other_csv_writer_in_the_source() -> None:
    """Every CSV the project writes goes through mpigate._csv (the report's and audit export's)."""
    offenders = [
        str(path.relative_to(REPO))
        for path in (REPO / "src" / "mpigate").rglob("*.py")
        if path.name != "_csv.py"
        and re.search(r"csv\.(writer|DictWriter)\(", path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
