"""Resolve a pool's ``scheduler.kv_tiers`` into the routes its instances use."""

from __future__ import annotations

from simulator.cost.handoff import handoff_streams
from simulator.cost.parallel import Parallelism
from simulator.engine.tier_io import TierRoute
from simulator.errors import ConfigError
from simulator.models.arch import ModelConfig
from simulator.runner.paths import tier_routes
from simulator.runner.placement import Placement
from simulator.scenario.schema import PoolSpec, Scenario


def rank_kv_bytes_per_token(model: ModelConfig, kv_precision: str,
                            par: Parallelism) -> list[float]:
    """KV bytes per token each rank of an instance keeps (replicated heads counted)."""
    per_rank: dict[int, float] = {}
    for _, j, bpt in handoff_streams(model, kv_precision, par, par):
        per_rank[j] = per_rank.get(j, 0.0) + bpt
    return [per_rank.get(j, 0.0) for j in range(par.tp * par.pp)]


def pool_tier_routes(scenario: Scenario, model: ModelConfig, pool: PoolSpec, par: Parallelism,
                     kv_precision: str, places: list[Placement], file: str | None,
                     key: str) -> list[tuple[TierRoute, ...]]:
    """Each instance's KV tiers, fastest first (empty without ``scheduler.kv_tiers``)."""
    tiers = list(pool.scheduler.kv_tiers)
    if not tiers:
        return [()] * len(places)
    where = f"{key}.scheduler.kv_tiers"
    sizes = {t.capacity_gib for p in scenario.cluster.pools for t in p.scheduler.kv_tiers
             if t.kind == "remote"}
    if any(t.kind == "remote" for t in tiers) and len(sizes) > 1:
        raise ConfigError(f"pools give the shared remote KV pool different sizes "
                          f"({', '.join(f'{x:g}' for x in sorted(sizes))} GiB); a cluster "
                          "has one pool", file=file, key=where)
    ranks = rank_kv_bytes_per_token(model, kv_precision, par)
    out = []
    for j, place_ in enumerate(places):
        try:
            routes = tier_routes(place_, f"{pool.name}/{j}", tiers, ranks,
                                 scenario.workload.prefix_block_tokens)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, key=where) from None
        out.append(tuple(routes.values()))
    return out
