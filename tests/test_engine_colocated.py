"""Colocated engine: an exact hand-computed timeline, queueing theory, determinism, invariants."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.cost import BatchShape
from simulator.runner import Simulation, run
from tests.conftest import make_scenario


def test_two_request_timeline_by_hand() -> None:
    """Requests A and B (prompt 100, 3 output tokens) arrive at 5 ms and 10 ms.

    By hand: A's prefill runs alone and is still running when B arrives; the next step
    mixes A's first decode with B's whole prefill (decode-first chunked batching); then
    both decode (A finishes); then B decodes alone and finishes. Every step time below
    comes straight from the cost model, in the order the scheduler must run them.
    """
    sc = make_scenario(workload={"arrival": {"kind": "constant", "rate_per_s": 200.0},
                     "input_tokens": {"kind": "fixed", "tokens": 100},
                     "output_tokens": {"kind": "fixed", "tokens": 3},
                     "num_requests": 2})
    sim = Simulation(sc)
    cost = sim.plan.instances[0].cost
    t = 0.005
    t += cost.step(BatchShape.prefill(100)).seconds                       # A token 1
    a_first = t
    assert a_first > 0.010  # B arrived while A's prefill ran
    t += cost.step(BatchShape.build([(100, 0, True)], [101])).seconds    # A token 2, B token 1
    b_first = t
    t += cost.step(BatchShape.decode(2, 102 + 101)).seconds              # A token 3, B token 2
    a_done = t
    t += cost.step(BatchShape.decode(1, 102)).seconds                    # B token 3
    b_done = t

    res = sim.run()
    r = res.requests.set_index("request_id")
    assert r.loc[0, "arrival_s"] == pytest.approx(0.005, abs=1e-15)
    assert r.loc[1, "arrival_s"] == pytest.approx(0.010, abs=1e-15)
    assert r.loc[0, "first_token_s"] == pytest.approx(a_first, abs=1e-12)
    assert r.loc[0, "completion_s"] == pytest.approx(a_done, abs=1e-12)
    assert r.loc[1, "first_token_s"] == pytest.approx(b_first, abs=1e-12)
    assert r.loc[1, "completion_s"] == pytest.approx(b_done, abs=1e-12)
    assert list(res.steps["prefill_tokens"]) == [100, 100, 0, 0]
    assert list(res.steps["decode_seqs"]) == [0, 1, 2, 1]
    assert res.summary["completed"] == 2


def test_md1_mean_wait_matches_formula() -> None:
    """One server, one request at a time, fixed service: M/D/1, Wq = rho / (2 mu (1 - rho))."""
    sc = make_scenario(**{
        "workload": {"arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "input_tokens": {"kind": "fixed", "tokens": 4000},
                     "output_tokens": {"kind": "fixed", "tokens": 1},
                     "num_requests": 40000},
        "cluster.pools.main.scheduler": {"max_num_seqs": 1, "max_num_batched_tokens": 8192},
        "seed": 7,
    })
    sim = Simulation(sc)
    service = sim.plan.instances[0].cost.step(BatchShape.prefill(4000)).seconds
    lam = 0.7 / service
    sc = sc.with_(**{"workload.arrival.rate_per_s": lam})
    res = Simulation(sc).run()
    rho = lam * service
    wq = rho / (2 * (1 / service) * (1 - rho))
    measured = res.requests["queue_s"].mean()
    assert measured == pytest.approx(wq, rel=0.05)


def test_same_seed_identical_frames_different_seed_differs(tiny) -> None:
    a = run(tiny)
    b = run(tiny)
    pd.testing.assert_frame_equal(a.requests, b.requests)
    pd.testing.assert_frame_equal(a.steps, b.steps)
    c = run(tiny, seed=99)
    assert not a.requests["arrival_s"].equals(c.requests["arrival_s"])


def _check_invariants(res) -> None:
    req, steps = res.requests, res.steps
    assert len(req) == res.summary["num_requests"]
    assert set(req["status"]) <= {"completed", "rejected", "failed", "in_flight"}
    done = req[req["status"] == "completed"]
    assert (done["generated_tokens"] == done["output_tokens"]).all()
    assert (steps["kv_used_blocks"] <= steps["kv_total_blocks"]).all()
    assert (steps["duration_s"] > 0).all()
    for _, grp in steps.groupby("instance"):
        starts = grp["start_s"].to_numpy()
        ends = grp["end_s"].to_numpy()
        assert (np.diff(starts) >= 0).all()
        assert (starts[1:] >= ends[:-1] - 1e-12).all()  # steps never overlap
    assert (done["first_token_s"] >= done["arrival_s"]).all()
    assert (done["completion_s"] >= done["first_token_s"]).all()
    total_tokens = int(steps["prefill_tokens"].sum())
    prefilled = int((done["prompt_tokens"]).sum())
    assert total_tokens >= prefilled  # recompute after preemption only adds work


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(0.5, 40),
    max_in=st.integers(16, 3000),
    max_out=st.integers(1, 300),
    seqs=st.integers(1, 64),
    budget=st.integers(256, 8192),
    chunked=st.booleans(),
    util=st.floats(0.3, 0.95),
    seed=st.integers(0, 1000),
)
def test_invariants_hold(rate, max_in, max_out, seqs, budget, chunked, util, seed) -> None:
    sc = make_scenario(**{
        "seed": seed,
        "workload.arrival.rate_per_s": rate,
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": max_in},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": max_out},
        "workload.num_requests": 40,
        "cluster.pools.main.scheduler": {"max_num_seqs": seqs, "max_num_batched_tokens": budget,
                                         "chunked_prefill": chunked,
                                         "memory_utilization": util},
    })
    res = run(sc)
    _check_invariants(res)
    assert res.summary["completed"] == 40


def test_preemption_under_kv_pressure_keeps_every_request() -> None:
    """A KV cache of a few thousand tokens forces preemptions; no request is lost."""
    sc = make_scenario(**{
        "workload.arrival": {"kind": "all_at_once"},
        "workload.input_tokens": {"kind": "fixed", "tokens": 500},
        "workload.output_tokens": {"kind": "fixed", "tokens": 400},
        "workload.num_requests": 30,
        "cluster.pools.main.device": "L40S",
        "cluster.pools.main.scheduler": {"memory_utilization": 0.42,
                                         "max_num_batched_tokens": 2048},
    })
    res = run(sc)
    _check_invariants(res)
    assert res.summary["preemptions"] > 0
    assert res.summary["completed"] == 30


@pytest.mark.parametrize("arrival", [
    {"kind": "gamma", "rate_per_s": 4.0, "cv": 3.0},
    {"kind": "constant", "rate_per_s": 4.0},
    {"kind": "on_off", "on_rate_per_s": 10.0, "on_s": 2.0, "off_s": 3.0},
    {"kind": "closed_loop", "concurrency": 4},
    {"kind": "all_at_once"},
])
def test_arrival_processes_run(arrival) -> None:
    res = run(make_scenario(**{"workload.arrival": arrival}))
    _check_invariants(res)
    assert res.summary["completed"] == 60


def test_closed_loop_never_exceeds_concurrency() -> None:
    res = run(make_scenario(**{"workload.arrival": {"kind": "closed_loop", "concurrency": 3}}))
    req = res.requests
    events = [(t, 1) for t in req["arrival_s"]] + [(t, -1) for t in req["completion_s"]]
    events.sort(key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak <= 3


def test_gamma_cv_is_respected() -> None:
    res = run(make_scenario(**{"workload.arrival": {"kind": "gamma", "rate_per_s": 50.0,
                                                    "cv": 2.0},
                               "workload.num_requests": 4000}))
    gaps = np.diff(np.sort(res.requests["arrival_s"].to_numpy()))
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)
    assert 1 / gaps.mean() == pytest.approx(50.0, rel=0.1)


def test_trace_replay_and_time_scale() -> None:
    from tests.conftest import REPO

    trace = str(REPO / "scenarios/traces/azure_llm_2023_conv.csv")
    base = make_scenario(workload={"arrival": {"kind": "trace", "path": trace},
                                         "num_requests": 200})
    fast = base.with_(**{"workload.arrival.time_scale": 0.5})
    a, b = run(base), run(fast)
    assert a.requests["arrival_s"].iloc[-1] == pytest.approx(2 * b.requests["arrival_s"].iloc[-1])
    assert list(a.requests["prompt_tokens"][:4]) == [374, 396, 879, 91]
    assert a.summary["completed"] == 200


def test_metrics_definitions(tiny) -> None:
    res = run(tiny)
    r = res.requests[res.requests["status"] == "completed"]
    multi = r[r["generated_tokens"] > 1]
    tpot = (multi["completion_s"] - multi["first_token_s"]) / (multi["generated_tokens"] - 1)
    assert np.allclose(tpot, multi["tpot_s"])
    assert res.summary["ttft_p90_s"] == pytest.approx(np.percentile(r["first_token_s"] - r["arrival_s"], 90))
    dur = r["completion_s"].max() - res.requests["arrival_s"].min()
    assert res.summary["request_throughput"] == pytest.approx(len(r) / dur)
    # ITL: each decode step gives its sequences the time since the previous decode step
    # of the instance ended (chunked prefill here, so steps run back to back).
    st_ = res.steps.sort_values("start_s")
    gaps, prev = [], None
    for start, end, seqs in zip(st_["start_s"], st_["end_s"], st_["decode_seqs"], strict=True):
        if seqs:
            gaps.append((end - prev if prev is not None and prev <= start else end - start, seqs))
            prev = end
    itl = np.repeat([g for g, _ in gaps], [n for _, n in gaps])
    assert res.summary["itl_p99_s"] == pytest.approx(np.percentile(itl, 99))
    assert res.summary["itl_mean_s"] == pytest.approx(itl.mean())
    assert not math.isnan(res.summary["goodput"])
