"""Decode fast-forward must give the results of step-by-step simulation, in every frame.

Requests, steps (sorted by instance and start) and the monitoring series are compared,
timestamps within 1e-9 s, on every shipped scenario (request counts truncated to keep the
test affordable) and on generated clusters with prefix caching, prefix-affinity routing
under KV pressure, link failures, instance failures and autoscaling.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import Simulation, run
from simulator.engine import fast_forward
from simulator.engine.cluster import Cluster
from simulator.engine.fast_forward import growth_blocks
from simulator.engine.instance import Instance
from simulator.engine.process import ServingProcess
from simulator.engine.recorder import Recorder
from simulator.engine.request import Request
from simulator.engine.router import RouterState
from simulator.engine.scheduler.vllm_v1 import VllmV1
from simulator.metrics.monitoring import instance_timeseries, pool_timeseries
from simulator.scenario.load import load_scenario, scenario_dir
from tests.conftest import make_scenario
from tests.test_invariants import IDS, SHIPPED

TIME_COLUMNS = ["arrival_s", "prefill_start_s", "prefill_end_s", "first_token_s",
                "transfer_wait_s", "transfer_start_s", "transfer_end_s", "decode_admit_s",
                "decode_start_s", "second_token_s", "completion_s"]


def _same_floats(x: np.ndarray, y: np.ndarray, what: str) -> None:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    assert x.shape == y.shape, what
    assert np.array_equal(np.isnan(x), np.isnan(y)), what
    assert np.nanmax(np.abs(x - y), initial=0.0) <= 1e-9, what


def assert_same_requests(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a["request_id"]) == list(b["request_id"])
    for col in TIME_COLUMNS:
        _same_floats(a[col].to_numpy(), b[col].to_numpy(), col)
    for col in ("generated_tokens", "preemptions", "restarts", "status", "prefill_instance",
                "decode_instance", "cached_tokens"):
        assert list(a[col]) == list(b[col]), col


def _sorted_steps(steps: pd.DataFrame) -> pd.DataFrame:
    return steps.sort_values(["instance", "start_s"], kind="stable").reset_index(drop=True)


def assert_same_steps(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = _sorted_steps(a), _sorted_steps(b)
    assert len(a) == len(b)
    for col in a.columns:
        if col in ("start_s", "duration_s", "busy_s", "end_s", "compute_s", "memory_s"):
            _same_floats(a[col].to_numpy(), b[col].to_numpy(), f"steps.{col}")
        else:
            bad = np.flatnonzero(a[col].to_numpy() != b[col].to_numpy())
            assert not len(bad), (f"steps.{col}", a.iloc[bad[:3]].to_dict("records"),
                                  b.iloc[bad[:3]].to_dict("records"))


def assert_same_monitoring(fast: Any, slow: Any, interval_s: float) -> None:
    end = max(float(fast.requests["completion_s"].max(skipna=True) or 0.0), 1.0)
    for frame in (lambda r: instance_timeseries(r.steps, interval_s, end),
                  lambda r: pool_timeseries(r.steps, r.requests, interval_s, end)):
        x, y = frame(fast), frame(slow)
        assert list(x.columns) == list(y.columns)
        assert len(x) == len(y)
        for col in x.columns:
            if pd.api.types.is_numeric_dtype(x[col]):
                _same_floats(x[col].to_numpy(), y[col].to_numpy(), f"monitoring.{col}")
            else:
                assert list(x[col].astype(str)) == list(y[col].astype(str)), col


def both(sc, record_steps: str = "auto", **kw):
    """Fast-forward (steps kept as ``record_steps`` says) and step by step (every step)."""
    fast = run(sc.with_(**{"simulation.fast_forward": True,
                           "simulation.record_steps": record_steps}), **kw)
    slow = run(sc.with_(**{"simulation.fast_forward": False}), **kw)
    return fast, slow


def assert_identical(fast: Any, slow: Any, interval_s: float = 1.0) -> None:
    assert_same_requests(fast.requests, slow.requests)
    assert_same_steps(fast.steps, slow.steps)
    assert_same_monitoring(fast, slow, interval_s)


# ----- the gate is structural --------------------------------------------------------
# Fixed at construction (or wiring the cluster sets up before the clock starts), never
# changed afterwards: reading them needs no gate.
CONSTANTS = {"env", "index", "name", "pool", "role", "cost", "sched", "scheduler", "recorder", "pp",
             "fast_forward", "emits_first_token", "max_running", "kv_capacity_tokens",
             "process", "on_prefill_start", "on_load_change"}


def test_every_public_member_of_an_instance_passes_the_gate() -> None:
    sc = make_scenario(**{"workload.num_requests": 3})
    plan = Simulation(sc).plan
    cluster = Cluster(simpy.Environment(), plan.instances, sc.cluster.router,
                      RouterState(np.random.default_rng(0)), Recorder())
    inst = cluster.instances[0]
    public_state = {k for k in vars(inst) if not k.startswith("_")}
    assert public_state <= CONSTANTS, public_state - CONSTANTS
    # Every class the instance is built from (its serving loop lives in a base class).
    members = {name: member for cls in reversed(Instance.__mro__[:-1])
               for name, member in vars(cls).items()}
    for name, member in members.items():
        if name.startswith("_"):
            continue
        fn = member.fget if isinstance(member, property) else member
        assert getattr(fn, "__gate__", None) in {"observes", "mutates", "absorbs", "joins",
                                                 "unbooked"}, name

    def gated(kind: str) -> set[str]:
        return {name for name, member in members.items()
                if getattr(member.fget if isinstance(member, property) else member,
                           "__gate__", None) == kind}

    # A read that skips the booking must read only what a jump never changes: liveness,
    # power, draining, constants. A write a jump may absorb must change only what a
    # hand-off reserves; one that joins, only add a request that decodes from the next step.
    # The lists are closed: a new member is a decision.
    assert gated("unbooked") == {"alive", "active", "accepting", "draining", "can_ever_hold"}
    assert gated("absorbs") == {"try_reserve", "rebind_reservation"}
    assert gated("joins") == {"admit_transferred"}


# ----- every shipped scenario ----------------------------------------------------------
def _truncated(path: Path, requests: int = 120):
    sc = load_scenario(path)
    sc = sc.with_(**{"workload.num_requests": min(sc.workload.num_requests or requests,
                                                  requests)})
    # Timed faults inside the truncated run, so they happen.
    updates: dict[str, Any] = {}
    for i, fault in enumerate(sc.faults):
        if hasattr(fault, "at_s"):
            updates[f"faults.{i}.at_s"] = min(fault.at_s, 2.0)
    return sc.with_(**updates) if updates else sc


@pytest.mark.parametrize("path", SHIPPED, ids=IDS)
def test_fast_forward_identical_on_shipped_scenario(path: Path) -> None:
    sc = _truncated(path)
    fast, slow = both(sc, base_dir=scenario_dir(path))
    assert fast.summary["completed"] > 0
    assert_identical(fast, slow, sc.simulation.monitor_interval_s or 1.0)


def test_fast_forward_saves_events() -> None:
    sc = make_scenario(**{"workload.output_tokens": {"kind": "uniform", "min_tokens": 50,
                                                     "max_tokens": 400},
                          "workload.arrival.rate_per_s": 2.0})
    fast, slow = both(sc)
    assert_identical(fast, slow)
    assert fast.sim_events < slow.sim_events / 3


# ----- generated clusters ----------------------------------------------------------------
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
    record=st.sampled_from(["all", "stretches"]),
    seed=st.integers(0, 10_000),
)
def test_fast_forward_identical_property(rate, max_in, max_out, seqs, chunked, util, disagg,
                                         arrival, dispatch, record, seed) -> None:
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
    fast, slow = both(sc, record)
    assert_identical(fast, slow)


# A small KV (Llama-3.1-8B on L40S at low memory utilisation) so caches evict and
# sequences are preempted; long shared prefixes so prefix-affinity routing has hits.
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rate=st.floats(1.0, 40.0),
    instances=st.integers(1, 3),
    util=st.floats(0.4, 0.5),
    prefix=st.integers(600, 3000),
    groups=st.integers(1, 6),
    max_out=st.integers(20, 600),
    seqs=st.integers(4, 64),
    policy=st.sampled_from(["prefix_affinity", "least_kv", "least_tokens"]),
    disagg=st.booleans(),
    fault=st.sampled_from(["none", "link_down", "link_slow", "instance", "straggler"]),
    autoscale=st.booleans(),
    layerwise=st.booleans(),
    decode_cache=st.booleans(),
    record=st.sampled_from(["all", "stretches"]),
    seed=st.integers(0, 10_000),
)
def test_fast_forward_identical_under_pressure_faults_and_scaling(
        rate, instances, util, prefix, groups, max_out, seqs, policy, disagg, fault,
        autoscale, layerwise, decode_cache, record, seed) -> None:
    sched = {"max_num_seqs": seqs, "max_num_batched_tokens": 4096, "prefix_caching": True,
             "memory_utilization": util}
    entry: dict[str, Any] = {"name": "main", "device": "L40S", "instances": instances,
                             "scheduler": sched}
    if disagg:
        entry["role"] = "prefill"
    if autoscale:
        entry["instances"] = 1
        entry["autoscale"] = {"min_instances": 1, "max_instances": max(2, instances),
                              "signal": "queue_length", "scale_out_above": 2.0,
                              "scale_in_below": 0.5, "interval_s": 0.5, "cooldown_s": 1.0,
                              "startup_s": 0.5}
    pools = [entry]
    if disagg:
        pools.append({"name": "d", "role": "decode", "device": "L40S", "instances": 2,
                      "scheduler": {**sched, "prefix_caching": decode_cache}})
    faults: list[dict[str, Any]] = []
    if fault == "link_down" and disagg:
        faults.append({"kind": "link_degradation", "target": "main/0", "at_s": 1.0,
                       "bandwidth_factor": 0.0})
    elif fault == "link_slow" and disagg:
        faults.append({"kind": "link_degradation", "target": "main/0", "at_s": 0.5,
                       "duration_s": 2.0, "bandwidth_factor": 0.01})
    elif fault == "instance":
        target = "d/0" if disagg else "main/0"
        faults.append({"kind": "instance_failure", "target": target, "at_s": 1.5,
                       "duration_s": 2.0})
    elif fault == "straggler":
        faults.append({"kind": "straggler", "target": "main/0", "at_s": 0.7,
                       "duration_s": 1.5, "slowdown": 3.0})
    sc = make_scenario(**{
        "seed": seed,
        "model": "Llama-3.1-8B",
        "workload.arrival": {"kind": "poisson", "rate_per_s": rate},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 800},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": max_out},
        "workload.shared_prefix": {"tokens": prefix, "groups": groups, "fraction": 0.9},
        "workload.prefix_block_tokens": 256,
        "workload.num_requests": 40,
        "cluster.pools": pools,
        "cluster.router.policy": policy,
        "faults": faults,
        "cluster.kv_transfer": {"link": "ethernet-100g",
                                "mode": "layerwise" if layerwise else "bulk"},
    })
    fast, slow = both(sc, record)
    assert_identical(fast, slow, 0.5)


# ----- a hand-off's reservation during a decode jump --------------------------------------
def _absorbed(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record each answer of :meth:`Jump.absorb` (True: the jump went on)."""
    seen: list[bool] = []
    absorb = fast_forward.Jump.absorb

    def spy(self: Any, kv: Any, now: float, taken: int) -> bool:
        ok = absorb(self, kv, now, taken)
        seen.append(ok)
        return ok

    monkeypatch.setattr(fast_forward.Jump, "absorb", spy)
    return seen


def _handoff_scenario(mode: str, util: float, prefix: bool, seed: int = 3) -> Any:
    """1P1D with long decodes, so hand-offs reserve KV on a decode instance that jumps;
    a slow link (bulk) or a layer-wise stream keeps the reservation steps ahead of the KV's
    arrival, so the jump's step rows must show the reserved blocks."""
    sched = {"max_num_seqs": 64, "max_num_batched_tokens": 4096, "memory_utilization": util,
             "prefix_caching": prefix}
    return make_scenario(**{
        "seed": seed,
        "model": "Llama-3.1-8B",
        "workload.arrival": {"kind": "poisson", "rate_per_s": 6.0},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 200, "max_tokens": 3000},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 40, "max_tokens": 400},
        "workload.shared_prefix": {"tokens": 1024, "groups": 2, "fraction": 0.8},
        "workload.prefix_block_tokens": 256,
        "workload.num_requests": 60,
        "cluster.pools": [
            {"name": "p", "role": "prefill", "device": "L40S", "scheduler": sched},
            {"name": "d", "role": "decode", "device": "L40S", "scheduler": sched}],
        "cluster.kv_transfer": ({"mode": "layerwise"} if mode == "layerwise"
                                else {"link": "ethernet-100g"}),
    })


@pytest.mark.parametrize("record", ["all", "stretches"])
@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize("mode", ["bulk", "layerwise"])
def test_reservation_absorbed_by_a_decode_jump(monkeypatch, mode, prefix, record) -> None:
    """Enough KV left: the jump goes on through the reservation, and every step from the
    one running at it records the reserved blocks, as step by step."""
    seen = _absorbed(monkeypatch)
    fast, slow = both(_handoff_scenario(mode, 0.9, prefix), record)
    assert fast.summary["completed"] == 60
    assert any(seen)  # the new path ran
    assert_identical(fast, slow, 0.5)


@pytest.mark.parametrize("prefix", [False, True])
def test_reservation_cuts_a_decode_jump_when_kv_runs_short(monkeypatch, prefix) -> None:
    """Too little KV left for the jump's remaining growth: the reservation cuts it (the
    policy would preempt within the jump's steps), as step by step."""
    seen = _absorbed(monkeypatch)
    fast, slow = both(_handoff_scenario("layerwise", 0.45, prefix, seed=5), "all")
    assert False in seen  # cut
    assert True in seen  # absorbed
    assert_identical(fast, slow, 0.5)


def test_an_absorbed_reservation_booked_wrong_fails(monkeypatch) -> None:
    """The comparison catches an absorbed write whose blocks the running step's row
    leaves out."""
    absorb = fast_forward.Jump.absorb

    def wrong(self: Any, kv: Any, now: float, taken: int) -> bool:
        return absorb(self, kv, now, 0)  # the running step's KV row without the reservation

    monkeypatch.setattr(fast_forward.Jump, "absorb", wrong)
    fast, slow = both(_handoff_scenario("layerwise", 0.9, False), "all")
    with pytest.raises(AssertionError, match="kv_used"):
        assert_same_steps(fast.steps, slow.steps)


# ----- a write that frees KV wakes the instance ----------------------------------------
def test_cancelled_reservation_wakes_an_instance_waiting_for_kv() -> None:
    """A decode instance whose queued recompute waits for KV held by a reservation must
    resume when the reservation is cancelled (e.g. its hand-off's link died)."""
    sc = make_scenario(**{"cluster.pools": [
        {"name": "p", "role": "prefill", "device": "H100-SXM"},
        {"name": "d", "role": "decode", "device": "H100-SXM",
         "scheduler": {"memory_utilization": 0.3}}]})
    plan = Simulation(sc).plan
    env = simpy.Environment()
    done: list[Request] = []
    cluster = Cluster(env, plan.instances, sc.cluster.router,
                      RouterState(np.random.default_rng(0)), Recorder(), on_finished=done.append)
    dec = cluster.instances[1]
    room = dec.kv_capacity_tokens
    big = Request(0, 0.0, room - 64, 4)  # its reservation takes almost all the KV
    assert dec.try_reserve(big)
    small = Request(1, 0.0, 512, 4)  # a recompute queued on the decode side
    dec.enqueue(small)
    env.run(until=1.0)
    assert small.status == "queued"  # no room while the reservation holds the KV
    dec.cancel_reservation(big)
    env.run(until=5.0)
    assert small.status == "completed", small.status


# ----- KV growth over a jump, counted in closed form -------------------------------------
@settings(max_examples=300, deadline=None)
@given(ctx=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
       slack=st.lists(st.integers(-1, 3), min_size=40, max_size=40),
       bs=st.sampled_from([1, 2, 16, 32, 64]), steps=st.integers(1, 400))
def test_growth_blocks_equal_the_per_step_count(ctx, slack, bs, steps) -> None:
    c = np.asarray(ctx, dtype=np.int64)
    held = np.maximum(-(-c // bs) + np.asarray(slack[: len(c)], dtype=np.int64), 0)
    j = np.arange(steps, dtype=np.int64)
    per_step = np.maximum(-(-(c[None, :] + j[:, None]) // bs) - held[None, :], 0).sum(axis=1)
    assert np.array_equal(growth_blocks(c, held, bs, steps), per_step)
    with pytest.MonkeyPatch.context() as mp:  # the crossing count, however small the batch
        mp.setattr(fast_forward, "SMALL_GROWTH", 0)
        assert np.array_equal(growth_blocks(c, held, bs, steps), per_step)


# ----- jumps that go on across their completions -----------------------------------------
def _went_on(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record each jump planned without a scheduling pass (one that went on)."""
    seen: list[Any] = []
    jump_on = ServingProcess._jump_on

    def spy(self: Any, ended: Any) -> Any:
        jump = jump_on(self, ended)
        if jump is not None:
            seen.append(jump)
        return jump

    monkeypatch.setattr(ServingProcess, "_jump_on", spy)
    return seen


def _closed_loop(layout: str = "colocated", seed: int = 2, **extra: Any) -> Any:
    """Closed-loop clients (each next request leaves when the last one completes), long and
    varied decodes, so jumps run across several completions."""
    over: dict[str, Any] = {
        "seed": seed,
        "workload.arrival": {"kind": "closed_loop", "concurrency": 12, "turnaround_s": 0.05,
                             "turnaround_cv": 1.0},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 800},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 300},
        "workload.num_requests": 80,
    }
    if layout == "disagg":
        sched = {"max_num_seqs": 64, "max_num_batched_tokens": 4096}
        over["cluster.pools"] = [
            {"name": "p", "role": "prefill", "device": "H100-SXM", "scheduler": sched},
            {"name": "d", "role": "decode", "device": "H100-SXM", "scheduler": sched}]
    over.update(extra)
    return make_scenario(**over)


@pytest.mark.parametrize("record", ["all", "stretches"])
@pytest.mark.parametrize("layout", ["colocated", "disagg"])
def test_jump_goes_on_across_completions(monkeypatch, layout, record) -> None:
    """Closed-loop clients send their next request at each completion inside a jump that
    goes on: the completions, the KV they free and the next requests are those of step by
    step simulation, under every ``record_steps``."""
    seen = _went_on(monkeypatch)
    fast, slow = both(_closed_loop(layout), record)
    assert fast.summary["completed"] == 80
    assert len(seen) > 20
    assert any(j.k < fast_forward.MIN_JUMP for j in seen)  # short stretches between two
    assert_identical(fast, slow, 0.5)
    none = run(_closed_loop(layout).with_(**{"simulation.record_steps": "none"}))
    assert none.summary == fast.summary


def test_several_completions_in_one_step_and_a_cut_at_a_completion(monkeypatch) -> None:
    """All clients at once, equal lengths: several sequences complete in the same step of a
    jump that goes on, and arrivals cut jumps that went on."""
    seen = _went_on(monkeypatch)
    sc = make_scenario(**{
        "workload.arrival": {"kind": "poisson", "rate_per_s": 40.0},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 20, "max_tokens": 24},
        "workload.num_requests": 120,
    })
    fast, slow = both(sc, "all")
    assert any(j.cut_at is not None for j in seen)
    ended = slow.requests.groupby("completion_s").size()
    assert (ended > 1).any()
    assert_identical(fast, slow, 0.5)


def test_cancelled_in_a_jump_that_went_on(monkeypatch) -> None:
    """Client timeouts land in jumps that went on across a completion: the cancelled
    request's tokens and KV are those of step by step."""
    seen = _went_on(monkeypatch)
    cancelled: list[bool] = []
    book = fast_forward.Jump.book_cancelled

    def spy(self: Any, req: Any, now: float) -> None:
        cancelled.append(self.scheduled)
        book(self, req, now)

    monkeypatch.setattr(fast_forward.Jump, "book_cancelled", spy)
    from tests.test_cancellation import scenario, tenants  # (it imports this module)

    sc = scenario(tenants(1.5, rate=8.0), "pd_bulk", seed=3)
    fast, slow = both(sc, "all")
    assert seen
    assert False in cancelled  # a cancellation in a jump planned without a pass
    assert (fast.requests["status"] == "cancelled").any()
    assert_identical(fast, slow, 0.5)


def test_a_jump_that_goes_on_late_or_without_the_freed_kv_fails(monkeypatch) -> None:
    """The comparison catches a jump that goes on a little late (its completions booked at
    the wrong time: the closed-loop clients send their next requests late), and one whose
    steps leave out the KV its completions freed."""
    jump_on = ServingProcess._jump_on

    def late(self: Any, ended: Any) -> Any:
        jump = jump_on(self, ended)
        if jump is not None:
            jump.ends = [e + 1e-6 for e in jump.ends]
        return jump

    monkeypatch.setattr(ServingProcess, "_jump_on", late)
    fast, slow = both(_closed_loop(), "all")
    with pytest.raises(AssertionError, match=r"arrival_s|completion_s"):
        assert_same_requests(fast.requests, slow.requests)

    def unfreed(self: Any, ended: Any) -> Any:
        jump = jump_on(self, ended)
        if jump is not None:
            jump.used = [u + 1 for u in jump.used]
        return jump

    monkeypatch.setattr(ServingProcess, "_jump_on", unfreed)
    fast, slow = both(_closed_loop(), "all")
    with pytest.raises(AssertionError, match="kv_used"):
        assert_same_steps(fast.steps, slow.steps)


# ----- hand-offs that join a decode jump ------------------------------------------------
def _joined(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each jump planned without a scheduling pass: whether the jump before was cut
    (only by requests joining the batch: their hand-offs arrived)."""
    seen: list[bool] = []
    jump_on = ServingProcess._jump_on

    def spy(self: Any, ended: Any) -> Any:
        jump = jump_on(self, ended)
        if jump is not None:
            seen.append(ended.cut_at is not None)
        return jump

    monkeypatch.setattr(ServingProcess, "_jump_on", spy)
    return seen


def _joining(budget: int = 4096, seed: int = 4) -> Any:
    """1P1D under vLLM's policy, prompts short enough that hand-offs arrive while the
    decode instance jumps; ``budget``: the decode pool's token budget."""
    def pool(name: str, role: str, tokens: int) -> dict[str, Any]:
        return {"name": name, "role": role, "device": "H100-SXM",
                "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": tokens}}

    return make_scenario(**{
        "seed": seed,
        "workload.arrival": {"kind": "poisson", "rate_per_s": 12.0},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 1500},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 20, "max_tokens": 400},
        "workload.num_requests": 120,
        "cluster.pools": [pool("p", "prefill", 4096), pool("d", "decode", budget)],
    })


@pytest.mark.parametrize("record", ["all", "stretches"])
def test_a_joined_request_goes_on_with_the_jump(monkeypatch, record) -> None:
    """Hand-offs that arrive during a decode jump cut it at the step then running; the next
    jump goes on over the batch with the joined requests without a scheduling pass (vLLM's
    pass would decode them all), as step by step."""
    seen = _joined(monkeypatch)
    fast, slow = both(_joining(), record)
    assert fast.summary["completed"] == 120
    assert seen.count(True) > 20  # jumps cut by arrivals went on
    assert_identical(fast, slow, 0.5)


def test_joined_requests_beyond_the_budget_take_a_pass(monkeypatch) -> None:
    """A batch larger than vLLM's token budget decodes only its head: a jump cut by
    arrivals that grow it past the budget goes on after a pass, and going on without one
    is caught by the comparison."""
    answers: list[bool] = []
    joins = VllmV1.joins

    def spy(self: Any, running: int, limits: Any) -> bool:
        ok = joins(self, running, limits)
        answers.append(ok)
        return ok

    monkeypatch.setattr(VllmV1, "joins", spy)
    fast, slow = both(_joining(budget=6), "all")
    assert True in answers  # within the budget
    assert False in answers  # beyond it
    assert_identical(fast, slow, 0.5)

    monkeypatch.setattr(VllmV1, "joins", lambda self, running, limits: True)
    fast, slow = both(_joining(budget=6), "all")
    with pytest.raises(AssertionError):
        assert_identical(fast, slow, 0.5)
