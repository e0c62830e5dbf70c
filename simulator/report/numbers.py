"""One way to write numbers for people, shared by the CLI tables and the HTML report."""

from __future__ import annotations

import math
from typing import Any


def fmt(value: Any, digits: int = 4) -> str:
    """``3,450``, ``28,310``, ``4.25``, ``0.01234``: thousands separated, ``digits``
    significant digits below 1,000, never an exponent between 1e-4 and 1e9; NaN and None
    as ``-``."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 1e15):
        return f"{int(value):,}"
    if abs(value) >= 1e9 or 0 < abs(value) < 1e-4:
        return f"{value:.{digits - 1}e}"
    if abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"
