"""Prefill/decode disaggregation: hand-off timing, shared links, admission, bad pools."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simulator import ConfigError, Simulation, run
from simulator.cost import BatchShape
from simulator.engine.fabric import Fabric, FlowSpec, ResourceSpec
from simulator.hardware import load_link
from tests.conftest import make_scenario

SCHED = {"max_num_seqs": 64, "max_num_batched_tokens": 8192}


def disagg(link: str | None = None, mode: str = "bulk", **overrides):
    pools = [
        {"name": "prefill", "role": "prefill", "device": "H100-SXM", "parallelism": {"tp": 4},
         "scheduler": SCHED},
        {"name": "decode", "role": "decode", "device": "H100-SXM", "parallelism": {"tp": 4},
         "scheduler": SCHED},
    ]
    base = {
        "model": "Llama-3.1-70B",
        "cluster.pools": pools,
        "cluster.kv_transfer": {"mode": mode, "link": link},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 500, "max_tokens": 4000},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 2, "max_tokens": 40},
        "workload.num_requests": 40,
    }
    base.update(overrides)
    return make_scenario(**base)


def test_zero_cost_link_ttft_is_queue_prefill_and_one_decode_step_to_the_microsecond() -> None:
    sc = disagg("ideal", **{"workload.arrival": {"kind": "constant", "rate_per_s": 0.5}})
    sim = Simulation(sc)
    res = sim.run()
    r = res.requests
    assert (r["status"] == "completed").all()
    # Requests are 2 s apart, so each one's prefill runs alone on the prefill instance.
    cost = sim.plan.instances[0].cost
    prefill = np.array([cost.step(BatchShape.prefill(int(p))).seconds for p in r["prompt_tokens"]])
    assert np.abs(r["prefill_ttft_s"] - (r["queue_s"] + prefill)).max() < 1e-6
    # The client's first token: the decode side's first step over the prompt's KV (vLLM
    # decode_recompute), right after the free hand-off.
    dec = sim.plan.instances[1].cost
    first = np.array([dec.step(BatchShape.decode(1, int(p))).seconds for p in r["prompt_tokens"]])
    assert np.abs(r["ttft_s"] - (r["queue_s"] + prefill + first)).max() < 1e-6
    assert (r["queue_s"].abs() < 1e-12).all()
    assert (r["transfer_s"] == 0).all()
    assert (r["prefill_instance_name"] == "prefill/0").all()
    assert (r["decode_instance_name"] == "decode/0").all()


def test_slow_link_leaves_decode_steps_and_adds_exposed_transfer() -> None:
    sparse = {"workload.arrival": {"kind": "constant", "rate_per_s": 0.5}}
    fast = run(disagg("ideal", **sparse))
    slow = run(disagg("ethernet-100g", **sparse))
    # Decode steps: same count and the same durations.
    fd = fast.steps[fast.steps["pool"] == "decode"]["duration_s"].to_numpy()
    sd = slow.steps[slow.steps["pool"] == "decode"]["duration_s"].to_numpy()
    assert len(fd) == len(sd)
    assert np.allclose(fd, sd, rtol=0, atol=1e-12)
    exposed = slow.transfers.set_index("request_id")["exposed_s"]
    grow = (slow.requests.set_index("request_id")["e2e_s"]
            - fast.requests.set_index("request_id")["e2e_s"])
    assert (exposed > 1e-3).all()
    assert np.allclose(grow.loc[exposed.index], exposed, rtol=0, atol=1e-9)
    # Bytes on the wire: the prompt's KV (320 KiB/token for Llama-3.1-70B in bf16).
    t = slow.transfers.merge(slow.requests[["request_id", "prompt_tokens"]], on="request_id")
    assert np.allclose(t["bytes"], t["prompt_tokens"] * 80 * 8 * 128 * 2 * 2)


def test_layerwise_exposes_less_than_bulk() -> None:
    sparse = {"workload.arrival": {"kind": "constant", "rate_per_s": 0.5}}
    bulk = run(disagg("ethernet-100g", "bulk", **sparse)).transfers["exposed_s"]
    layer = run(disagg("ethernet-100g", "layerwise", **sparse)).transfers["exposed_s"]
    assert (layer < bulk).all()
    assert layer.sum() < 0.5 * bulk.sum()


def test_two_transfers_share_a_link() -> None:
    profile = load_link("ib-ndr")
    nic = ResourceSpec("nic", profile.effective_bandwidth)
    fixed = (profile.per_transfer_overhead_us + profile.latency_us) * 1e-6

    def finish_times(n: int) -> list[float]:
        env = simpy.Environment()
        fabric = Fabric(env)
        ends: list[float] = []

        def one() -> simpy.events.ProcessGenerator:
            yield from fabric.send([FlowSpec((nic,), 1e9)], fixed)
            ends.append(env.now)

        for _ in range(n):
            env.process(one())
        env.run()
        return ends

    alone = finish_times(1)[0]
    pair = finish_times(2)
    assert len(pair) == 2
    for t in pair:
        assert t - fixed == pytest.approx(2 * (alone - fixed), rel=1e-9)


def test_slow_handoff_throttles_prefill_through_held_kv(tmp_path) -> None:
    """KV stays on the prefill instance until it has left, so a slow link limits prefill."""
    slow_link = tmp_path / "slow.yaml"
    slow_link.write_text(
        "name: slow\nkind: ethernet\nbandwidth_gb_per_s: 0.5\nefficiency: 1.0\n"
        "latency_us: 10\nsource: ['a deliberately slow link for this test']\n")
    burst = {"workload.arrival": {"kind": "all_at_once"}, "workload.num_requests": 60,
             "cluster.pools.prefill.scheduler": {"max_num_seqs": 4,
                                                 "max_num_batched_tokens": 16384}}
    fast = run(disagg("ideal", **burst))
    slow = run(disagg(str(slow_link), **burst))
    assert slow.requests["ttft_s"].mean() > 1.5 * fast.requests["ttft_s"].mean()
    held = slow.steps[slow.steps["pool"] == "prefill"]
    assert (held["kv_used_blocks"] <= held["kv_total_blocks"]).all()


# 40 prompts of 3,000 tokens at once into a decode pool whose KV holds only a few of them.
SMALL_DECODE_KV = {
    "model": "Llama-3.1-8B",
    "cluster.pools.prefill.parallelism": {"tp": 1},
    "cluster.pools.decode.parallelism": {"tp": 1},
    "cluster.pools.decode.device": "L40S",
    "cluster.pools.decode.scheduler": {"memory_utilization": 0.45, "max_num_seqs": 256},
    "workload.arrival": {"kind": "all_at_once"},
    "workload.input_tokens": {"kind": "fixed", "tokens": 3000},
    "workload.output_tokens": {"kind": "fixed", "tokens": 200},
    "workload.num_requests": 40,
}


def test_decode_admission_waits_for_kv() -> None:
    """A small decode KV forces requests to wait for capacity; none is lost."""
    sc = disagg(None, **SMALL_DECODE_KV)
    res = run(sc)
    r = res.requests
    assert (r["status"] == "completed").all()
    waited = r["transfer_start_s"] - r["transfer_wait_s"]
    assert (waited > 0).any()
    kv = res.steps[res.steps["pool"] == "decode"]
    assert (kv["kv_used_blocks"] <= kv["kv_total_blocks"]).all()


def test_kv_location_and_routing_policies() -> None:
    for policy in ("round_robin", "least_tokens", "power_of_two"):
        sc = disagg(None, **{"cluster.pools.prefill.instances": 2,
                             "cluster.pools.decode.instances": 2,
                             "cluster.router": {"policy": policy, "decode_policy": "round_robin"}})
        r = run(sc).requests
        assert set(r["prefill_instance_name"]) == {"prefill/0", "prefill/1"}
        assert set(r["decode_instance_name"]) == {"decode/0", "decode/1"}


def test_placement_picks_nvlink_inside_a_node_and_network_across() -> None:
    same_node = Simulation(disagg(None))  # 4 + 4 GPUs on one 8-GPU node
    assert same_node.plan.transfer_path(0, 1).profile.kind == "nvlink"
    two_nodes = Simulation(disagg(None, **{"cluster.pools.prefill.parallelism": {"tp": 8}}))
    assert two_nodes.plan.transfer_path(0, 1).profile.name == "ib-ndr"


@pytest.mark.parametrize(("overrides", "expect"), [
    ({"cluster.pools": [{"name": "p", "role": "prefill", "device": "H100-SXM"}]},
     "prefill pools need a decode pool"),
    ({"cluster.kv_transfer": {"link": "warp-drive"}},
     "cluster.kv_transfer.link: unknown link profile 'warp-drive'"),
    ({"cluster.pools.decode.device": "L40S", "cluster.pools.decode.parallelism": {"tp": 1},
      "model": "Llama-3.1-8B",
      "cluster.pools.decode.scheduler": {"memory_utilization": 0.45},
      "workload.input_tokens": {"kind": "fixed", "tokens": 100000}},
     "less than the longest prompt"),
])
def test_bad_pool_definitions(overrides, expect) -> None:
    with pytest.raises(ConfigError) as exc:
        Simulation(disagg(None, **overrides))
    assert expect in str(exc.value)


def _slow_link(tmp_path, gb_per_s: float = 0.5):
    path = tmp_path / "slow.yaml"
    path.write_text(
        f"name: slow\nkind: ethernet\nbandwidth_gb_per_s: {gb_per_s}\nefficiency: 1.0\n"
        "latency_us: 10\nsource: ['a deliberately slow link for this test']\n")
    return str(path)


def test_layerwise_credits_no_overlap_without_a_reserved_destination(tmp_path) -> None:
    """A request that waited for decode KV had nowhere to stream to while it prefilled."""
    sc = disagg(_slow_link(tmp_path, 5.0), "layerwise", **SMALL_DECODE_KV)
    r = run(sc).requests
    assert (r["status"] == "completed").all()
    waited = r[r["transfer_queue_s"] > 0]
    assert len(waited) > 0
    bulk = 10e-6 + 3000 * 131072 / 5e9  # latency + the whole KV over the link, alone
    assert (waited["transfer_s"] >= bulk * (1 - 1e-9)).all()


def test_layerwise_streams_share_the_decode_ports(tmp_path) -> None:
    """Two prefills streaming into one decode instance cannot beat its ports' bandwidth."""
    sc = disagg(_slow_link(tmp_path), "layerwise", **{
        "cluster.pools.prefill.instances": 2,
        "cluster.router": {"policy": "round_robin"},
        "workload.arrival": {"kind": "all_at_once"},
        "workload.input_tokens": {"kind": "fixed", "tokens": 4000},
        "workload.num_requests": 2,
    })
    res = run(sc)
    r, t = res.requests, res.transfers
    assert set(r["prefill_instance_name"]) == {"prefill/0", "prefill/1"}
    # Each of the 4 decode ranks receives a quarter of both prompts' KV through its port.
    per_rank = 2 * 4000 * 327680 / 4
    # (equality is the bound itself: allow the last bit of floating-point rounding)
    assert t["end_s"].max() - r["prefill_start_s"].min() >= per_rank / 0.5e9 * (1 - 1e-12)
    # ... and the streams did overlap the prefills: far less is exposed than in bulk mode.
    bulk = run(sc.with_(**{"cluster.kv_transfer.mode": "bulk"})).transfers
    assert t["exposed_s"].max() < bulk["exposed_s"].max() - 0.5 * r["prefill_s"].min()


def test_layerwise_stream_to_a_failed_decode_instance_is_withdrawn() -> None:
    """The destination dies while the prompt is still prefilling: its stream and its
    reservation go; the hand-off then waits after the prefill, as a bulk one would."""
    sc = disagg(None, "layerwise", **{
        "model": "Llama-3.1-8B",
        "cluster.pools.prefill.parallelism": {"tp": 1},
        "cluster.pools.decode.parallelism": {"tp": 1},
        "workload.arrival": {"kind": "all_at_once"},
        "workload.input_tokens": {"kind": "fixed", "tokens": 8000},
        "workload.num_requests": 1,
        "faults": [{"kind": "instance_failure", "target": "decode/0", "at_s": 0.01}],
    })
    res = run(sc)
    r = res.requests.iloc[0]
    assert r["prefill_start_s"] == 0.0
    assert r["prefill_end_s"] > 0.01  # the failure came while the prompt was prefilling
    assert r["status"] == "in_flight"  # no decode instance is left to hand off to
    assert np.isnan(r["transfer_start_s"])
    assert np.isnan(r["decode_admit_s"])
    assert r["decode_instance_name"] == ""
    assert len(res.transfers) == 0
