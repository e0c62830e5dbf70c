"""The pure cost model: roofline properties, physical sanity figures, collectives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost import (
    BatchShape,
    InstanceCostModel,
    LinkSet,
    Parallelism,
    Precisions,
    allreduce_time,
    plan_memory,
    roofline,
)
from simulator.hardware import load_device, load_link
from simulator.models import get_model

H100 = load_device("H100-SXM")
NVL = load_link("nvlink4")
IB = load_link("ib-ndr")
M8 = get_model("Llama-3.1-8B")
M70 = get_model("Llama-3.1-70B")

work = st.floats(min_value=0, max_value=1e18, allow_nan=False, allow_infinity=False)


@given(work, work, work, work)
def test_roofline_never_negative_and_monotone(f1: float, b1: float, df: float, db: float) -> None:
    a = roofline(f1, b1, 1e15, 3e12, 0.8, 0.8, 2e-6)
    b = roofline(f1 + df, b1 + db, 1e15, 3e12, 0.8, 0.8, 2e-6)
    assert a.seconds >= 0
    assert b.seconds >= a.seconds


def test_roofline_rejects_negative_work() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        roofline(-1, 0, 1, 1, 1, 1)


decode = st.tuples(st.integers(0, 512), st.integers(0, 4096))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 512), st.integers(0, 256), st.integers(1, 2048), st.integers(0, 64),
       st.integers(0, 4096))
def test_step_never_decreases_as_work_grows(new: int, ctx: int, d_ctx: int, more_new: int,
                                            more_ctx: int) -> None:
    cm = InstanceCostModel(M8, H100)
    small = BatchShape.build([(new, ctx, True)], [d_ctx])
    big = BatchShape.build([(new + more_new, ctx, True)], [d_ctx + more_ctx])
    more_seqs = BatchShape.build([(new, ctx, True)], [d_ctx, d_ctx])
    t0 = cm.step(small).seconds
    assert t0 > 0
    assert cm.step(big).seconds >= t0
    assert cm.step(more_seqs).seconds >= t0


def test_batch1_decode_8b_is_weight_streaming() -> None:
    """A batch-1 decode step of Llama-3.1-8B bf16 on H100 ~ weight bytes / (eta_m * 3.35 TB/s)."""
    cm = InstanceCostModel(M8, H100)
    step = cm.step(BatchShape.decode(1, 512))
    ideal = M8.weight_bytes("bf16") / (H100.efficiency.memory * H100.memory_bandwidth)
    assert step.bound == "memory"
    assert step.seconds == pytest.approx(ideal, rel=0.15)
    assert step.seconds > ideal  # launches and attention add on top, never subtract


def test_decode_flat_then_growing_for_70b_tp8() -> None:
    """Calibration note: decode step nearly flat up to ~16-32 sequences for a 70B on 8 GPUs."""
    cm = InstanceCostModel(M70, H100, Parallelism(tp=8), links=LinkSet(tp=NVL))
    t1 = cm.step(BatchShape.decode(1, 1000)).seconds
    t16 = cm.step(BatchShape.decode(16, 16 * 1000)).seconds
    t256 = cm.step(BatchShape.decode(256, 256 * 1000)).seconds
    assert t16 < 1.25 * t1
    assert t256 > 1.5 * t1


def test_prefill_superlinear_for_long_prompts() -> None:
    cm = InstanceCostModel(M8, H100)
    t2k = cm.step(BatchShape.prefill(2048)).seconds
    t32k = cm.step(BatchShape.prefill(32768)).seconds
    assert t32k > 16 * t2k * 1.1


def test_tp1_has_no_communication_and_tp_costs_grow() -> None:
    one = InstanceCostModel(M70, load_device("H200-SXM")).step(BatchShape.prefill(512))
    assert one.communication_s == 0.0
    assert allreduce_time(1e6, 1, NVL) == 0.0
    assert allreduce_time(2e6, 4, NVL) > allreduce_time(1e6, 4, NVL)
    assert allreduce_time(1e6, 8, NVL) > allreduce_time(1e6, 2, NVL)
    assert allreduce_time(1e6, 8, IB) > allreduce_time(1e6, 8, NVL)


def test_allreduce_small_message_floor_matches_measurement() -> None:
    """H100 nccl-tests 512 B all-reduce: 6.2 / 9.4 / 15.5 us on 2 / 4 / 8 GPUs, by the link's
    alpha-beta fields (what a link without an ``nccl`` block prices with)."""
    plain = NVL.model_copy(update={"nccl": None})
    for n, us in ((2, 6.2), (4, 9.4), (8, 15.5)):
        assert allreduce_time(512, n, plain) * 1e6 == pytest.approx(us, abs=1.0)


def test_memory_plan_kv_capacity() -> None:
    cm = InstanceCostModel(M8, H100)
    mem = plan_memory(M8, H100, Parallelism(), Precisions(), memory_utilization=0.9,
                      block_size=16, max_batched_tokens=8192, max_seqs=256,
                      runtime_reserve_gib=1.5,
                      kv_elements_per_token_per_layer_device=cm.kv_elements_per_token_per_layer_device())
    assert mem.weight_bytes == pytest.approx(M8.weight_bytes("bf16"), rel=1e-6)
    expected = (0.9 * 79.1 * 2**30 - mem.weight_bytes - mem.activation_bytes) / (128 * 1024)
    assert mem.kv_capacity_tokens == pytest.approx(expected, abs=16)
    assert mem.kv_capacity_tokens % 16 == 0
    assert 350_000 < mem.kv_capacity_tokens < 450_000


def test_kv_capacity_uses_the_binary_capacity_the_runtime_sees() -> None:
    """Llama-3.1-70B TP8 on H100 at 0.9: ~1.38 M KV tokens (79.1 GiB), not 1.27 M (80e9 B)."""
    cm = InstanceCostModel(M70, H100, Parallelism(tp=8), links=LinkSet(tp=NVL))
    mem = plan_memory(M70, H100, Parallelism(tp=8), Precisions(), memory_utilization=0.9,
                      block_size=16, max_batched_tokens=8192, max_seqs=256,
                      runtime_reserve_gib=1.5,
                      kv_elements_per_token_per_layer_device=cm.kv_elements_per_token_per_layer_device())
    assert mem.capacity_bytes == pytest.approx(79.1 * 2**30)
    assert mem.kv_capacity_tokens == pytest.approx(1.38e6, rel=0.01)


def test_fp8_weights_halve_weight_stream() -> None:
    bf = InstanceCostModel(M70, H100, Parallelism(tp=8), links=LinkSet(tp=NVL))
    f8 = InstanceCostModel(M70, H100, Parallelism(tp=8), Precisions("fp8", "fp8", "fp8"),
                           links=LinkSet(tp=NVL))
    a = bf.step(BatchShape.decode(1, 100))
    b = f8.step(BatchShape.decode(1, 100))
    assert b.memory_s == pytest.approx(a.memory_s / 2, rel=0.1)


def test_ep_with_tp_attention_sends_nothing_beyond_the_all_reduces() -> None:
    """vLLM --enable-expert-parallel without DP: experts combine through the TP all-reduce.

    DeepSeek-V3 TP8 on H200, decode b=64: EP8 must not pay dispatch/combine all-to-alls,
    so its communication equals EP1's and its step is no slower (same expert bytes read).
    """
    v3, h200 = get_model("DeepSeek-V3"), load_device("H200-SXM")
    batch = BatchShape.decode(64, 64 * 1024)
    steps = {}
    for ep in (1, 8):
        cm = InstanceCostModel(v3, h200, Parallelism(tp=8, ep=ep), Precisions(weights="fp8"),
                               LinkSet(tp=NVL, ep=NVL if ep > 1 else None))
        steps[ep] = cm.step(batch)
    assert steps[8].communication_s == pytest.approx(steps[1].communication_s, rel=1e-12)
    assert steps[8].seconds <= steps[1].seconds


def test_moe_exchange_only_with_data_parallel_attention() -> None:
    from simulator.cost.collectives import alltoall_time, moe_token_exchange_time

    assert moe_token_exchange_time("tp", 1e6, 8, NVL) == 0.0
    assert moe_token_exchange_time("dp", 1e6, 8, NVL) == pytest.approx(
        2 * alltoall_time(1e6, 8, NVL))
    assert moe_token_exchange_time("dp", 1e6, 1, NVL) == 0.0
