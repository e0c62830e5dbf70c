"""The network fabric: max-min fair sharing, re-planning, faults, and the hand-off routes."""

from __future__ import annotations

import re
import signal

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Simulation, run
from simulator.engine.fabric import INF, Fabric, Flow, FlowSpec, Resource, ResourceSpec, _fill, _unshared
from simulator.hardware import load_link
from tests.conftest import make_scenario

GB = 1e9


def finish_times(flows: list[tuple[float, FlowSpec]], until: float | None = None
                 ) -> tuple[list[float], list[bool]]:
    """Start each ``(at_s, flow)``; return when each finished and whether it got through."""
    env = simpy.Environment()
    fabric = Fabric(env)
    ends = [float("nan")] * len(flows)
    ok = [False] * len(flows)

    def one(i: int, at: float, spec: FlowSpec) -> simpy.events.ProcessGenerator:
        yield env.timeout(at)
        ok[i] = yield from fabric.send([spec])
        ends[i] = env.now

    for i, (at, spec) in enumerate(flows):
        env.process(one(i, at, spec))
    env.run(until=until)
    return ends, ok


def test_two_transfers_into_one_decode_nic_each_get_half() -> None:
    rx = ResourceSpec("decode-nic:rx", 50 * GB)
    a = FlowSpec((ResourceSpec("p0-nic:tx", 50 * GB), rx), 10 * GB)
    b = FlowSpec((ResourceSpec("p1-nic:tx", 50 * GB), rx), 10 * GB)
    (alone,), _ = finish_times([(0.0, a)])
    pair, _ = finish_times([(0.0, a), (0.0, b)])
    assert alone == pytest.approx(0.2, rel=1e-12)
    assert pair == pytest.approx([0.4, 0.4], rel=1e-12)


def test_max_min_fair_with_caps_and_two_bottlenecks() -> None:
    # r1 (10 GB/s) carries f1 and f2; r2 (4 GB/s) carries f2 and f3; f1 is capped at 3.
    # Progressive filling: r2 fills first at 2 each (f2, f3); f1 stops at its cap of 3.
    r1, r2 = ResourceSpec("r1", 10 * GB), ResourceSpec("r2", 4 * GB)
    flows = [(0.0, FlowSpec((r1,), 30 * GB, cap=3 * GB)),
             (0.0, FlowSpec((r1, r2), 20 * GB)),
             (0.0, FlowSpec((r2,), 20 * GB))]
    ends, _ = finish_times(flows)
    assert ends == pytest.approx([10.0, 10.0, 10.0], rel=1e-12)


def test_rates_replan_when_a_flow_leaves() -> None:
    # Two flows share 10 GB/s: the 5 GB one leaves at 1 s, the 15 GB one then runs alone.
    r = ResourceSpec("r", 10 * GB)
    ends, _ = finish_times([(0.0, FlowSpec((r,), 5 * GB)), (0.0, FlowSpec((r,), 15 * GB))])
    assert ends == pytest.approx([1.0, 2.0], rel=1e-12)
    # A late arrival halves the first flow's rate from then on.
    ends, _ = finish_times([(0.0, FlowSpec((r,), 10 * GB)), (0.5, FlowSpec((r,), 2 * GB))])
    assert ends == pytest.approx([1.2, 0.9], rel=1e-12)


def test_degraded_and_dead_resources() -> None:
    env = simpy.Environment()
    fabric = Fabric(env)
    nic = ResourceSpec("nic:tx", 10 * GB, owner="prefill/0")
    got: list[tuple[float, bool]] = []

    def one(nbytes: float) -> simpy.events.ProcessGenerator:
        ok = yield from fabric.send([FlowSpec((nic,), nbytes)])
        got.append((env.now, ok))

    def faults() -> simpy.events.ProcessGenerator:
        yield env.timeout(0.5)
        fabric.degrade("prefill/0", 0.5)  # 5 GB left at 5 GB/s: 1 s more
        yield env.timeout(2.0)
        fabric.degrade("prefill/0", 0.0, for_good=True)

    env.process(one(10 * GB))
    env.process(faults())
    env.run(until=2.0)
    assert got == [(pytest.approx(1.5, rel=1e-12), True)]
    env.process(one(100 * GB))
    env.run(until=2.6)
    assert got[-1] == (pytest.approx(2.5), False)  # killed when the NIC died for good
    env.process(one(1.0))
    env.run(until=3.0)
    assert got[-1] == (pytest.approx(2.6), False)  # nothing gets through a dead NIC


def test_a_resource_first_used_after_its_owner_died_for_good_is_dead() -> None:
    """Routes are resolved lazily: a NIC that no hand-off had crossed when its link died
    for good must fail the flows that reach it later, not carry them at 0 B/s forever."""
    env = simpy.Environment()
    fabric = Fabric(env)
    fabric.degrade("prefill/0", 0.0, for_good=True)
    nic = ResourceSpec("nic:tx", 10 * GB, owner="prefill/0")
    other = ResourceSpec("nic2:tx", 10 * GB, owner="prefill/1")
    dead, alive = fabric.start([FlowSpec((nic,), GB), FlowSpec((other,), GB)])
    env.run(until=1.0)
    assert dead.done.value is False
    assert alive.done.value is True


def test_uncapping_a_flow_with_no_finite_resource_finishes_it() -> None:
    """A layer-wise stream over an ideal link is limited by its cap alone; lifting the
    cap (the prefill ended early) leaves nothing to wait for."""
    env = simpy.Environment()
    fabric = Fabric(env)
    ideal = ResourceSpec("ideal:tx", float("inf"))
    (flow,) = fabric.start([FlowSpec((ideal,), 10 * GB, cap=1 * GB)])

    def prefill_ends() -> simpy.events.ProcessGenerator:
        yield env.timeout(4.0)
        fabric.uncap([flow])

    env.process(prefill_ends())

    def hung(_signum: int, _frame: object) -> None:
        raise TimeoutError("the re-plan never converged")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        env.run(until=100.0)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert flow.done.triggered
    assert flow.done.value is True
    assert fabric.active == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True),
                          st.one_of(st.just(float("inf")), st.floats(0.1, 20))),
                min_size=1, max_size=12),
       st.lists(st.floats(1, 50), min_size=5, max_size=5))
def test_allocation_is_feasible_and_max_min_fair(flows, capacities) -> None:
    """Every resource within capacity; every flow at its cap or on a full resource where
    no other flow gets more (the definition of max-min fairness)."""
    env = simpy.Environment()
    fabric = Fabric(env)
    specs = [FlowSpec(tuple(ResourceSpec(f"r{k}", capacities[k] * GB) for k in ks), 1e30,
                      cap * GB) for ks, cap in flows]
    started = fabric.start(specs)
    load: dict[str, float] = {}
    for flow in started:
        for r in flow.resources:
            load[r.key] = load.get(r.key, 0.0) + flow.rate
    for key, total in load.items():
        assert total <= fabric.resources[key].capacity * (1 + 1e-9)
    for flow in started:
        if flow.rate >= flow.cap * (1 - 1e-9):
            continue
        assert any(load[r.key] >= r.capacity * (1 - 1e-9)
                   and all(other.rate <= flow.rate * (1 + 1e-9) for other in r.flows)
                   for r in flow.resources)


# ----- hand-off routes over the fabric ---------------------------------------------------
SCHED = {"max_num_seqs": 64, "max_num_batched_tokens": 16384}


def pd_scenario(prefill: dict, decode: list[dict], **overrides):
    pools = [{"name": "prefill", "role": "prefill", "device": "H100-SXM",
              "scheduler": SCHED, **prefill}]
    pools += [{"role": "decode", "device": "H100-SXM", "scheduler": SCHED, **d} for d in decode]
    base = {
        "model": "Llama-3.1-70B",
        "cluster.pools": pools,
        "workload.arrival": {"kind": "constant", "rate_per_s": 1.0},
        "workload.input_tokens": {"kind": "fixed", "tokens": 4000},
        "workload.output_tokens": {"kind": "fixed", "tokens": 4},
        "workload.num_requests": 8,
    }
    base.update(overrides)
    return make_scenario(**base)


def test_4p1d_incast_is_slower_per_transfer_than_1p1d() -> None:
    """Four prefill nodes finishing together share the decode node's NICs."""
    burst = {"workload.arrival": {"kind": "all_at_once"}, "workload.num_requests": 4}
    one = pd_scenario({"parallelism": {"tp": 8}, "scheduler": {**SCHED, "max_num_seqs": 1}},
                      [{"name": "decode", "parallelism": {"tp": 8}}], **burst)
    four = pd_scenario({"parallelism": {"tp": 8}, "instances": 4},
                       [{"name": "decode", "parallelism": {"tp": 8}}],
                       **{**burst, "cluster.router": {"policy": "round_robin"}})
    t1 = run(one).transfers
    t4 = run(four).transfers
    assert len(t1) == len(t4) == 4
    assert t4["source_name"].nunique() == 4
    ib = load_link("ib-ndr")
    fixed = (ib.per_transfer_overhead_us + ib.latency_us) * 1e-6
    alone = fixed + 4000 * 327680 / 8 / ib.effective_bandwidth
    # 1P1D: prefills run one at a time, each hand-off has the NICs to itself.
    assert t1["duration_s"].to_numpy() == pytest.approx([alone] * 4, rel=1e-9)
    # 4P1D: four hand-offs at once into the same 8 decode NICs, a quarter each.
    assert t4["duration_s"].to_numpy() == pytest.approx([fixed + 4 * (alone - fixed)] * 4,
                                                        rel=1e-9)


def test_many_to_many_contends_only_where_routes_share() -> None:
    """2P2D: disjoint pairs run at full speed; crossing hand-offs halve each other."""
    ib = load_link("ib-ndr")
    fixed = (ib.per_transfer_overhead_us + ib.latency_us) * 1e-6
    alone = fixed + 4000 * 327680 / 8 / ib.effective_bandwidth
    rr = {"cluster.router": {"policy": "round_robin", "decode_policy": "round_robin"},
          "workload.arrival": {"kind": "all_at_once"}}
    sc = pd_scenario({"parallelism": {"tp": 8}, "instances": 2},
                     [{"name": "decode", "parallelism": {"tp": 8}, "instances": 2}],
                     **rr, **{"workload.num_requests": 2})
    t = run(sc).transfers
    assert sorted(zip(t["source_name"], t["destination_name"], strict=True)) == [
        ("prefill/0", "decode/0"), ("prefill/1", "decode/1")]
    assert t["duration_s"].to_numpy() == pytest.approx([alone] * 2, rel=1e-9)
    # Four prompts: each prefill sends two at once, one to each decode instance, so every
    # NIC on both sides carries two streams.
    t = run(sc.with_(**{"workload.num_requests": 4})).transfers
    assert t.groupby("source_name").size().to_dict() == {"prefill/0": 2, "prefill/1": 2}
    assert t.groupby("destination_name").size().to_dict() == {"decode/0": 2, "decode/1": 2}
    assert t["duration_s"].to_numpy() == pytest.approx([fixed + 2 * (alone - fixed)] * 4,
                                                       rel=1e-9)


def test_tp8_to_tp2_and_tp8_to_tp8_each_get_their_own_streams() -> None:
    """Links are keyed by what sets their capacity (the NICs), not by the first pairing."""
    sc = pd_scenario({"parallelism": {"tp": 8}},
                     [{"name": "d2", "parallelism": {"tp": 2}},
                      {"name": "d8", "parallelism": {"tp": 8}}],
                     **{"precision": {"weights": "fp8"},  # 70B fits two H100s in fp8
                        "cluster.router": {"policy": "round_robin",
                                           "decode_policy": "round_robin"}})
    res = run(sc)
    t = res.transfers
    assert set(t["destination_name"]) == {"d2/0", "d8/0"}
    ib = load_link("ib-ndr")
    fixed = (ib.per_transfer_overhead_us + ib.latency_us) * 1e-6
    nbytes = 4000 * 327680
    for name, ranks in (("d2/0", 2), ("d8/0", 8)):
        got = t.loc[t["destination_name"] == name, "duration_s"].to_numpy()
        assert got == pytest.approx([fixed + nbytes / ranks / ib.effective_bandwidth] * 4,
                                    rel=1e-9), name


def test_mla_latent_is_pulled_by_every_decode_rank() -> None:
    """DeepSeek-V3 TP8 -> TP8: each decode rank pulls the whole latent over its own NIC."""
    sc = pd_scenario({"parallelism": {"tp": 8}, "device": "H200-SXM"},
                     [{"name": "decode", "parallelism": {"tp": 8}, "device": "H200-SXM"}],
                     **{"model": "DeepSeek-V3", "precision": {"weights": "fp8"},
                        "workload.num_requests": 2})
    sim = Simulation(sc)
    latent = sim.plan.model.kv_bytes_per_token("bf16")
    assert sim.plan.transfer_path(0, 1).profile.name == "ib-ndr"
    t = sim.run().transfers
    ib = load_link("ib-ndr")
    fixed = (ib.per_transfer_overhead_us + ib.latency_us) * 1e-6
    assert t["duration_s"].to_numpy() == pytest.approx(
        [fixed + latent * 4000 / ib.effective_bandwidth] * 2, rel=1e-9)
    assert t["bytes"].to_numpy() == pytest.approx([8 * latent * 4000] * 2, rel=1e-12)


def test_gqa_replicated_beyond_its_kv_heads_is_pulled_per_replica() -> None:
    sc = pd_scenario({"parallelism": {"tp": 8}},
                     [{"name": "decode", "parallelism": {"tp": 16},
                       "placement": {"nodes_per_instance": 2}}])
    t = run(sc).transfers
    # Llama-3.1-70B has 8 KV heads: TP16 keeps each head on two ranks, each pulls its copy.
    assert t["bytes"].to_numpy() == pytest.approx([2 * 327680 * 4000] * 8, rel=1e-12)


def test_gb200_trays_hand_off_over_nvlink_inside_the_rack() -> None:
    sc = pd_scenario({"parallelism": {"tp": 4}, "device": "GB200-NVL72"},
                     [{"name": "decode", "parallelism": {"tp": 4}, "device": "GB200-NVL72"}])
    sim = Simulation(sc)
    assert sim.plan.placements[0].nodes != sim.plan.placements[1].nodes  # two trays
    assert sim.plan.transfer_path(0, 1).profile.name == "nvlink5"


def test_nics_shared_by_two_gpus_halve_a_full_node_hand_off(tmp_path) -> None:
    device = re.sub(r"scale_out_nics_per_node: 8[^\n]*", "scale_out_nics_per_node: 4",
                    load_device_yaml("H100-SXM"))
    assert "scale_out_nics_per_node: 4" in device
    shared = tmp_path / "H100-4nic.yaml"
    shared.write_text(device)
    one = pd_scenario({"parallelism": {"tp": 8}}, [{"name": "decode", "parallelism": {"tp": 8}}],
                      **{"workload.num_requests": 1})
    four = one.with_(**{"cluster.pools.prefill.device": str(shared),
                        "cluster.pools.decode.device": str(shared)})
    a = run(one).transfers["duration_s"].iloc[0]
    b = run(four).transfers["duration_s"].iloc[0]
    ib = load_link("ib-ndr")
    fixed = (ib.per_transfer_overhead_us + ib.latency_us) * 1e-6
    assert b - fixed == pytest.approx(2 * (a - fixed), rel=1e-9)


def test_spine_oversubscription_limits_cross_node_hand_offs() -> None:
    base = pd_scenario({"parallelism": {"tp": 8}}, [{"name": "decode", "parallelism": {"tp": 8}}],
                       **{"workload.num_requests": 1})
    over = base.with_(**{"cluster.kv_transfer": {"spine_oversubscription": 4.0}})
    a = run(base).transfers["duration_s"].iloc[0]
    b = run(over).transfers["duration_s"].iloc[0]
    ib = load_link("ib-ndr")
    fixed = (ib.per_transfer_overhead_us + ib.latency_us) * 1e-6
    assert b - fixed == pytest.approx(4 * (a - fixed), rel=1e-9)


def load_device_yaml(name: str) -> str:
    from simulator.hardware.registry import profiles_dir

    return (profiles_dir() / "devices" / f"{name}.yaml").read_text()


# Capacities and caps as a fabric sees them: positive, zero (a resource degraded to 0), or
# no cap at all; few distinct values, so that equal levels (ties) are common.
_CAPACITY = st.sampled_from([0.0, 1.0, 2.5, 3.0, 12.5e9, 25e9, 50e9, 1e-3])
_CAP = st.one_of(st.just(INF), _CAPACITY, st.floats(1e-6, 1e11))


@settings(max_examples=300, deadline=None)
@given(routes=st.lists(st.tuples(st.lists(_CAPACITY, max_size=4), _CAP), min_size=1,
                       max_size=12))
def test_unshared_resources_give_the_rates_of_progressive_filling(routes) -> None:
    """Where no two flows cross one resource, each flow's rate is read off its own route:
    the same floats progressive filling gives (the re-plans of most hand-offs)."""
    routes = [(caps, cap) for caps, cap in routes if caps or cap < INF]
    if not routes:
        return
    flows: dict[Flow, None] = {}
    for i, (caps, cap) in enumerate(routes):
        resources = tuple(Resource(f"r{i}.{j}", c) for j, c in enumerate(caps))
        flows[Flow(resources, 1.0, cap, None)] = None
    left = {r: r.capacity for f in flows for r in f.resources}
    _unshared(flows, left)
    fast = [f.rate for f in flows]
    for f in flows:
        f.rate = -1.0
    _fill(flows, dict(left), dict.fromkeys(left, 1))
    assert [f.rate for f in flows] == fast
    assert all(str(a) == str(b) for a, b in zip(fast, [f.rate for f in flows], strict=True))
