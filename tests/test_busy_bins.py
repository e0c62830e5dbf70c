"""busy_per_bin: exact overlap of intervals with bins, on runs of any length."""

from __future__ import annotations

import sys

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.metrics.monitoring import busy_per_bin


def brute(start: np.ndarray, end: np.ndarray, edges: np.ndarray,
          weight: np.ndarray) -> np.ndarray:
    lo = np.maximum(start[:, None], edges[None, :-1])
    hi = np.minimum(end[:, None], edges[None, 1:])
    return (np.clip(hi - lo, 0.0, None) * weight[:, None]).sum(axis=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 30), st.floats(0, 2)),
                min_size=0, max_size=40),
       st.floats(0.05, 20))
def test_matches_the_definition(rows: list[tuple[float, float, float]], width: float) -> None:
    start = np.array([r[0] for r in rows])
    end = start + np.array([r[1] for r in rows])
    weight = np.array([r[2] for r in rows])
    edges = np.arange(0.0, 140.0 + width, width)
    got = busy_per_bin(start, end, edges, weight)
    assert np.allclose(got, brute(start, end, edges, weight), rtol=1e-9, atol=1e-9)


def test_long_runs_do_not_recurse() -> None:
    """More than 20,000 intervals over more than 200 bins used to recurse without end."""
    rng = np.random.default_rng(0)
    start = np.sort(rng.uniform(0, 50_000, 60_000))
    end = start + rng.uniform(0, 0.2, len(start))
    edges = np.arange(0.0, 50_010.0, 10.0)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # the fixed function needs no recursion at all
    try:
        got = busy_per_bin(start, end, edges)
    finally:
        sys.setrecursionlimit(old)
    assert np.isclose(got.sum(), np.sum(end - start), rtol=1e-12)
    assert np.allclose(got[:50], brute(start[start < 600], end[start < 600], edges[:51],
                                       np.ones(int((start < 600).sum()))))
    assert len(got) == len(edges) - 1
