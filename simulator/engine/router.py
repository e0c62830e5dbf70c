"""Routing policies: plain functions that pick one instance for a request."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import numpy as np

from simulator.engine.request import Request


class Routable(Protocol):
    index: int

    @property
    def outstanding(self) -> int: ...

    @property
    def kv_load(self) -> float: ...

    @property
    def queued_tokens(self) -> int: ...

    def prefix_match_tokens(self, req: Request) -> int: ...


class RouterState:
    """Per-run mutable routing state (round-robin cursors, the RNG)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.cursor: dict[str, int] = {}


Policy = Callable[[Sequence[Routable], Request, RouterState, str], Routable]


def round_robin(candidates: Sequence[Routable], _req: Request, state: RouterState,
                key: str) -> Routable:
    i = state.cursor.get(key, 0)
    state.cursor[key] = i + 1
    return candidates[i % len(candidates)]


def outstanding_key(c: Routable) -> tuple[int, int]:
    return (c.outstanding, c.index)


def tokens_key(c: Routable) -> tuple[int, int, int]:
    return (c.queued_tokens, c.outstanding, c.index)


def kv_key(c: Routable) -> tuple[float, int, int]:
    return (c.kv_load, c.outstanding, c.index)


def least_outstanding(candidates: Sequence[Routable], _req: Request, _s: RouterState,
                      _k: str) -> Routable:
    return min(candidates, key=outstanding_key)


def least_tokens(candidates: Sequence[Routable], _req: Request, _s: RouterState,
                 _k: str) -> Routable:
    return min(candidates, key=tokens_key)


def least_kv(candidates: Sequence[Routable], _req: Request, _s: RouterState,
             _k: str) -> Routable:
    return min(candidates, key=kv_key)


def power_of_two(candidates: Sequence[Routable], _req: Request, state: RouterState,
                 _k: str) -> Routable:
    if len(candidates) == 1:
        return candidates[0]
    a, b = state.rng.choice(len(candidates), size=2, replace=False)
    ca, cb = candidates[int(a)], candidates[int(b)]
    return ca if (ca.outstanding, ca.index) <= (cb.outstanding, cb.index) else cb


def prefix_affinity(candidates: Sequence[Routable], req: Request, _s: RouterState,
                    _k: str) -> Routable:
    """Least prefill work after cache hits: queued tokens + the prompt's uncached tokens.

    An instance that already holds the prompt's prefix wins unless its queue outweighs
    the tokens the hit would save, so cache affinity is balanced against load.
    """
    def work(c: Routable) -> tuple[int, int, int]:
        hit = c.prefix_match_tokens(req)
        return (c.queued_tokens + req.prompt_tokens - hit, c.outstanding, c.index)

    return min(candidates, key=work)


def random_choice(candidates: Sequence[Routable], _req: Request, state: RouterState,
                  _k: str) -> Routable:
    return candidates[int(state.rng.integers(len(candidates)))]


def kv_aware(candidates: Sequence[Routable], req: Request, state: RouterState,
             key: str) -> Routable:
    """KV overlap against load, Dynamo's KV router: see :mod:`simulator.engine.kv_router`
    (imported here, not at the top, because it builds on this module's types)."""
    from simulator.engine.kv_router import route

    return route(candidates, req, state, key)


POLICIES: Mapping[str, Policy] = MappingProxyType({
    "round_robin": round_robin,
    "least_outstanding": least_outstanding,
    "least_tokens": least_tokens,
    "least_kv": least_kv,
    "power_of_two": power_of_two,
    "random": random_choice,
    "prefix_affinity": prefix_affinity,
    "kv_aware": kv_aware,
})
"""The routing policies by name, read-only: per-run state lives in :class:`RouterState`."""

MIN_KEYS: Mapping[str, Callable[[Routable], tuple[float, ...]]] = MappingProxyType({
    "least_outstanding": outstanding_key,
    "least_tokens": tokens_key,
    "least_kv": kv_key,
})
"""The policies that pick the least key and keep no state, with their keys (each ends with
the instance index, so there are no ties): a cluster may keep them in a
:class:`~simulator.engine.load_index.LoadIndex` instead of scanning every instance."""
