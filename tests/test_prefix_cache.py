"""Prefix caching: LRU cache mechanics, hits skipping prefill, affinity routing, invariants."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import load_scenario, run
from simulator.engine.kv import BlockManager
from simulator.engine.prefix_cache import PrefixCache
from tests.conftest import REPO, make_scenario

OPS = REPO / "scenarios" / "operations"


def test_lru_eviction_spares_pinned_entries() -> None:
    cache = PrefixCache(block_tokens=64, kv_block_size=16)  # 4 KV blocks per entry
    kv = BlockManager(total_blocks=40, block_size=16, cache=cache)
    kv.allocate(8)
    assert cache.insert([1, 2]) == 2  # the 8 blocks now belong to the cache
    kv.allocate(8)
    cache.insert([3, 4])
    cache.pin([1])
    assert kv.available == 40 - 16 + 12  # entries 2, 3, 4 can go
    kv.allocate(30)  # needs 6 more than free (24): evicts 2 then 3 (oldest unpinned)
    assert sorted(cache.entries) == [1, 4]  # 1 is pinned, 4 is the newest
    assert kv.used <= kv.total
    assert cache.match([1, 2, 3]) == 1


def shared_prefix(caching: bool, **extra):
    return make_scenario(**{
        "workload.arrival.rate_per_s": 6.0,
        "workload.num_requests": 300,
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 400},
        "workload.shared_prefix": {"tokens": 2048, "groups": 3},
        "workload.prefix_block_tokens": 256,
        "cluster.pools.main.scheduler": {"prefix_caching": caching},
        **extra,
    })


def test_shared_prefix_hits_skip_prefill() -> None:
    on, off = run(shared_prefix(True)), run(shared_prefix(False))
    s = on.summary
    # 3 prefixes of 2048 tokens: all but the first request of each group hit all 8 blocks
    # (the prompt's own part is 100-400 tokens), so the hit rate is about 2048 / ~2300.
    r = on.requests
    assert (r["cached_tokens"] == 2048).sum() >= 300 - 3 * 2
    assert s["prefix_hit_rate"] == pytest.approx(2048 * 297 / r["prompt_tokens"].sum(), rel=0.02)
    assert s["prefill_seconds_saved"] > 0
    assert on.summary["ttft_mean_s"] < 0.6 * off.summary["ttft_mean_s"]
    assert off.summary["prefix_hit_rate"] == 0.0
    steps = on.steps
    assert (steps["kv_used_blocks"] <= steps["kv_total_blocks"]).all()
    # The first chunk of a hit attends over the cached context: fewer prefill tokens run.
    assert on.steps["prefill_tokens"].sum() < 0.3 * off.steps["prefill_tokens"].sum()


def test_prefix_caching_with_fast_forward_is_exact() -> None:
    sc = shared_prefix(True, **{"cluster.pools.main.scheduler": {
        "prefix_caching": True, "memory_utilization": 0.3}})
    fast = run(sc).requests
    slow = run(sc.with_(**{"simulation.fast_forward": False})).requests
    for col in ("first_token_s", "completion_s"):
        assert np.nanmax(np.abs(fast[col] - slow[col])) < 1e-9
    assert list(fast["cached_tokens"]) == list(slow["cached_tokens"])


def test_affinity_routing_finds_more_hits_on_mooncake() -> None:
    sc = load_scenario(OPS / "prefix_caching_mooncake.yaml").with_(**{"workload.duration_s": 300})
    aff = run(sc, base_dir=OPS).summary
    rr = run(sc.with_(**{"cluster.router.policy": "round_robin"}), base_dir=OPS).summary
    assert aff["prefix_hit_rate"] > rr["prefix_hit_rate"]
    assert aff["ttft_mean_s"] < rr["ttft_mean_s"]


def test_disaggregated_prefill_pool_caches_prefixes() -> None:
    pools = [{"name": "p", "role": "prefill", "device": "H100-SXM",
              "scheduler": {"prefix_caching": True}},
             {"name": "d", "role": "decode", "device": "H100-SXM"}]
    res = run(shared_prefix(True, **{"cluster.pools": pools}))
    assert res.summary["prefix_hit_rate"] > 0.7
    assert res.summary["completed"] == 300
    # Hand-offs still carry the whole prompt's KV.
    t = res.transfers.merge(res.requests[["request_id", "prompt_tokens"]], on="request_id")
    assert np.allclose(t["bytes"], t["prompt_tokens"] * 128 * 1024)
