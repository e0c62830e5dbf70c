"""A request goes only to instances that can ever hold it, or is rejected clearly."""

from __future__ import annotations

import pytest

from simulator import Simulation
from tests.conftest import make_scenario


def _two_sizes(policy: str, dispatch: str = "push"):
    small = {"name": "small", "device": "H100-SXM", "scheduler": {"memory_utilization": 0.25}}
    big = {"name": "big", "device": "H100-SXM", "scheduler": {"memory_utilization": 0.9}}
    sc = make_scenario(**{"cluster.pools": [small, big],
                          "cluster.router": {"policy": policy, "dispatch": dispatch}})
    sim = Simulation(sc)
    room = [p.memory.kv_capacity_tokens for p in sim.plan.pools]
    assert room[0] < room[1]
    # Long prompts whose prompt + output fit only the big pool (the prompt alone fits
    # both), and short ones that fit both.
    long = room[0] - 100
    sc = sc.with_(**{
        "workload.input_tokens": {"kind": "empirical", "values": [long, 300]},
        "workload.output_tokens": {"kind": "fixed", "tokens": 400},
        "workload.num_requests": 30,
    })
    return Simulation(sc), long


@pytest.mark.parametrize(("policy", "dispatch"), [("round_robin", "push"),
                                                  ("least_outstanding", "push"),
                                                  ("round_robin", "central_queue")])
def test_request_that_fits_only_the_larger_pool_is_served_there(policy: str,
                                                                dispatch: str) -> None:
    sim, long = _two_sizes(policy, dispatch)
    res = sim.run()
    r = res.requests
    assert (r["status"] == "completed").all(), r["status"].value_counts().to_dict()
    assert (r.loc[r["prompt_tokens"] == long, "prefill_instance_name"] == "big/0").all()
    assert (r.loc[r["prompt_tokens"] == 300, "prefill_instance_name"] == "small/0").any()


def test_request_no_instance_can_hold_is_rejected_naming_the_side() -> None:
    sc = make_scenario(**{"cluster.pools": [
        {"name": "p", "role": "prefill", "device": "H100-SXM"},
        {"name": "d", "role": "decode", "device": "H100-SXM",
         "scheduler": {"memory_utilization": 0.25}}]})
    room = Simulation(sc).plan.pools[1].memory.kv_capacity_tokens
    sc = sc.with_(**{"workload.input_tokens": {"kind": "empirical", "values": [300]},
                     "workload.output_tokens": {"kind": "empirical",
                                                "values": [16, room]},
                     "workload.num_requests": 20})
    r = Simulation(sc).run().requests
    big = r[r["output_tokens"] == room]
    assert len(big) > 0
    assert (big["status"] == "rejected").all()
    assert big["reason"].str.contains("every decode instance").all()
    assert (r.loc[r["output_tokens"] == 16, "status"] == "completed").all()


def test_routing_policies_are_a_read_only_table() -> None:
    from typing import get_args

    from simulator.engine.config import RoutingPolicy
    from simulator.engine.router import POLICIES

    assert set(POLICIES) == set(get_args(RoutingPolicy))
    with pytest.raises(TypeError):
        POLICIES["mine"] = POLICIES["random"]  # type: ignore[index]
