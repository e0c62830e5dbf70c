"""The KV-aware router: overlap against load, exact vs approximate knowledge, stale views."""

from __future__ import annotations

from simulator import run
from tests.conftest import make_scenario


def shared(router: dict, **extra):
    return make_scenario(**{
        "workload.arrival.rate_per_s": 8.0,
        "workload.num_requests": 160,
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 100, "max_tokens": 400},
        "workload.shared_prefix": {"tokens": 4096, "groups": 32},
        "workload.prefix_block_tokens": 256,
        "cluster.pools.main.instances": 4,
        "cluster.pools.main.scheduler": {"prefix_caching": True},
        "cluster.router": router,
        **extra,
    })


def hit_rate(router: dict) -> float:
    return run(shared(router)).summary["prefix_hit_rate"]


def test_overlap_weight_trades_cache_hits_for_load() -> None:
    affinity = hit_rate({"policy": "kv_aware"})
    load_only = hit_rate({"policy": "kv_aware", "kv_router": {"kv_overlap_score_weight": 0}})
    assert affinity > load_only + 0.1


def test_approximate_knowledge_finds_the_prefixes_it_routed() -> None:
    approx = hit_rate({"policy": "kv_aware", "kv_router": {"knowledge": "approximate"}})
    forgetful = hit_rate({"policy": "kv_aware",
                          "kv_router": {"knowledge": "approximate", "approximate_ttl_s": 1e-3}})
    sampled = hit_rate({"policy": "kv_aware",
                        "kv_router": {"knowledge": "approximate", "hash_sample": 4}})
    assert approx > forgetful + 0.1
    assert sampled > forgetful + 0.1


def test_a_stale_load_view_herds_requests_onto_one_instance() -> None:
    fresh = run(shared({"policy": "kv_aware", "kv_router": {"kv_overlap_score_weight": 0}}))
    stale = run(shared({"policy": "kv_aware", "kv_router": {"kv_overlap_score_weight": 0,
                                                            "staleness_s": 1e6}}))
    # A view frozen at the first look shows every instance idle: the lowest index wins.
    assert set(stale.requests["prefill_instance"]) == {0}
    assert fresh.requests["prefill_instance"].nunique() == 4
    assert stale.summary["ttft_p90_s"] > fresh.summary["ttft_p90_s"]


def test_temperature_samples_reproducibly() -> None:
    router = {"policy": "kv_aware", "kv_router": {"temperature": 1.0}}
    a, b = run(shared(router)).requests, run(shared(router)).requests
    assert a["prefill_instance"].equals(b["prefill_instance"])
    greedy = run(shared({"policy": "kv_aware"})).requests
    assert not a["prefill_instance"].equals(greedy["prefill_instance"])
