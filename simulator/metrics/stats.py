"""Mean and 95 % confidence interval of metrics across seeds.

Method: for ``n`` runs of one configuration that differ only in their seed, the interval
is ``mean ± t(0.975, n - 1) · s / sqrt(n)`` with ``s`` the sample standard deviation
(``ddof=1``), i.e. the Student-t interval for a mean, which assumes the per-seed values are
independent and roughly normal. ``n = 1`` gives a NaN half-width (no spread to measure).

The t quantiles come from a table of two-sided 95 % critical values (NIST/SEMATECH
e-Handbook of Statistical Methods, section 1.3.6.7.2, "Critical values of the Student's t
distribution", https://www.itl.nist.gov/div898/handbook/eda/section3/eda3672.htm), so the
package needs no SciPy. Between tabulated degrees of freedom the quantile is interpolated
linearly in 1/df (within 0.002 of the exact quantile, checked in the tests); beyond 100 it
tends to the normal 1.960 as 1/df goes to 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

# df -> t(0.975, df); NIST/SEMATECH table 1.3.6.7.2 (column 0.975 / two-sided 95 %).
T_975: dict[int, float] = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
    9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120,
    17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 21: 2.080, 22: 2.074, 23: 2.069, 24: 2.064,
    25: 2.060, 26: 2.056, 27: 2.052, 28: 2.048, 29: 2.045, 30: 2.042, 40: 2.021, 50: 2.009,
    60: 2.000, 80: 1.990, 100: 1.984,
}
Z_975 = 1.960


def t_critical_95(df: int) -> float:
    """Two-sided 95 % Student-t critical value for ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if df in T_975:
        return T_975[df]
    keys = sorted(T_975)
    if df > keys[-1]:
        lo_df, lo_t, hi_inv, hi_t = keys[-1], T_975[keys[-1]], 0.0, Z_975
    else:
        hi_df = next(k for k in keys if k > df)
        lo_df = max(k for k in keys if k < df)
        lo_t, hi_t, hi_inv = T_975[lo_df], T_975[hi_df], 1.0 / hi_df
    frac = (1.0 / lo_df - 1.0 / df) / (1.0 / lo_df - hi_inv)
    return lo_t + (hi_t - lo_t) * frac


def mean_ci95(values: Sequence[float] | np.ndarray) -> tuple[float, float, int]:
    """``(mean, half_width, n)`` over the finite values; half-width NaN when n < 2."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    n = len(arr)
    if n == 0:
        return math.nan, math.nan, 0
    mean = float(arr.mean())
    if n < 2:
        return mean, math.nan, n
    half = t_critical_95(n - 1) * float(arr.std(ddof=1)) / math.sqrt(n)
    return mean, half, n


def aggregate_seeds(frame: pd.DataFrame, by: Sequence[str],
                    metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per group of ``by`` columns: ``<metric>_mean``, ``<metric>_ci95``, ``n_seeds``.

    ``metrics`` defaults to every numeric column not in ``by``. ``_ci95`` is the
    half-width: the interval is ``mean ± ci95``.
    """
    by = list(by)
    if metrics is None:
        metrics = [c for c in frame.columns
                   if c not in by and c != "seed" and pd.api.types.is_numeric_dtype(frame[c])
                   and not pd.api.types.is_bool_dtype(frame[c])]
    rows = []
    groups = frame.groupby(by, sort=False, dropna=False) if by else [((), frame)]
    for key, group in groups:
        key_t = key if isinstance(key, tuple) else (key,)
        row: dict[str, object] = dict(zip(by, key_t, strict=True))
        row["n_seeds"] = len(group)
        for m in metrics:
            mean, half, _ = mean_ci95(group[m].to_numpy(dtype=float))
            row[f"{m}_mean"] = mean
            row[f"{m}_ci95"] = half
        rows.append(row)
    return pd.DataFrame(rows)
