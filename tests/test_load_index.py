"""The maintained least-key index picks what ``min`` over every member would pick."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.engine import cluster as cluster_module
from simulator.engine.load_index import LoadIndex
from simulator.engine.router import MIN_KEYS
from tests.conftest import make_scenario


@dataclass(eq=False)
class Member:
    index: int
    load: int = 0
    outstanding: int = 0
    accepting: bool = True


def key(m: Member) -> tuple[int, int, int]:
    return (m.load, m.outstanding, m.index)


def brute(members: list[Member]) -> Member | None:
    ok = [m for m in members if m.accepting]
    return min(ok, key=key) if ok else None


OPS = st.lists(st.one_of(
    # A change the member reports: any direction.
    st.tuples(st.just("change"), st.integers(0, 9), st.integers(-5, 5), st.integers(-2, 2)),
    # A rise nobody reports (lazily booked KV of a decode jump).
    st.tuples(st.just("rise"), st.integers(0, 9), st.integers(0, 5), st.just(0)),
    # Accepting or not (down, drained, switched off): read at pick time.
    st.tuples(st.just("toggle"), st.integers(0, 9), st.just(0), st.just(0)),
    st.tuples(st.just("pick"), st.just(0), st.just(0), st.just(0)),
), max_size=200)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 10), ops=OPS)
def test_picks_equal_min_over_accepted_members(n: int, ops: list[tuple[str, int, int, int]]) -> None:
    members = [Member(i) for i in range(n)]
    index = LoadIndex(members, key)
    for op, i, d_load, d_out in ops:
        m = members[i % n]
        if op == "change":
            m.load = max(0, m.load + d_load)
            m.outstanding = max(0, m.outstanding + d_out)
            index.mark(m)
        elif op == "rise":
            m.load += d_load
        elif op == "toggle":
            m.accepting = not m.accepting
        else:
            assert index.pick(lambda x: x.accepting) is brute(members)
    assert index.pick(lambda x: x.accepting) is brute(members)


def test_ties_break_by_index_and_unknown_members_are_ignored() -> None:
    members = [Member(i, load=3) for i in range(5)]
    index = LoadIndex(members, key)
    assert index.pick(lambda m: True) is members[0]
    assert index.pick(lambda m: m.index >= 3) is members[3]
    members[0].load = 4  # a rise, unannounced
    assert index.pick(lambda m: True) is members[1]
    index.mark(Member(99))  # not a member: nothing happens
    members[4].load = 0
    index.mark(members[4])
    assert index.pick(lambda m: True) is members[4]
    assert index.pick(lambda m: False) is None


def test_the_heap_stays_small_under_many_changes() -> None:
    members = [Member(i) for i in range(8)]
    index = LoadIndex(members, key)
    for step in range(5_000):
        m = members[step % 8]
        m.load = (step * 7) % 13
        index.mark(m)
        assert index.pick(lambda x: True) is brute(members)
    assert len(index._heap) <= 4 * len(members) + 16


# ----- in the engine: the same frames as scanning every instance ----------------------
ENGINE_POLICIES = ["least_tokens", "least_outstanding", "least_kv"]


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(ENGINE_POLICIES), decode=st.sampled_from(ENGINE_POLICIES),
       disagg=st.booleans(), fault=st.sampled_from(["none", "instance", "straggler"]),
       rate=st.floats(5.0, 80.0), seqs=st.integers(2, 32), seed=st.integers(0, 10_000))
def test_routing_through_the_index_equals_scanning(monkeypatch, entry, decode, disagg, fault,
                                                   rate, seqs, seed) -> None:
    sched = {"max_num_seqs": seqs, "max_num_batched_tokens": 4096, "memory_utilization": 0.45}
    pools: list[dict[str, Any]] = [{"name": "p", "device": "L40S", "instances": 4,
                                    "scheduler": sched}]
    if disagg:
        pools[0]["role"] = "prefill"
        pools.append({"name": "d", "role": "decode", "device": "L40S", "instances": 4,
                      "scheduler": sched})
    faults: list[dict[str, Any]] = []
    if fault == "instance":
        faults.append({"kind": "instance_failure", "target": "d/1" if disagg else "p/1",
                       "at_s": 0.8, "duration_s": 1.0})
    elif fault == "straggler":
        faults.append({"kind": "straggler", "target": "p/0", "at_s": 0.3, "duration_s": 1.0,
                       "slowdown": 4.0})
    sc = make_scenario(**{
        "seed": seed,
        "workload.arrival": {"kind": "poisson", "rate_per_s": rate},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 2000},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 300},
        "workload.num_requests": 60,
        "cluster.pools": pools,
        "cluster.router.policy": entry,
        "cluster.router.decode_policy": decode,
        "faults": faults,
    })
    monkeypatch.setattr(cluster_module, "INDEX_FROM", 10**9)
    scanned = run(sc)
    monkeypatch.setattr(cluster_module, "INDEX_FROM", 1)
    indexed = run(sc)
    pd.testing.assert_frame_equal(scanned.requests, indexed.requests, check_exact=True)
    pd.testing.assert_frame_equal(scanned.steps, indexed.steps, check_exact=True)
    assert scanned.summary.keys() == indexed.summary.keys()
    for key, value in scanned.summary.items():
        other = indexed.summary[key]
        assert value == other or (pd.isna(value) and pd.isna(other)), key


@pytest.mark.parametrize("policy", sorted(cluster_module.INSTANCE_KEYS))
def test_the_instances_own_keys_equal_the_routers_keys(monkeypatch, policy: str) -> None:
    """A load index reads an instance's key in one gated call: the same tuple, to the
    type, as the router's key function over the instance's properties, at every read."""
    reads: list[int] = []

    def checked(own: Any, routers: Any) -> Any:
        def key(inst: Any) -> tuple[Any, ...]:
            mine, theirs = own(inst), routers(inst)
            assert mine == theirs
            assert list(map(type, mine)) == list(map(type, theirs))
            reads.append(1)
            return mine
        return key

    keys = {p: checked(k, MIN_KEYS[p]) for p, k in cluster_module.INSTANCE_KEYS.items()}
    monkeypatch.setattr(cluster_module, "INSTANCE_KEYS", keys)
    monkeypatch.setattr(cluster_module, "INDEX_FROM", 1)
    sched = {"max_num_seqs": 8, "max_num_batched_tokens": 2048, "memory_utilization": 0.4}
    sc = make_scenario(**{
        "workload.arrival": {"kind": "poisson", "rate_per_s": 60.0},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 2000},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 300},
        "workload.num_requests": 150,
        "cluster.pools": [
            {"name": "p", "role": "prefill", "device": "L40S", "instances": 3, "scheduler": sched},
            {"name": "d", "role": "decode", "device": "L40S", "instances": 3, "scheduler": sched}],
        "cluster.router.policy": policy,
        "cluster.router.decode_policy": policy,
        "faults": [{"kind": "instance_failure", "target": "d/1", "at_s": 0.8, "duration_s": 1.0}],
    })
    run(sc)
    assert len(reads) > 300
