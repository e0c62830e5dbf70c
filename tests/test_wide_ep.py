"""Data-parallel attention with wide expert parallelism: memory, DeepEP all-to-all, expert load."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import yaml
from pydantic import ValidationError

from simulator.cost.batch import BatchShape
from simulator.cost.dp_attention import rank_batch, split_in_two
from simulator.cost.expert_load import (
    eplb_rank_loads,
    hottest_rank_factor,
    imbalance,
    static_rank_loads,
    zipf_popularity,
)
from simulator.cost.memory import plan_memory, stage_weight_bytes
from simulator.cost.moe_comm import EPGroup, alltoall_seconds, moe_exchange_seconds
from simulator.cost.parallel import Parallelism, Precisions
from simulator.cost.step import InstanceCostModel, LinkSet
from simulator.errors import ConfigError
from simulator.hardware.registry import load_device, load_link
from simulator.models.catalog import get_model
from simulator.runner import wide_ep_study
from simulator.runner.executors import make_executor
from simulator.runner.plan_spec import Family, PlanSpec, families, scenario_of
from simulator.runner.planner import Planner
from simulator.scenario.schema import Scenario
from tests.conftest import REPO

DSV3 = get_model("DeepSeek-V3")
H100 = load_device("H100-SXM")
NVL, IB = load_link("nvlink4"), load_link("ib-ndr")
FP8 = Precisions("fp8", "fp8", "bf16")


def _plan(par: Parallelism, redundant: int = 0):
    probe = InstanceCostModel(DSV3, H100, par, FP8, LinkSet(tp=NVL if par.tp > 1 else None),
                              ep_group=EPGroup(par.ep, 8, NVL, IB) if par.dp > 1 else None,
                              redundant_experts=redundant)
    return plan_memory(DSV3, H100, par, FP8, memory_utilization=0.9, block_size=64,
                       max_batched_tokens=8192 * par.dp, max_seqs=256 * par.dp,
                       runtime_reserve_gib=2.0,
                       kv_elements_per_token_per_layer_device=probe.kv_elements_per_token_per_layer_device(),
                       redundant_experts=redundant)


def _dp(ranks: int, mode: str = "auto", tbo: bool = False, imb: float = 1.0,
        per_node: int = 8) -> InstanceCostModel:
    return InstanceCostModel(DSV3, H100, Parallelism(1, 1, ranks, dp=ranks), FP8, LinkSet(),
                             ep_group=EPGroup(ranks, per_node, NVL, IB, 4), deepep_mode=mode,  # type: ignore[arg-type]
                             two_batch_overlap=tbo, moe_imbalance=imb)


# ----- memory ------------------------------------------------------------------------
def test_dp_attention_kv_capacity_scales_with_ranks() -> None:
    tokens = {dp: _plan(Parallelism(1, 1, dp, dp=dp)).kv_capacity_tokens for dp in (16, 32, 64)}
    # Each rank keeps its own requests' latent KV; more ranks also shrink each rank's experts.
    assert tokens[32] >= 2 * tokens[16]
    assert tokens[64] >= 2 * tokens[32]


def test_dp_attention_holds_far_more_kv_than_tp_attention_on_the_same_devices() -> None:
    # Two nodes: TP16 attention replicates MLA's latent on all 16 ranks; DP16 does not,
    # but replicates attention, dense FFN and shared-expert weights, which costs some room.
    tp = _plan(Parallelism(16, 1, 16)).kv_capacity_tokens
    dp = _plan(Parallelism(1, 1, 16, dp=16)).kv_capacity_tokens
    assert 6 * tp < dp < 16 * tp


def test_redundant_experts_take_memory_on_every_rank() -> None:
    par = Parallelism(1, 1, 32, dp=32)
    plain, extra = stage_weight_bytes(DSV3, par, "fp8"), stage_weight_bytes(DSV3, par, "fp8", 32)
    expert = DSV3.ffn_params(DSV3.moe_intermediate_size)
    moe_layers = DSV3.num_layers - DSV3.first_dense_layers
    assert extra[0] - plain[0] == pytest.approx(moe_layers * 32 * expert / 32)


def test_dp_requires_ep_to_span_every_rank() -> None:
    with pytest.raises(ValueError, match="ep = dp x tp"):
        Parallelism(1, 1, 8, dp=16)


# ----- DeepEP all-to-all -------------------------------------------------------------
@pytest.mark.parametrize(("kernel", "tokens"), [("normal", 4096), ("low_latency", 128)])
def test_alltoall_time_grows_with_nodes_crossed(kernel: str, tokens: int) -> None:
    times = [moe_exchange_seconds(kernel, tokens, 7168, 256, 8, EPGroup(ep, 8, NVL, IB, 4))  # type: ignore[arg-type]
             for ep in (8, 16, 32, 64)]
    assert all(a < b for a, b in itertools.pairwise(times)), times


def test_same_ranks_on_fewer_nodes_exchange_faster() -> None:
    two_nodes = moe_exchange_seconds("normal", 4096, 7168, 256, 8, EPGroup(16, 8, NVL, IB))
    one_domain = moe_exchange_seconds("normal", 4096, 7168, 256, 8, EPGroup(16, 16, NVL, IB))
    assert one_domain < two_nodes


def test_low_latency_matches_the_deepep_readme_points() -> None:
    # DeepEP README, H800 + CX7 400G, 128 tokens, top-8, 7168 hidden: EP32 dispatch 155 us,
    # combine 273 us (the curve is those points; the fixed latency adds a few us).
    group = EPGroup(32, 8, NVL, IB)
    assert alltoall_seconds("dispatch", "low_latency", 128, 7168, 256, 8, group) == \
        pytest.approx(155e-6, rel=0.08)
    assert alltoall_seconds("combine", "low_latency", 128, 7168, 256, 8, group) == \
        pytest.approx(273e-6, rel=0.08)


def test_group_limited_routing_caps_nodes_per_token() -> None:
    free = EPGroup(64, 8, NVL, IB)
    limited = EPGroup(64, 8, NVL, IB, max_nodes_per_token=4)
    assert free.nodes_per_token(256, 8) > 4.5
    assert limited.nodes_per_token(256, 8) == 4
    assert moe_exchange_seconds("normal", 4096, 7168, 256, 8, limited) < \
        moe_exchange_seconds("normal", 4096, 7168, 256, 8, free)


def test_dp_attention_step_has_alltoall_and_no_allreduce() -> None:
    ops = _dp(32).breakdown(BatchShape.decode(32 * 64, 32 * 64 * 2000))
    assert ops.get("moe_alltoall", 0) > 0
    assert "allreduce" not in ops


def test_deepep_auto_uses_low_latency_for_decode_and_normal_for_prefill() -> None:
    decode = BatchShape.decode(32 * 128, 32 * 128 * 1000)
    prefill = BatchShape.build([(4096, 0, True)] * 32)
    auto, ll, normal = _dp(32), _dp(32, "low_latency"), _dp(32, "normal")
    assert auto.step(decode).seconds == ll.step(decode).seconds
    assert auto.step(prefill).seconds == normal.step(prefill).seconds


def test_step_prices_the_busiest_rank() -> None:
    b = BatchShape.decode(33, 33 * 100)
    r = rank_batch(b, 32)
    assert r.decode_seqs == 2
    assert r.decode_ctx_tokens == 200


def test_hottest_rank_stretches_moe_and_exchange() -> None:
    b = BatchShape.decode(32 * 128, 32 * 128 * 1000)
    even, hot = _dp(32).breakdown(b), _dp(32, imb=1.5).breakdown(b)
    assert hot["moe_alltoall"] == pytest.approx(even["moe_alltoall"] * 1.5, rel=0.05)
    assert hot["moe"] > even["moe"]


# ----- two-batch overlap ---------------------------------------------------------------
def test_two_batch_overlap_hides_communication_of_large_batches() -> None:
    prefill = BatchShape.build([(4096, 0, True)] * 32 * 4)
    assert _dp(32, tbo=True).step(prefill).seconds < _dp(32).step(prefill).seconds


def test_two_batch_overlap_needs_a_batch_that_splits() -> None:
    one = BatchShape.decode(1, 1000)
    assert split_in_two(one) is None
    assert _dp(32, tbo=True).step(one).seconds == _dp(32).step(one).seconds


def test_decode_series_equals_steps_in_dp_mode() -> None:
    cost = _dp(16)
    ctx = np.array([16 * 500, 16 * 501, 16 * 502])
    series = cost.decode_series(16, ctx)
    assert series.seconds.tolist() == [cost.step(BatchShape.decode(16, int(c))).seconds
                                       for c in ctx]


# ----- expert load ----------------------------------------------------------------------
def test_eplb_lowers_the_hottest_rank_load() -> None:
    pop = zipf_popularity(256, 0.8, seed=3)
    static = hottest_rank_factor(static_rank_loads(pop, 32))
    packed = hottest_rank_factor(eplb_rank_loads(pop, 32, 0))
    replicated = hottest_rank_factor(eplb_rank_loads(pop, 32, 32))
    assert replicated < packed <= static
    assert replicated < 1.1 < static


def test_uniform_popularity_is_balanced_and_loads_sum_to_one() -> None:
    pop = np.full(256, 1 / 256)
    assert imbalance(pop, 32) == pytest.approx(1.0)
    assert eplb_rank_loads(zipf_popularity(256, 1.0), 72, 32).sum() == pytest.approx(1.0)


def test_eplb_slots_must_divide_over_ranks() -> None:
    with pytest.raises(ValueError, match="must divide experts"):
        eplb_rank_loads(zipf_popularity(256, 1.0), 72, 0)


# ----- scenario, build and the study ----------------------------------------------------
def _scenario_data() -> dict:
    return yaml.safe_load(wide_ep_study.SCENARIO.read_text())


def test_shipped_wide_ep_scenario_builds_dp_instances() -> None:
    prefill, decode = wide_ep_study._plan(_scenario_data())
    assert decode.parallelism.devices == 72
    assert decode.cost_models[0].ep_group.nodes == 9
    assert prefill.cost_models[0].ep_group.nodes == 4
    # 256 + 32 redundant experts over 72 ranks: 4 expert slots per rank.
    assert decode.memory.kv_capacity_tokens % 72 == 0
    assert 1.0 <= decode.cost_models[0].moe_imbalance < 1.1


@pytest.mark.parametrize(("change", "message"), [
    ({"parallelism": {"tp": 1, "dp": 8, "ep": 4}}, "ep must equal dp x tp"),
    ({"parallelism": {"tp": 8, "ep": 8}, "moe": {"two_batch_overlap": True}},
     "two_batch_overlap needs data-parallel attention"),
    ({"moe_imbalance": 1.3}, "either moe_imbalance or a moe.expert_load"),
])
def test_bad_wide_ep_settings_are_refused(change: dict, message: str) -> None:
    data = _scenario_data()
    data["cluster"]["pools"][1] = dict(data["cluster"]["pools"][1], **change)
    with pytest.raises(ValidationError, match=message):
        Scenario.model_validate(data)


def test_eplb_slots_that_do_not_divide_are_a_config_error() -> None:
    data = _scenario_data()
    decode = dict(data["cluster"]["pools"][1])
    decode["moe"] = dict(decode["moe"], expert_load=dict(decode["moe"]["expert_load"],
                                                          redundant_experts=30))
    data["cluster"]["pools"][1] = decode
    with pytest.raises(ConfigError, match=r"pools\[1\].moe.expert_load.*286"):
        wide_ep_study._plan(data)


def test_study_tables_in_the_docs_are_current() -> None:
    """docs/wide_ep.md and docs/parallelism.md show what the study computes today."""
    wide, par = (REPO / "docs" / "wide_ep.md").read_text(), (REPO / "docs" / "parallelism.md").read_text()
    for row in wide_ep_study.sglang_rows():
        assert row in wide, row
    for model, precision, configs in wide_ep_study.CROSSOVER:
        for label, parallel in configs:
            row = wide_ep_study.crossover_row(model, label, parallel, precision)
            assert row in par, row


# ----- the planner searches dp ------------------------------------------------------------
def _plan_spec(model: str, dp: list[int]) -> PlanSpec:
    return PlanSpec.model_validate({
        "name": "wide", "model": model, "engine": "sglang",
        "workload": {"arrival": {"kind": "poisson", "rate_per_s": 5},
                     "input_tokens": {"kind": "fixed", "tokens": 1000},
                     "output_tokens": {"kind": "fixed", "tokens": 100}, "num_requests": 50},
        "slo": {"tpot_s": 0.1}, "hardware": [{"device": "H100-SXM", "max_devices": 32}],
        "layouts": ["colocated"], "tp": [1, 8], "dp": dp,
        "scheduler": {"max_num_seqs": 64, "max_num_batched_tokens": 4096},
    })


def test_planner_families_include_dp_attention_shapes() -> None:
    spec = _plan_spec("DeepSeek-V3", [1, 16])
    shapes = {f.shapes[0] for f in families(spec)}
    wide = next(s for s in shapes if s.dp == 16 and s.tp == 1)
    assert wide.devices == 16
    assert wide.text() == "H100-SXM DP16xEP16"
    assert all(s.devices <= 32 for s in shapes)  # TP8 x DP16 = 128 devices is left out
    pool = scenario_of(spec, Family("colocated", (wide,)), (1,)).cluster.pools[0]
    assert (pool.parallelism.dp, pool.parallelism.ep) == (16, 16)
    assert pool.scheduler.max_num_seqs == 64 * 16


def test_planner_rejects_dp_shapes_a_model_cannot_use() -> None:
    spec = _plan_spec("Llama-3.1-8B", [1, 2])
    planner = Planner(spec, make_executor("local", 1, None))
    bad = planner.unfit_shapes()
    assert {s.dp for s in bad} == {2}
    assert any("dense model" in r["reason"] for r in planner.rejected)
