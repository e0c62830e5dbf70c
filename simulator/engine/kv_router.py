"""A KV-aware router: prefix overlap against load, with the knowledge a real router has.

Modelled on Dynamo's KV router (v0.4: ``ai-dynamo/dynamo:docs/architecture/kv_cache_routing.md``
and ``lib/llm/src/kv_router/scheduler.rs``): each candidate's cost is

    cost = kv_overlap_score_weight x (prompt blocks it would have to prefill)
           + (blocks of work it already has: queued prefill and active KV)

and the router takes the cheapest, or samples with ``softmax(-cost / temperature)`` when
``router_temperature`` > 0 (costs normalised by the largest). What the router knows is
configurable as the two routers expose it:

* ``knowledge: exact`` reads each instance's prefix cache (Dynamo with KV events, llm-d's
  precise prefix-cache scorer fed by vLLM's KV events);
* ``knowledge: approximate`` keeps its own guess of what each instance caches: the hash
  blocks of the prompts it routed there, for ``approximate_ttl_s`` (Dynamo's
  ``--no-kv-events`` mode, 120 s by default; llm-d's approximate prefix-cache scorer with
  its LRU of routed prefixes). With ``hash_sample`` = k it only records every k-th block,
  the memory-saving sampling llm-d's scorer offers, and credits a match up to the last
  sampled block that matched;
* ``staleness_s`` > 0: the load part of the view (queued tokens, KV in use) is a
  snapshot refreshed at most that often, as a router that scrapes metrics periodically
  sees it (llm-d's scorers read the last scrape; Dynamo's workers publish load metrics
  on an interval).

Per-run state lives in :class:`KvRouterState`, a :class:`~simulator.engine.router.RouterState`
with the router's settings, its clock and its index.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from simulator.engine.kv_config import KvRouterSpec
from simulator.engine.request import Request
from simulator.engine.router import Routable, RouterState


class KvRoutable(Routable, Protocol):
    kv_capacity_tokens: int


class KvRouterState(RouterState):
    """Routing state of a run that uses the ``kv_aware`` policy."""

    def __init__(self, rng: np.random.Generator, spec: KvRouterSpec, block_tokens: int,
                 clock: Callable[[], float]) -> None:
        super().__init__(rng)
        self.spec = spec
        self.block_tokens = block_tokens
        self.clock = clock
        # Approximate index: per (side, instance) the hashes routed there and when.
        self.index: dict[tuple[str, int], OrderedDict[int, float]] = {}
        # Stale load view: per (side, instance) (time taken, queued tokens, KV tokens).
        self.view: dict[tuple[str, int], tuple[float, int, float]] = {}


def _load(c: KvRoutable, state: KvRouterState, key: str) -> tuple[int, float]:
    now = state.clock()
    seen = state.view.get((key, c.index))
    if seen is None or now - seen[0] >= state.spec.staleness_s:
        seen = (now, c.queued_tokens, c.kv_load * c.kv_capacity_tokens)
        state.view[(key, c.index)] = seen
    return seen[1], seen[2]


def _approximate_overlap(c: KvRoutable, req: Request, state: KvRouterState,
                         key: str) -> int:
    index = state.index.get((key, c.index))
    hashes = req.block_hashes or []
    if not index or not hashes:
        return 0
    now, ttl, k = state.clock(), state.spec.approximate_ttl_s, state.spec.hash_sample
    matched = 0
    for i in range(k - 1, len(hashes), k):
        seen = index.get(hashes[i])
        if seen is None or now - seen > ttl:
            break
        matched = i + 1
    usable = (req.prompt_tokens - 1) // state.block_tokens
    return min(matched, usable) * state.block_tokens


def _remember(c: KvRoutable, req: Request, state: KvRouterState, key: str) -> None:
    index = state.index.setdefault((key, c.index), OrderedDict())
    now, k = state.clock(), state.spec.hash_sample
    for h in (req.block_hashes or [])[k - 1::k]:
        index[h] = now
        index.move_to_end(h)
    ttl = state.spec.approximate_ttl_s
    while index and now - next(iter(index.values())) > ttl:
        index.popitem(last=False)


def route(candidates: Sequence[Routable], req: Request, state: RouterState,
          key: str) -> Routable:
    """Dynamo-style KV routing (see the module docstring)."""
    if not isinstance(state, KvRouterState):
        raise TypeError("the kv_aware policy needs router.kv_router settings")
    spec = state.spec
    approx = spec.knowledge == "approximate"
    costs = []
    for c in candidates:
        kc: KvRoutable = c  # type: ignore[assignment]
        overlap = (_approximate_overlap(kc, req, state, key) if approx
                   else c.prefix_match_tokens(req))
        queued, active = _load(kc, state, key)
        new = req.prompt_tokens - overlap
        costs.append((spec.kv_overlap_score_weight * new + queued + active)
                     / state.block_tokens)
    if spec.temperature > 0 and len(candidates) > 1:
        arr = np.asarray(costs)
        scale = arr.max() or 1.0
        logits = -arr / scale / spec.temperature
        p = np.exp(logits - logits.max())
        pick = int(state.rng.choice(len(candidates), p=p / p.sum()))
    else:
        pick = min(range(len(candidates)), key=lambda i: (costs[i], candidates[i].index))
    chosen = candidates[pick]
    if approx:
        _remember(chosen, req, state, key)  # type: ignore[arg-type]
    return chosen
