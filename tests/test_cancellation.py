"""Client timeouts, cancellation and retries: a cancelled request frees its KV wherever it
is (queued, prefilling, in a hand-off, decoding), counts as cancelled, and fast-forward
gives the step-by-step result."""

from __future__ import annotations

import importlib
import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.engine.cluster import Cluster
from simulator.runner.run import Simulation, run
from simulator.scenario.schema import Scenario
from tests.conftest import make_scenario
from tests.test_fast_forward import assert_identical
from tests.test_invariants import run_checked

run_module = importlib.import_module("simulator.runner.run")  # the module, not run()


class Captured:
    """The clusters built by runs in a test (the engine's state after the clock stops)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clusters: list[Cluster] = []
        outer = self

        class Recording(Cluster):
            def __post_init__(self) -> None:
                super().__post_init__()
                outer.clusters.append(self)

        monkeypatch.setattr(run_module, "Cluster", Recording)


def tenants(timeout_s: float, retries: int = 0, limit: int | None = None,
            rate: float = 20.0) -> list[dict[str, Any]]:
    return [
        {"name": "chat", "arrival": {"kind": "poisson", "rate_per_s": rate / 2},
         "input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 600},
         "output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 300},
         "num_requests": 25, "timeout_s": timeout_s, "retries": retries,
         "retry_backoff_s": 0.05, "max_outstanding": limit},
        {"name": "docs", "arrival": {"kind": "poisson", "rate_per_s": rate / 2},
         "input_tokens": {"kind": "uniform", "min_tokens": 500, "max_tokens": 3000},
         "output_tokens": {"kind": "uniform", "min_tokens": 20, "max_tokens": 400},
         "num_requests": 25, "priority": 1, "timeout_s": timeout_s * 2},
    ]


def scenario(classes: list[dict[str, Any]], layout: str, policy: str = "fcfs",
             seed: int = 1, util: float = 0.45, dispatch: str = "push",
             link_factor: float = 1.0) -> Scenario:
    sched = {"max_num_seqs": 16, "max_num_batched_tokens": 2048,
             "memory_utilization": util, "scheduling_policy": policy}
    if layout == "colocated":
        pools: list[dict[str, Any]] = [{"name": "main", "device": "L40S", "instances": 2,
                                        "scheduler": sched}]
    else:
        pools = [{"name": "p", "role": "prefill", "device": "L40S", "scheduler": sched},
                 {"name": "d", "role": "decode", "device": "L40S", "instances": 2,
                  "scheduler": sched}]
    data = make_scenario().model_dump(mode="json")
    data["seed"] = seed
    data["workload"] = {"classes": classes}
    data["cluster"]["pools"] = pools
    data["cluster"]["router"]["dispatch"] = dispatch
    if layout != "colocated":
        data["cluster"]["kv_transfer"] = {
            "link": "ethernet-100g", "mode": "layerwise" if layout == "pd_layerwise" else "bulk"}
        if link_factor < 1.0:  # a slowed hand-off link: transfers last long enough to cut
            data["faults"] = [{"kind": "link_degradation", "target": "p/0", "at_s": 0.0,
                               "bandwidth_factor": link_factor}]
    return Scenario.model_validate(data)


def assert_nothing_left(cluster: Cluster) -> None:
    """After the last request ended (and the clock stopped, which applies the aborts of
    running requests still waiting for their instance's next step), no KV is held,
    reserved, queued or moving anywhere."""
    for inst in cluster.instances:
        assert inst.kv_load == 0.0, inst.name
        assert inst.idle, inst.name
        assert inst.held == 0
        assert inst.reserved == 0
    assert not cluster.handoff.in_transfer
    assert not cluster.handoff.flows
    assert not cluster.handoff.streaming
    assert not cluster.handoff.pending
    assert len(cluster.pending_entry) == 0


LAYOUTS = ["colocated", "pd_bulk", "pd_layerwise"]


@settings(max_examples=12, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(timeout=st.floats(0.05, 6.0), layout=st.sampled_from(LAYOUTS),
       policy=st.sampled_from(["fcfs", "priority"]), retries=st.integers(0, 2),
       dispatch=st.sampled_from(["push", "central_queue"]), seed=st.integers(0, 1000))
def test_cancelled_requests_leave_no_kv_and_fast_forward_agrees(
        monkeypatch: pytest.MonkeyPatch, timeout: float, layout: str, policy: str,
        retries: int, dispatch: str, seed: int) -> None:
    captured = Captured(monkeypatch)
    sc = scenario(tenants(timeout, retries), layout, policy, seed, dispatch=dispatch)
    sim = Simulation(sc.with_(**{"simulation.fast_forward": True}))
    fast = run_checked(sim)
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    assert_identical(fast, slow)
    for cluster in captured.clusters:
        assert_nothing_left(cluster)
    df = fast.requests
    assert set(df["status"]) <= {"completed", "cancelled"}
    cancelled = df[df["status"] == "cancelled"]
    assert (cancelled["cancel_s"] - cancelled["arrival_s"]).round(9).isin(
        [round(timeout, 9), round(timeout * 2, 9)]).all()
    assert df.loc[df["status"] == "completed", "cancel_s"].isna().all()
    assert fast.summary["cancelled"] == len(cancelled)


def test_timeouts_cancel_in_every_phase(monkeypatch: pytest.MonkeyPatch) -> None:
    """Short timeouts on a loaded P/D cluster catch requests queued, prefilling, in the
    hand-off and decoding; each frees its KV."""
    captured = Captured(monkeypatch)
    phases: set[str] = set()
    for timeout, layout in itertools.product((0.2, 0.5, 1.0, 2.0), ("pd_layerwise", "pd_bulk")):
        res = run(scenario(tenants(timeout, rate=40.0), layout, link_factor=0.05))
        c = res.requests[res.requests["status"] == "cancelled"]
        masks = {
            "queued": c["prefill_start_s"].isna(),
            "prefill": c["prefill_start_s"].notna() & c["prefill_end_s"].isna(),
            "transfer": c["prefill_end_s"].notna() & c["transfer_end_s"].isna(),
            "decode": c["transfer_end_s"].notna(),
        }
        phases |= {phase for phase, mask in masks.items() if mask.any()}
    assert phases == {"queued", "prefill", "transfer", "decode"}
    for cluster in captured.clusters:
        assert_nothing_left(cluster)


def test_retries_are_new_attempts_linked_to_the_first() -> None:
    res = run(scenario(tenants(0.3, retries=2, rate=40.0), "colocated"))
    df = res.requests
    retries = df[df["attempt"] > 0]
    assert len(retries) > 0
    first = df.set_index("request_id")
    for _, r in retries.iterrows():
        parent = first.loc[r["root_id"]]
        assert parent["attempt"] == 0
        assert parent["class"] == r["class"] == "chat"
        assert parent["prompt_tokens"] == r["prompt_tokens"]
        # attempt n starts backoff x 2^(n-1) after attempt n-1 was cancelled
        prev = df[(df["root_id"] == r["root_id"]) & (df["attempt"] == r["attempt"] - 1)]
        assert r["arrival_s"] == pytest.approx(
            float(prev["cancel_s"].iloc[0]) + 0.05 * 2 ** (r["attempt"] - 1))
    assert df.groupby("root_id")["attempt"].max().max() <= 2
    assert res.summary["retried"] == len(retries)
    assert res.summary["class_chat_requests"] == 25  # client requests, not attempts


def test_shed_requests_are_retried_and_counted() -> None:
    res = run(scenario(tenants(30.0, retries=1, limit=2, rate=60.0), "colocated"))
    df = res.requests
    chat = df[df["class"] == "chat"]
    assert (chat["status"] == "shed").sum() == res.summary["class_chat_shed"] > 0
    again = chat[chat["attempt"] == 1]
    assert len(again) > 0
    firsts = df.set_index("request_id").loc[again["root_id"]]
    assert set(firsts["status"]) <= {"shed", "cancelled"}
    assert "shed" in set(firsts["status"])
    assert res.summary["retried"] == int((df["attempt"] > 0).sum())


def test_a_request_cancelled_mid_prefill_caches_only_what_it_computed() -> None:
    """A long shared prompt cancelled half-way through its chunked prefill leaves only its
    computed blocks in the prefix cache: the next request with that prompt finds those,
    not the whole prompt."""
    cls = {"name": "docs", "arrival": {"kind": "constant", "rate_per_s": 1.0},
           "input_tokens": {"kind": "fixed", "tokens": 64},
           "output_tokens": {"kind": "fixed", "tokens": 8}, "num_requests": 2,
           "shared_prefix": {"tokens": 16384, "groups": 1, "fraction": 1.0}}
    data = scenario([cls], "colocated").model_dump(mode="json")
    data["workload"] = {"classes": [cls], "prefix_block_tokens": 256}
    data["cluster"]["pools"] = [{"name": "main", "device": "H100-SXM", "scheduler": {
        "max_num_batched_tokens": 512, "prefix_caching": True}}]
    plain = Scenario.model_validate(data)
    timed = plain.with_(**{"workload.classes.docs.timeout_s": 0.2})
    full = run(plain).requests
    cut = run(timed).requests
    assert full.loc[1, "cached_tokens"] >= 16384 - 256  # the whole prefix, unhurried
    first = cut.loc[0]
    assert first["status"] == "cancelled"
    # Chunks of 512 tokens: what the first request had prefilled before its client gave
    # up is a multiple of the chunk; the second finds at most that.
    second = cut.loc[1]
    assert 0 < second["cached_tokens"] < 16384 - 256
