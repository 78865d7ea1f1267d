"""Kubernetes resource quantities and durations, parsed exactly (Fractions, never floats)."""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["format_duration", "parse_duration", "parse_quantity"]

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# The same scales as exact integers (multiply) and divisors (m = 1/1000, ...).
_INTEGER_SCALE = {
    **_BINARY,
    **{k: int(v) for k, v in _DECIMAL.items() if v.denominator == 1},
}
_FRACTION_SCALE = {k: v.denominator for k, v in _DECIMAL.items() if v.numerator == 1 and v.denominator > 1}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<num>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
)


def parse_quantity(value: str | int | float) -> Fraction:
    """The exact value of a Kubernetes quantity (``"500m"`` → 1/2, ``"2Ti"`` → 2·2⁴⁰).

    Raises ValueError with a readable message for anything Kubernetes would reject.
    """
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        return Fraction(str(value))
    if not isinstance(value, str):
        # null, lists or maps in a resources map: a type error the callers already report
        raise TypeError(f"{value!r} is not a quantity")
    text = value.strip()
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"{value!r} is not a Kubernetes quantity (examples: 2, 500m, 16Gi)")
    num = match["num"]
    suffix = match["suffix"] or ""
    if num.isdigit():
        # The common case, an integer mantissa: integer arithmetic, far cheaper than Fraction(str).
        whole = -int(num) if match["sign"] == "-" else int(num)
        if suffix in _INTEGER_SCALE:
            return Fraction(whole * _INTEGER_SCALE[suffix])
        if suffix in _FRACTION_SCALE:
            return Fraction(whole, _FRACTION_SCALE[suffix])
    number = Fraction(num)
    if match["sign"] == "-":
        number = -number
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    exponent = int(suffix[1:])
    if abs(exponent) > 30:
        raise ValueError(f"{value!r}: exponent out of range")
    return number * Fraction(10) ** exponent


_DURATION = re.compile(r"([0-9]+)(d|h|m|s)")
_UNIT_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``72h``, ``1h30m`` or ``3d``."""
    if not re.fullmatch(r"(?:[0-9]+(?:d|h|m|s))+", text):
        raise ValueError(f"{text!r} is not a duration (examples: 72h, 1h30m, 3d)")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in _DURATION.findall(text))


def format_duration(seconds: int) -> str:
    """``259200`` → ``72h``; ``5400`` → ``1h30m`` (for messages)."""
    if seconds <= 0:
        return f"{seconds}s"
    parts = []
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts)
