"""Expert popularity, expert placement and the load of the hottest expert-parallel rank.

Routed tokens do not spread evenly: some experts are picked far more often than others.
Every MoE layer waits for the rank whose experts received the most tokens, so that rank's
load relative to the mean (the *hottest-rank factor*, >= 1) stretches the layer's expert
GEMMs and its dispatch/combine. It follows from

* the popularity of each expert: uniform, Zipf-like (weight of the i-th most popular
  expert proportional to ``i ** -s``, assigned to expert ids in a seeded random order), or
  given per expert (e.g. counts from SGLang's expert-distribution recorder);
* the placement: static (expert ``e`` on rank ``e // (experts / ranks)``, vLLM and SGLang
  without EPLB), or DeepSeek's EPLB (deepseek-ai/EPLB ``eplb.py``, global policy): add
  ``redundant`` replicas one at a time to the expert with the most load per replica, then
  pack replicas heaviest-first onto the least-loaded rank that has a free slot (each rank
  holds ``(experts + redundant) / ranks`` replicas); a replicated expert's tokens split
  evenly over its replicas.
"""

from __future__ import annotations

import numpy as np


def uniform_popularity(experts: int) -> np.ndarray:
    return np.full(experts, 1.0 / experts)


def zipf_popularity(experts: int, exponent: float, seed: int = 0) -> np.ndarray:
    """Share of routed tokens per expert id; ``exponent`` 0 is uniform."""
    if experts < 1 or exponent < 0:
        raise ValueError("zipf popularity needs >= 1 expert and exponent >= 0")
    weights = np.arange(1, experts + 1, dtype=float) ** -exponent
    order = np.random.default_rng(seed).permutation(experts)
    out = np.empty(experts)
    out[order] = weights
    return out / out.sum()


def given_popularity(weights: list[float] | np.ndarray) -> np.ndarray:
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or len(w) == 0 or np.any(w < 0) or w.sum() <= 0:
        raise ValueError("expert popularity must be non-negative weights, not all zero")
    return w / w.sum()


def static_rank_loads(popularity: np.ndarray, ranks: int) -> np.ndarray:
    """Load share per rank with experts placed contiguously by id."""
    experts = len(popularity)
    if experts % ranks:
        raise ValueError(f"{ranks} ranks must divide the {experts} experts")
    return popularity.reshape(ranks, experts // ranks).sum(axis=1)


def eplb_rank_loads(popularity: np.ndarray, ranks: int, redundant: int) -> np.ndarray:
    """Load share per rank after EPLB replication and balanced packing."""
    experts = len(popularity)
    slots_total = experts + redundant
    if redundant < 0 or slots_total % ranks:
        raise ValueError(f"{ranks} ranks must divide experts + redundant "
                         f"({experts} + {redundant} = {slots_total})")
    replicas = np.ones(experts, dtype=int)
    for _ in range(redundant):
        replicas[int(np.argmax(popularity / replicas))] += 1
    per_replica = np.repeat(popularity / replicas, replicas)
    slots = slots_total // ranks
    loads = np.zeros(ranks)
    free = np.full(ranks, slots)
    for load in np.sort(per_replica)[::-1]:
        open_ranks = np.flatnonzero(free > 0)
        target = open_ranks[int(np.argmin(loads[open_ranks]))]
        loads[target] += load
        free[target] -= 1
    return loads


def hottest_rank_factor(loads: np.ndarray) -> float:
    """Load of the busiest rank over the mean (1 = perfectly balanced)."""
    return float(loads.max() * len(loads) / loads.sum())


def imbalance(popularity: np.ndarray, ranks: int, redundant: int = 0,
              eplb: bool = False) -> float:
    """The hottest-rank factor of ``popularity`` placed on ``ranks`` ranks."""
    if ranks <= 1:
        return 1.0
    loads = eplb_rank_loads(popularity, ranks, redundant) if eplb else \
        static_rank_loads(popularity, ranks)
    return hottest_rank_factor(loads)
