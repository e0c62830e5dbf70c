"""A request freed before its prefill finished caches only the blocks it computed.

With KV booked per chunk (vLLM V1), a request preempted mid-prefill owns the blocks of
its computed chunks only. Caching its whole prompt would leave prefix-cache entries
that no block backs, and a later eviction would give back blocks never allocated.
"""

from __future__ import annotations

from simulator import run
from simulator.engine.kv_manager import KVManager
from simulator.engine.prefix_cache import PrefixCache
from simulator.engine.request import Request
from tests.conftest import make_scenario


def _request(prompt: int, entry_tokens: int) -> Request:
    req = Request(0, 0.0, prompt, 10)
    req.block_hashes = list(range(1, prompt // entry_tokens + 1))
    return req


def test_preempted_mid_prefill_caches_only_computed_blocks() -> None:
    cache = PrefixCache(block_tokens=64, kv_block_size=16)
    kv = KVManager(kv_blocks=1000, block_size=16, cache=cache)
    req = _request(prompt=640, entry_tokens=64)  # 10 cache entries of 4 blocks
    assert kv.admit(req, req.prefill_target, 128) == 0  # first chunk: 128 tokens, 8 blocks
    req.prefilled = 128
    assert kv.used == 8
    kv.preempt(req)
    # Two full entries were computed and stay cached; nothing else.
    assert len(cache.entries) == 2
    assert kv.used == 2 * cache.blocks_per_entry
    # Every cached entry is backed by blocks: the whole memory can be had again.
    assert kv.available == kv.total
    kv.grow(_request(640, 64), kv.total)
    assert kv.used == kv.total
    assert not cache.entries


def test_vllm_v1_preemption_with_prefix_cache_runs() -> None:
    sched = {"max_num_seqs": 5, "max_num_batched_tokens": 4096, "prefix_caching": True,
             "memory_utilization": 0.4, "policy": "vllm_v1"}
    sc = make_scenario(**{
        "seed": 0, "model": "Llama-3.1-8B",
        "workload.arrival": {"kind": "poisson", "rate_per_s": 1.0},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 800},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 422},
        "workload.shared_prefix": {"tokens": 2935, "groups": 3, "fraction": 0.9},
        "workload.prefix_block_tokens": 256, "workload.num_requests": 40,
        "cluster.pools": [{"name": "main", "device": "L40S", "instances": 1,
                           "scheduler": sched}],
        "cluster.router.policy": "prefix_affinity",
    })
    for ff in (False, True):
        res = run(sc.with_(**{"simulation.fast_forward": ff}))
        assert (res.requests["status"] == "completed").all()
        assert (res.steps["kv_used_blocks"] <= res.steps["kv_total_blocks"]).all()
