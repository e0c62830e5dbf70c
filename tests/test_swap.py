"""Swap-to-host preemption (``scheduler.preemption: swap``, vLLM V0's PreemptionMode.SWAP)."""

from __future__ import annotations

from pathlib import Path

import pytest
import simpy

from simulator import run
from simulator.engine.fabric import Fabric, ResourceSpec
from simulator.engine.kv_tiers import TierStack, TierStore
from simulator.engine.request import Request, State
from simulator.engine.swap import HostSwap
from simulator.engine.tier_io import TierIO, TierRoute
from simulator.errors import EXIT_BAD_INPUT, SimulationError
from tests.conftest import make_scenario
from tests.test_exit_codes import exit_code, scenario
from tests.test_fast_forward import assert_same_requests, assert_same_steps

GB = 1e9


def pressure(mode: str, **extra):
    """Long replies on an H100 whose KV holds a few requests: decodes preempt each other."""
    return make_scenario(**{
        "workload.arrival.rate_per_s": 8.0,
        "workload.num_requests": 200,
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 500, "max_tokens": 3000},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 200, "max_tokens": 1500},
        "cluster.pools.main.scheduler": {
            "prefix_caching": True, "memory_utilization": 0.25, "preemption": mode,
            "kv_tiers": [{"kind": "dram", "capacity_gib": 64}]},
        **extra})


def test_swap_computes_each_prompt_once_and_recompute_does_not() -> None:
    swap, rec = run(pressure("swap")), run(pressure("recompute"))
    for res in (swap, rec):
        assert res.summary["completed"] == 200
        assert res.summary["preemptions"] > 20
    need = int((swap.requests["prompt_tokens"] - swap.requests["cached_tokens"]).sum())
    assert int(swap.steps["prefill_tokens"].sum()) == need  # no token prefilled twice
    need_rec = int((rec.requests["prompt_tokens"] - rec.requests["cached_tokens"]).sum())
    assert int(rec.steps["prefill_tokens"].sum()) > need_rec


@pytest.mark.parametrize("engine", [
    {},  # vllm_v1
    {"engine": "sglang"},
    {"engine": "trtllm", "cluster.pools.main.scheduler.policy": "trtllm",
     "cluster.pools.main.scheduler.capacity_scheduler_policy": "max_utilization"},
    {"cluster.pools.main.scheduler.chunked_prefill": False},
])
def test_fast_forward_is_exact_with_swap(engine) -> None:
    sc = pressure("swap", **{"workload.num_requests": 120, **engine})
    fast = run(sc)
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    assert fast.summary["preemptions"] > 0
    reqs = fast.requests
    assert int(fast.steps["prefill_tokens"].sum()) == int(
        (reqs["prompt_tokens"] - reqs["cached_tokens"]).sum())
    assert_same_requests(fast.requests, slow.requests)
    assert_same_steps(fast.steps, slow.steps)


def _swap(env: simpy.Environment, bw: float, latency_s: float, dram_blocks: int = 10,
          cached: int = 0) -> HostSwap:
    # One hash block = 256 tokens = 1 GB here; a KV block of 16 tokens is 1/16 of it.
    route = TierRoute("dram", dram_blocks, 1 * GB,
                      read=(((ResourceSpec("pcie:rx", bw),), 1 * GB),),
                      write=(((ResourceSpec("pcie:tx", bw),), 1 * GB),), latency_s=latency_s)
    ssd = TierRoute("ssd", 100, 1 * GB, read=(((ResourceSpec("ssd:rx", bw),), 1 * GB),),
                    write=(((ResourceSpec("ssd:tx", bw),), 1 * GB),), latency_s=0.0)
    stack = TierStack([TierStore("dram", dram_blocks), TierStore("ssd", 100)])
    stack.offload(range(cached))
    io = TierIO(env, Fabric(env), stack, {"dram": route, "ssd": ssd})
    return HostSwap(env, io, block_size=16, hash_block_tokens=256)


def _decoding(rid: int) -> Request:
    r = Request(rid, 0.0, 1000, 100)
    r.move_to(State.PREFILL)
    r.move_to(State.DECODE)
    return r


def test_a_swap_in_alone_takes_bytes_over_bandwidth() -> None:
    env = simpy.Environment()
    swap = _swap(env, 48 * GB, 10e-6)
    req = _decoding(1)
    assert swap.swap_out(req, 64, lambda: None)  # 64 KV blocks = 4 hash blocks = 4 GB
    assert req.status is State.SWAPPED
    env.run()
    assert env.now == pytest.approx(4 / 48, rel=1e-9)  # the copy out, alone on tx
    back: list[Request] = []
    t0 = env.now
    swap.swap_in(req, back.append)
    env.run()
    assert back == [req]
    assert env.now - t0 == pytest.approx(10e-6 + 4 / 48, rel=1e-9)
    assert swap.bytes_in == swap.bytes_out == 4 * GB


def test_swapped_kv_and_cached_blocks_never_share_host_memory() -> None:
    env = simpy.Environment()
    swap = _swap(env, 48 * GB, 0.0, dram_blocks=10, cached=10)
    stack = swap.io.stack
    dram = stack.private[0]
    assert len(dram) == 10
    req = _decoding(1)
    assert swap.swap_out(req, 64, lambda: None)  # takes 4 of the tier's 10 blocks
    assert len(dram) + swap.lent[req.id] == 10
    assert [h for h in range(10) if stack.holders(h) == ["ssd"]] == [0, 1, 2, 3]  # oldest
    assert all(len(stack.holders(h)) == 1 for h in range(10))
    big = _decoding(2)
    assert not swap.swap_out(big, 16 * 7, lambda: None)  # 7 more blocks: no room, no change
    assert big.status is State.DECODE
    assert dram.capacity == 6
    env.run()
    swap.swap_in(req, lambda r: None)
    env.run()
    assert dram.capacity == 10
    assert not swap.lent


def test_swap_needs_a_dram_tier(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = scenario(tmp_path, **{"cluster.pools.0.scheduler": {"preemption": "swap"}})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert len(err.strip().splitlines()) == 1
    assert "preemption" in err
    assert "dram" in err
    assert "scenario.yaml" in err


def test_swapped_is_a_checked_state() -> None:
    r = _decoding(3)
    r.move_to(State.SWAPPED)
    with pytest.raises(SimulationError, match="swapped -> prefill"):
        r.move_to(State.PREFILL)  # a swapped request resumes decoding, never re-prefills
    r.move_to(State.DECODE)
    q = Request(4, 0.0, 10, 5)
    q.move_to(State.PREFILL)
    with pytest.raises(SimulationError, match="prefill -> swapped"):
        q.move_to(State.SWAPPED)  # only a decoding request is swapped


def test_blocks_are_conserved_between_hbm_and_host_in_a_run(monkeypatch) -> None:
    swaps: list[HostSwap] = []
    seen: list[tuple[int, int, int]] = []  # (HBM blocks held, host blocks lent, capacity)
    init, out = HostSwap.__init__, HostSwap.swap_out

    def track_init(self, *args, **kwargs) -> None:
        init(self, *args, **kwargs)
        swaps.append(self)

    def track_out(self, req, kv_blocks, on_done) -> bool:
        ok = out(self, req, kv_blocks, on_done)
        dram = self.io.stack.private[0]
        seen.append((req.blocks, sum(self.lent.values()), dram.capacity))
        return ok

    monkeypatch.setattr(HostSwap, "__init__", track_init)
    monkeypatch.setattr(HostSwap, "swap_out", track_out)
    res = run(pressure("swap", **{"workload.num_requests": 120}))
    assert res.summary["completed"] == 120
    (swap,) = swaps
    capacity = swap.route.capacity_blocks
    assert swap.swap_outs == swap.swap_ins == res.summary["preemptions"] > 0
    # A swapped request holds no HBM block; what the host lends it leaves the cache's share.
    for hbm, lent, cap in seen:
        assert hbm == 0
        assert lent + cap == capacity
    assert len(swap.io.stack.private[0]) <= capacity
    assert swap.io.stack.private[0].capacity == capacity  # all given back at the end
    assert not swap.lent
    assert swap.bytes_in == swap.bytes_out


SWAP_DECODE = {"prefix_caching": True, "memory_utilization": 0.25, "preemption": "swap",
               "kv_tiers": [{"kind": "dram", "capacity_gib": 64}]}


@pytest.mark.parametrize("extra", [
    {"faults": [{"kind": "instance_failure", "target": "main/0", "at_s": 4.0,
                 "duration_s": 2.0}]},
    {"cluster.pools": [{"name": "p", "role": "prefill", "device": "H100-SXM"},
                       {"name": "d", "role": "decode", "device": "H100-SXM",
                        "scheduler": SWAP_DECODE}]},
])
def test_swap_survives_a_failure_and_runs_on_decode_instances(extra) -> None:
    sc = pressure("swap", **{"workload.num_requests": 120, **extra})
    fast = run(sc)
    slow = run(sc.with_(**{"simulation.fast_forward": False}))
    assert fast.summary["completed"] == 120
    kinds = fast.events["kind"].value_counts()
    assert kinds["swap_out"] > 0
    if "faults" in extra:  # a request swapped out when the instance failed is recomputed
        assert kinds["swap_in"] < kinds["swap_out"]
    else:
        assert kinds["swap_in"] == kinds["swap_out"]
    assert_same_requests(fast.requests, slow.requests)
    assert_same_steps(fast.steps, slow.steps)



def test_a_cancelled_swapped_request_gives_its_host_copy_back() -> None:
    """A client timeout that finds its request swapped out, or being copied back, frees
    the host copy; a later swap-out finds the whole tier again, and the copy back that
    was in flight delivers nothing."""
    env = simpy.Environment()
    swap = _swap(env, 48 * GB, 0.0, dram_blocks=10)
    dram = swap.io.stack.private[0]
    out, back = _decoding(1), _decoding(2)
    assert swap.swap_out(out, 64, lambda: None)
    assert swap.swap_out(back, 64, lambda: None)
    assert dram.capacity == 2
    env.run()
    delivered: list[Request] = []
    swap.swap_in(swap.next_ready(), delivered.append)  # ``out`` copies back
    assert swap.drop(out)
    assert swap.drop(back)
    assert not swap.drop(_decoding(3))  # not here
    env.run()
    assert delivered == []
    assert dram.capacity == 10
    assert not swap.lent
    assert not swap.queue
    assert not swap.incoming
    assert swap.next_ready() is None


def test_the_summary_counts_swaps_and_their_bytes() -> None:
    swap, rec = run(pressure("swap")), run(pressure("recompute"))
    swaps = int((swap.events["kind"] == "swap_out").sum())
    assert swaps > 20
    assert swap.summary["swap_preemptions"] == swaps
    assert int(swap.requests["swaps"].sum()) == swaps
    recomputed = int((swap.events["kind"] == "preempt").sum())
    assert swap.summary["preemptions"] == swaps + recomputed
    # Each swap copies the request's HBM blocks: 16-token blocks of Llama-3.1-8B's bf16 KV
    # (32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 128 KiB per token).
    per_token = 32 * 8 * 128 * 2 * 2
    assert swap.summary["swap_bytes"] > 0
    assert swap.summary["swap_bytes"] % (16 * per_token) == 0
    moved = swap.requests.loc[swap.requests["swaps"] > 0]
    assert (moved["swap_bytes"] >= moved["swaps"] * (moved["prompt_tokens"] // 16) * 16
            * per_token).all()
    assert rec.summary["swap_preemptions"] == 0
    assert rec.summary["swap_bytes"] == 0.0
