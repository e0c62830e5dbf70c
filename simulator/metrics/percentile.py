"""Percentiles of a weighted multiset, equal to numpy's on the repeated values.

``weighted_percentiles(values, weights, qs)`` is ``np.percentile(np.repeat(values,
weights), q)`` bit for bit (numpy's default ``linear`` method), without building the
repeated array. numpy (``numpy/lib/_function_base_impl.py``, numpy 2.x) takes the virtual
index ``(n - 1) * (q / 100)``, the order statistics just below and above it, and
interpolates with ``_lerp``: ``a + (b - a) * t`` for ``t < 0.5``, ``b - (b - a) * (1 - t)``
from ``0.5`` on. Only the order statistics are found differently: by sorting the values
(small inputs), or, for inputs of tens of millions of values, by a radix selection over
the floats' bit patterns in chunks, which needs no per-value temporary beyond a chunk.
"""

from __future__ import annotations

import math

import numpy as np

SORT_BELOW = 1 << 16
"""Inputs with fewer values are sorted; longer ones use the chunked radix selection."""
CHUNK = 1 << 20
_SIGN = np.uint64(1 << 63)
_DIGIT = 16
_MASK = np.uint64((1 << _DIGIT) - 1)


def weighted_percentiles(values: np.ndarray, weights: np.ndarray,
                         qs: tuple[int, ...] = (50, 90, 99)) -> dict[int, float]:
    """Percentiles of ``values`` where each value occurs ``weights`` times (integers >= 0)."""
    values = np.asarray(values, dtype=float)
    weights = np.asarray(weights)
    pick = order_statistics_by_sort if len(values) < SORT_BELOW else order_statistics_by_radix
    n = int(weights[weights > 0].sum()) if len(weights) else 0
    if n == 0:
        return dict.fromkeys(qs, math.nan)
    plan = {q: _virtual_index(n, q) for q in qs}
    ranks = sorted({r for lo, hi, _ in plan.values() for r in (lo, hi)})
    at = pick(values, weights, ranks)
    return {q: _lerp(at[lo], at[hi], t) for q, (lo, hi, t) in plan.items()}


def _virtual_index(n: int, q: float) -> tuple[int, int, float]:
    """numpy's ``linear`` method: the two order statistics and the weight between them."""
    pos = (n - 1) * (q / 100)
    lo = math.floor(pos)
    if pos >= n - 1:
        return n - 1, n - 1, pos - (n - 1)
    return lo, lo + 1, pos - lo


def _lerp(a: float, b: float, t: float) -> float:
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def order_statistics_by_sort(values: np.ndarray, weights: np.ndarray,
                             ranks: list[int]) -> dict[int, float]:
    """The value at each 0-based rank of the weighted multiset, by a stable sort."""
    mask = weights > 0
    v, w = values[mask], weights[mask].astype(np.int64)
    order = np.argsort(v, kind="stable")
    v = v[order]
    cum = np.cumsum(w[order])
    return {r: float(v[np.searchsorted(cum, r, side="right")]) for r in ranks}


def _keys(values: np.ndarray) -> np.ndarray:
    """Unsigned keys that order as the floats do (negative floats' bits flipped)."""
    bits = values.view(np.uint64)
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _float_of(key: int) -> float:
    k = np.uint64(key)
    bits = k & ~_SIGN if k & _SIGN else ~k
    return float(np.asarray(bits, dtype=np.uint64).view(np.float64))


def order_statistics_by_radix(values: np.ndarray, weights: np.ndarray,
                              ranks: list[int]) -> dict[int, float]:
    """The value at each 0-based rank, found 16 bits of its key at a time.

    Each pass histograms (weighted) the next 16 bits of the keys that share the prefix
    found so far, chunk by chunk; four passes fix all 64 bits, so the key, and the
    float, is exact.
    """
    state = {r: (0, r) for r in ranks}  # rank -> (prefix so far, rank within it)
    for done in range(0, 64, _DIGIT):
        shift = np.uint64(64 - done - _DIGIT)
        prefixes = sorted({p for p, _ in state.values()})
        hists = {p: np.zeros(1 << _DIGIT) for p in prefixes}
        for a in range(0, len(values), CHUNK):
            w = weights[a:a + CHUNK]
            live = w > 0
            k = _keys(values[a:a + CHUNK][live])
            w = w[live]
            top = k >> np.uint64(64 - done) if done else None
            for p in prefixes:
                sel = (top == np.uint64(p)) if top is not None else slice(None)
                digit = ((k[sel] >> shift) & _MASK).astype(np.intp)
                hists[p] += np.bincount(digit, weights=w[sel], minlength=1 << _DIGIT)
        for r, (p, within) in state.items():
            cum = np.cumsum(hists[p].astype(np.int64))
            d = int(np.searchsorted(cum, within, side="right"))
            state[r] = ((p << _DIGIT) | d, within - (int(cum[d - 1]) if d else 0))
    return {r: _float_of(p) for r, (p, _) in state.items()}
