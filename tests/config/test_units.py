from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpigate.config.units import format_duration, parse_duration, parse_quantity


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("256", 256),
        ("500m", Fraction(1, 2)),
        ("2Ti", 2 * 2**40),
        ("1.5G", 1_500_000_000),
        ("16Gi", 16 * 2**30),
        ("1e3", 1000),
        ("0.1", Fraction(1, 10)),
        (".5", Fraction(1, 2)),
        ("+4", 4),
        (8, 8),
    ],
)
def test_quantities(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("bad", ["lots", "1.2.3", "4 Gi", "Gi", "", "1gi", "1e99"])
def test_bad_quantities(bad: str) -> None:
    with pytest.raises(ValueError, match=r"quantity|exponent"):
        parse_quantity(bad)


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "k", "M", "Ki", "Mi", "Gi", "m"]))
def test_quantity_scaling(n: int, suffix: str) -> None:
    scale = {"": 1, "k": 1000, "M": 10**6, "Ki": 1024, "Mi": 2**20, "Gi": 2**30, "m": Fraction(1, 1000)}[
        suffix
    ]
    assert parse_quantity(f"{n}{suffix}") == n * scale


def test_durations() -> None:
    assert parse_duration("72h") == 259200
    assert parse_duration("1h30m") == 5400
    assert parse_duration("3d") == 259200
    assert format_duration(5400) == "1h30m"
    assert format_duration(259200) == "72h"
    with pytest.raises(ValueError, match="duration"):
        parse_duration("3 days")
