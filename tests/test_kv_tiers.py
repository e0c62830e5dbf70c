"""KV tiers below HBM: LRU cascade, exclusive accounting, conservation, load timing."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.fabric import Fabric, ResourceSpec
from simulator.engine.kv import BlockManager
from simulator.engine.kv_tiers import TierStack, TierStore
from simulator.engine.prefix_cache import PrefixCache
from simulator.engine.tier_io import TierIO, TierRoute

GB = 1e9


def test_offload_cascades_lru_down_and_drops_off_the_last_tier() -> None:
    dram, ssd = TierStore("dram", 2), TierStore("ssd", 2)
    stack = TierStack([dram, ssd])
    assert stack.offload([1, 2]) == {"dram": 2}
    # 3 pushes 1 (the oldest) to SSD; 4 pushes 2; 5 pushes 3, and SSD's oldest (1) drops.
    assert stack.offload([3, 4, 5]) == {"dram": 3, "ssd": 3}
    assert list(dram.entries) == [4, 5]
    assert list(ssd.entries) == [2, 3]
    assert stack.counters.dropped == 1
    assert stack.lookup([4, 2, 9, 5]) == ["dram", "ssd"]  # stops at the first miss


def test_a_load_moves_a_private_block_up_and_the_shared_pool_keeps_its_copy() -> None:
    pool = TierStore("remote", 8)
    a = TierStack([TierStore("dram", 1)], shared=pool)
    b = TierStack([TierStore("dram", 1)], shared=pool)
    a.offload([1, 2])  # both written through to the pool; 2 pushes 1 out of a's DRAM
    assert a.holders(1) == ["remote"]
    assert a.holders(2) == ["dram", "remote"]
    assert a.counters.writes == {"dram": 2, "ssd": 0, "remote": 2}
    assert a.counters.dropped == 1
    assert b.lookup([1]) == ["remote"]  # b reads what a wrote
    assert a.take([2, 1]) == {"dram": 1, "remote": 1}
    assert a.holders(2) == ["remote"]  # the pool keeps its copy; a's DRAM gave its up
    assert 1 in pool
    assert a.counters.loads == {"dram": 1, "ssd": 0, "remote": 1}


def test_a_recomputed_block_leaves_the_lower_tiers() -> None:
    stack = TierStack([TierStore("dram", 4)])
    cache = PrefixCache(block_tokens=16, kv_block_size=16)
    cache.below = stack  # type: ignore[assignment]
    stack.offload([7])
    cache.insert([7])
    assert stack.holders(7) == []
    assert stack.counters.discarded == 1


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=6), min_size=1,
                max_size=60),
       st.integers(1, 4), st.integers(1, 4), st.integers(4, 24))
def test_no_block_is_in_two_tiers_and_blocks_are_conserved(
        prompts: list[list[int]], dram_cap: int, ssd_cap: int, hbm_blocks: int) -> None:
    """Requests come and go through HBM (prefix cache) over DRAM and SSD tiers.

    Ledger: every block computed in HBM is, at any time, in exactly one of HBM, DRAM and
    SSD, or counted as dropped off the last tier or discarded for a fresher copy.
    """
    cache = PrefixCache(block_tokens=16, kv_block_size=16)
    kv = BlockManager(hbm_blocks, 16, cache)
    stack = TierStack([TierStore("dram", dram_cap), TierStore("ssd", ssd_cap)])
    cache.below = stack  # type: ignore[assignment]
    computed = 0
    for raw in prompts:
        hashes = list(dict.fromkeys(raw))  # a prompt names each block once
        hit = cache.match(hashes)
        found = stack.lookup(hashes[hit:])
        own = len(hashes) - hit
        cache.pin(hashes[:hit])
        if not kv.can_allocate(own):
            cache.unpin(hashes[:hit])
            continue
        loaded = sum(stack.take(hashes[hit:hit + len(found)]).values())
        assert loaded == len(found)
        kv.allocate(own)
        new = cache.insert(hashes[hit:])
        computed += new - loaded
        kv.release(own - new)
        cache.unpin(hashes[:hit])
        live = set(cache.entries)
        for h in live | set(stack.private[0].entries) | set(stack.private[1].entries):
            holders = stack.holders(h) + (["hbm"] if h in live else [])
            assert len(holders) == 1, (h, holders)
        c = stack.counters
        in_tiers = len(cache.entries) + sum(len(t) for t in stack.private)
        assert computed == in_tiers + c.dropped + c.discarded
        assert kv.used <= kv.total
        assert len(cache.entries) * cache.blocks_per_entry <= kv.used


def _io(env: simpy.Environment, bw: float, latency_s: float) -> TierIO:
    pcie = ResourceSpec("pcie-gen5:H100-SXM#0:rx", bw)
    route = TierRoute("dram", 100, 1 * GB, read=(((pcie,), 1 * GB),),
                      write=(((ResourceSpec("pcie-gen5:H100-SXM#0:tx", bw),), 1 * GB),),
                      latency_s=latency_s)
    stack = TierStack([TierStore("dram", 100)])
    return TierIO(env, Fabric(env), stack, {"dram": route})


def test_a_load_alone_takes_bytes_over_bandwidth_and_longer_under_contention() -> None:
    env = simpy.Environment()
    io = _io(env, 48 * GB, 10e-6)
    io.offload([1, 2, 3, 4])
    env.run()  # the stores drain
    t0 = env.now
    _, done = io.load([1, 2])  # 2 GB alone on a 48 GB/s lane
    env.run(done)
    alone = env.now - t0
    assert alone == pytest.approx(10e-6 + 2 / 48, rel=1e-9)
    assert io.bytes_read["dram"] == 2 * GB
    # Two loads of 1 GB each at once share the lane: each takes twice as long as alone.
    t1 = env.now
    _, a = io.load([3])
    _, b = io.load([4])
    env.run(env.all_of([a, b]))
    assert env.now - t1 == pytest.approx(10e-6 + 2 / 48, rel=1e-9)
    assert env.now - t1 > 10e-6 + 1 / 48
    # A store in flight on the same direction's lane is a different resource (tx vs rx).
    assert io.bytes_written["dram"] == 4 * GB
