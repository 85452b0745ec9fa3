"""Figures written for people: rates to two significant figures (three when that writes them
exactly: a grid's 0.125 or 1.25), users, counts and milliseconds as whole numbers, shares to
three decimals. The sweep JSON keeps the raw values; only the report's text (tables, knee
lines, plot labels and legends) rounds them.

    rate(0.296875) == "0.3"    rate(1.375) == "1.4"    rate(0.125) == "0.125"    rate(12.34) == "12"
    users(24.0) == "24"        ms(1013.79) == "1,014"  share(0.99598) == "0.996"
    rates([1.375, 1.4375]) == {1.375: "1.38", 1.4375: "1.44"}   (told apart: more digits)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

DASH = "–"
RATE_DIGITS = 2  # significant figures of a rate
EXACT_DIGITS = 3  # ... or this many, when they write it exactly
MAX_DIGITS = 6  # the most a set of distinct rates is given to tell them apart


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    x = float(value)
    return x if math.isfinite(x) else None


def significant(x: float, digits: int) -> str:
    """`x` to `digits` significant figures, in plain notation (no exponent), trailing zeros
    dropped; the integer part is never rounded away (125 stays 125)."""
    if x == 0:
        return "0"
    exponent = math.floor(math.log10(abs(x)))
    decimals = max(0, digits - 1 - exponent)
    text = f"{x:,.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def _rate(x: float, digits: int) -> str:
    exact = significant(x, max(digits, EXACT_DIGITS))
    if float(exact.replace(",", "")) == x:
        return exact
    return significant(x, digits)


def rate(value: Any) -> str:
    """A rate (requests/s, goodput) to two significant figures, or three when they write it
    exactly; a dash when missing."""
    x = _finite(value)
    return DASH if x is None else _rate(x, RATE_DIGITS)


def rates(values: Iterable[Any]) -> dict[float, str]:
    """Labels for a set of rates as `rate` writes them, with more digits where two different
    rates would otherwise read the same (1.375 and 1.4375 give 1.38 and 1.44, not 1.4 twice)."""
    xs = sorted({x for v in values if (x := _finite(v)) is not None})
    for digits in range(RATE_DIGITS, MAX_DIGITS + 1):
        labels = {x: _rate(x, digits) for x in xs}
        if len(set(labels.values())) == len(xs):
            return labels
    return {x: f"{x:g}" for x in xs}


def whole(value: Any) -> str:
    """A whole number with thousands separators (users, counts, ms); a dash when missing."""
    x = _finite(value)
    return DASH if x is None else f"{round(x):,}"


users = whole
ms = whole
count = whole


def share(value: Any) -> str:
    """A share (attainment, cache share) to three decimals; a dash when missing."""
    x = _finite(value)
    return DASH if x is None else f"{x:.3f}"


def load(mode: str, value: Any) -> str:
    """A load's value without its unit: users (closed loop) or a rate (open loop)."""
    return users(value) if mode == "closed" else rate(value)


def loads(mode: str, values: Iterable[Any]) -> dict[float, str]:
    """Labels for a set of loads of one mode, told apart (see `rates`)."""
    if mode == "closed":
        return {x: users(x) for v in values if (x := _finite(v)) is not None}
    return rates(values)


def unit(mode: str) -> str:
    return "users" if mode == "closed" else "rps"
