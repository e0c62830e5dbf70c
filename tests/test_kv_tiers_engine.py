"""KV tiers, decode-side prefix caches and generated-block caching inside a run."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import run
from tests.conftest import make_scenario
from tests.test_fast_forward import assert_same_requests, assert_same_steps

KV_BYTES_PER_TOKEN = 131072  # Llama-3.1-8B, bf16 KV: 32 layers x 8 heads x 128 x 2 x 2
CHAT = {
    "workload.sessions": {"turns": {"kind": "uniform", "min_tokens": 3, "max_tokens": 8},
                          "think_time_s": 20.0},
    "workload.arrival.rate_per_s": 2.0,
    "workload.num_requests": 240,
    "workload.prefix_block_tokens": 256,
    "workload.input_tokens": {"kind": "uniform", "min_tokens": 200, "max_tokens": 1500},
    "workload.output_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 400},
}


def chat(tiers: list, util: float = 0.3, **extra):
    return make_scenario(**{**CHAT, "cluster.pools.main.scheduler": {
        "prefix_caching": True, "memory_utilization": util, "kv_tiers": tiers}, **extra})


DRAM_SSD = [{"kind": "dram", "capacity_gib": 10}, {"kind": "ssd", "capacity_gib": 500}]


def test_lower_tiers_turn_evicted_history_into_hits_and_count_their_bytes() -> None:
    hbm = run(chat([])).summary
    res = run(chat(DRAM_SSD))
    s, r = res.summary, res.requests
    assert s["completed"] == 240
    assert s["prefix_hit_rate"] > hbm["prefix_hit_rate"] + 0.2
    assert s["hit_rate_dram"] > 0
    assert s["hit_rate_ssd"] > 0
    assert s["ttft_p90_s"] < hbm["ttft_p90_s"]
    # Every loaded token crossed the fabric once: bytes read = tokens x KV bytes/token.
    for tier in ("dram", "ssd"):
        tokens = float(r[f"{tier}_hit_tokens"].sum())
        assert s[f"kv_tier_{tier}_bytes_read"] == tokens * KV_BYTES_PER_TOKEN
    # What SSD holds came through DRAM: it was written at least what it served.
    assert s["kv_tier_ssd_bytes_written"] >= s["kv_tier_ssd_bytes_read"]
    assert (r.loc[r["dram_hit_tokens"] + r["ssd_hit_tokens"] > 0, "kv_load_s"] > 0).all()
    assert s["hit_rate_hbm"] + s["hit_rate_dram"] + s["hit_rate_ssd"] == pytest.approx(
        s["prefix_hit_rate"], abs=1e-12)


def test_generated_blocks_are_cached_for_the_next_turn() -> None:
    r = run(chat([], util=0.9)).requests  # HBM large enough to keep every conversation
    later = r[r["turn"] > 1].sort_values(["session", "turn"])
    prev = r.set_index(["session", "turn"])
    # Turn k+1 hits every full block of turn k's prompt and reply (all but its last token).
    for _, row in later.iterrows():
        before = prev.loc[(row["session"], row["turn"] - 1)]
        history = before["prompt_tokens"] + before["output_tokens"] - 1
        assert row["cached_tokens"] == min(history // 256, (row["prompt_tokens"] - 1) // 256) * 256


def test_fast_forward_is_exact_with_tiers_decode_caches_and_conditional_prefill() -> None:
    pools = [
        {"name": "prefill", "role": "prefill", "device": "H100-SXM",
         "scheduler": {"prefix_caching": True, "memory_utilization": 0.3,
                       "kv_tiers": DRAM_SSD}},
        {"name": "decode", "role": "decode", "device": "H100-SXM", "instances": 2,
         "scheduler": {"prefix_caching": True, "memory_utilization": 0.3,
                       "kv_tiers": [{"kind": "dram", "capacity_gib": 20}]}},
    ]
    sc = make_scenario(**{**CHAT, "cluster.pools": pools,
                          "cluster.router": {"conditional": {"max_local_prefill_length": 600}}})
    fast = run(sc)
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    assert_same_requests(fast.requests, slow.requests)
    assert_same_steps(fast.steps, slow.steps)
    for col in ("dram_hit_tokens", "ssd_hit_tokens", "decode_cached_tokens", "kv_load_s"):
        assert np.array_equal(fast.requests[col].to_numpy(), slow.requests[col].to_numpy())
    assert fast.summary["hit_rate_dram"] > 0


def test_a_decode_side_prefix_hit_pulls_only_the_missing_blocks() -> None:
    def pd(decode_cache: bool):
        pools = [
            {"name": "prefill", "role": "prefill", "device": "H100-SXM",
             "scheduler": {"prefix_caching": True}},
            {"name": "decode", "role": "decode", "device": "H100-SXM",
             "scheduler": {"prefix_caching": decode_cache}},
        ]
        return run(make_scenario(**{**CHAT, "cluster.pools": pools}))

    off, on = pd(False), pd(True)
    assert (off.requests["decode_cached_tokens"] == 0).all()
    t = on.transfers.merge(on.requests[["request_id", "prompt_tokens", "decode_cached_tokens"]],
                           on="request_id")
    assert (t["decode_cached_tokens"] > 0).sum() > 50
    assert np.array_equal(t["bytes"],
                          (t["prompt_tokens"] - t["decode_cached_tokens"]) * KV_BYTES_PER_TOKEN)
    assert on.transfers["bytes"].sum() < 0.6 * off.transfers["bytes"].sum()
    assert on.summary["handoff_tokens_saved"] == int(t["decode_cached_tokens"].sum())
    assert on.summary["completed"] == off.summary["completed"] == 240


def test_fast_forward_is_exact_with_a_shared_pool_between_colocated_instances() -> None:
    # Small HBM: decode jumps grow KV and evict prefix blocks into the pool, which the
    # other instance reads; those evictions must be booked before any pool lookup.
    tiers = [{"kind": "remote", "capacity_gib": 200}]
    sc = chat(tiers, util=0.25, **{"cluster.pools.main.instances": 2,
                                   "cluster.router": {"policy": "round_robin"}})
    fast = run(sc)
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    assert_same_requests(fast.requests, slow.requests)
    assert_same_steps(fast.steps, slow.steps)
    assert list(fast.requests["remote_hit_tokens"]) == list(slow.requests["remote_hit_tokens"])
    assert fast.summary["hit_rate_remote"] > 0


@pytest.mark.parametrize(("tiers", "caching", "expect"), [
    ([{"kind": "ssd", "capacity_gib": 10}, {"kind": "dram", "capacity_gib": 10}], True,
     "in the order dram, ssd, remote"),
    ([{"kind": "dram", "capacity_gib": 10}], False, "kv_tiers needs prefix_caching"),
    ([{"kind": "dram", "capacity_gib": 1e-4}], True, "holds no 256-token block"),
])
def test_bad_tiers_are_refused_with_the_key(tiers, caching, expect) -> None:
    from simulator import Simulation
    from simulator.errors import ConfigError

    def build() -> None:
        sc = make_scenario(**{**CHAT, "cluster.pools.main.scheduler": {
            "prefix_caching": caching, "kv_tiers": tiers}})
        Simulation(sc)

    with pytest.raises(ConfigError, match=expect) as exc:
        build()
    assert "scheduler" in (exc.value.key or "") or "scheduler" in str(exc.value)


def test_pools_disagreeing_on_the_shared_pool_size_are_refused() -> None:
    from simulator import Simulation
    from simulator.errors import ConfigError

    def pool(name: str, role: str, gib: float) -> dict:
        return {"name": name, "role": role, "device": "H100-SXM",
                "scheduler": {"prefix_caching": True,
                              "kv_tiers": [{"kind": "remote", "capacity_gib": gib}]}}

    sc = make_scenario(**{**CHAT, "cluster.pools": [pool("p", "prefill", 100),
                                                    pool("d", "decode", 200)]})
    with pytest.raises(ConfigError, match="one pool"):
        Simulation(sc)


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(util=st.sampled_from([0.24, 0.3, 0.5]), dram_gib=st.sampled_from([1.0, 5.0, 50.0]),
       ssd=st.booleans(), remote=st.booleans(), disagg=st.booleans(),
       local=st.sampled_from([None, 0, 600, 10**6]), fault=st.booleans(),
       seed=st.integers(0, 1000))
def test_fast_forward_is_exact_across_tier_layouts(util, dram_gib, ssd, remote, disagg, local,
                                                   fault, seed) -> None:
    tiers: list[dict] = [{"kind": "dram", "capacity_gib": dram_gib}]
    if ssd:
        tiers.append({"kind": "ssd", "capacity_gib": 100})
    if remote:
        tiers.append({"kind": "remote", "capacity_gib": 20})
    sched = {"prefix_caching": True, "memory_utilization": util, "kv_tiers": tiers}
    if disagg:
        pools = [{"name": "p", "role": "prefill", "device": "H100-SXM", "scheduler": sched},
                 {"name": "d", "role": "decode", "device": "H100-SXM", "instances": 2,
                  "scheduler": sched}]
        router = {"conditional": {"max_local_prefill_length": local}} if local is not None else {}
        target = "d/0"
    else:
        pools = [{"name": "main", "role": "colocated", "device": "H100-SXM", "instances": 2,
                  "scheduler": sched}]
        router = {"policy": "kv_aware"}
        target = "main/0"
    faults = ([{"kind": "instance_failure", "target": target, "at_s": 30.0, "duration_s": 20.0}]
              if fault else [])
    sc = make_scenario(**{**CHAT, "workload.num_requests": 120, "seed": seed,
                          "cluster.pools": pools, "cluster.router": router, "faults": faults})
    fast = run(sc)
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    assert_same_requests(fast.requests, slow.requests)
    assert_same_steps(fast.steps, slow.steps)
    for col in ("dram_hit_tokens", "ssd_hit_tokens", "remote_hit_tokens",
                "decode_cached_tokens"):
        assert list(fast.requests[col]) == list(slow.requests[col]), col
