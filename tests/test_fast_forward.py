"""Decode fast-forward must give the per-request results of step-by-step simulation."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import run
from tests.conftest import make_scenario

TIME_COLUMNS = ["arrival_s", "prefill_start_s", "first_token_s", "transfer_start_s",
                "transfer_end_s", "decode_start_s", "completion_s"]


def assert_same_requests(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a["request_id"]) == list(b["request_id"])
    for col in TIME_COLUMNS:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        assert np.array_equal(np.isnan(x), np.isnan(y)), col
        assert np.nanmax(np.abs(x - y), initial=0.0) <= 1e-9, col
    for col in ("generated_tokens", "preemptions", "status", "prefill_instance",
                "decode_instance"):
        assert list(a[col]) == list(b[col]), col


def both(sc):
    fast = run(sc.with_(**{"simulation.fast_forward": True}))
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    return fast, slow


def test_fast_forward_matches_and_saves_events() -> None:
    sc = make_scenario(**{"workload.output_tokens": {"kind": "uniform", "min_tokens": 50,
                                                     "max_tokens": 400},
                          "workload.arrival.rate_per_s": 2.0})
    fast, slow = both(sc)
    assert_same_requests(fast.requests, slow.requests)
    assert len(fast.steps) == len(slow.steps)
    assert np.allclose(fast.steps["start_s"], slow.steps["start_s"], atol=1e-9, rtol=0)
    assert fast.summary["itl_p99_s"] == slow.summary["itl_p99_s"] or abs(
        fast.summary["itl_p99_s"] - slow.summary["itl_p99_s"]) < 1e-12


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(0.2, 30),
    max_in=st.integers(8, 2000),
    max_out=st.integers(1, 500),
    seqs=st.integers(1, 48),
    chunked=st.booleans(),
    util=st.floats(0.42, 0.9),
    disagg=st.booleans(),
    arrival=st.sampled_from(["poisson", "closed_loop", "all_at_once"]),
    dispatch=st.sampled_from(["push", "central_queue"]),
    seed=st.integers(0, 10_000),
)
def test_fast_forward_identical_property(rate, max_in, max_out, seqs, chunked, util, disagg,
                                         arrival, dispatch, seed) -> None:
    sched = {"max_num_seqs": seqs, "max_num_batched_tokens": 4096, "chunked_prefill": chunked,
             "memory_utilization": util}
    pools = ([{"name": "p", "role": "prefill", "device": "L40S", "scheduler": sched},
              {"name": "d", "role": "decode", "device": "L40S", "scheduler": sched}]
             if disagg else [{"name": "main", "device": "L40S", "scheduler": sched}])
    arr = {"poisson": {"kind": "poisson", "rate_per_s": rate},
           "closed_loop": {"kind": "closed_loop", "concurrency": max(1, int(rate))},
           "all_at_once": {"kind": "all_at_once"}}[arrival]
    sc = make_scenario(**{
        "seed": seed,
        "model": "Llama-3.1-8B",
        "workload.arrival": arr,
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": max_in},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": max_out},
        "workload.num_requests": 30,
        "cluster.pools": pools,
        "cluster.router.dispatch": dispatch,
    })
    fast, slow = both(sc)
    assert_same_requests(fast.requests, slow.requests)
