"""vLLM's FlashAttention-2 decode path copies the queries into the grouped layout when more
than one sequence and more than one KV head are on the device (``OperatorFit.q_copy_us``)."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.parallel import Parallelism
from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
from simulator.models import get_model

L40S = load_device("L40S")
GROUPED = OperatorFit(compute=0.5, half_flops=1e7, memory=0.8, half_bytes=1e6,
                      half_units=40.0, floor_us=9.0, per_row_ps=3e4, row_unit="kv_head",
                      tile_m=256, group_limit=128, group_reread=0.3, group_row_share=0.9,
                      group_floor_us=7.0)
COPY = GROUPED.model_copy(update={"q_copy_us": 3.0})


def test_the_copy_is_paid_with_several_sequences_and_several_kv_heads() -> None:
    from simulator.validation.kernel_fit import Samples
    from simulator.validation.kernel_fit_predict import extra_floor

    groups = np.array([8.0, 8.0, 8.0, 8.0, 1.0, 256.0])
    batch = np.array([1.0, 2.0, 64.0, 64.0, 64.0, 64.0])
    kvh = np.array([2.0, 1.0, 2.0, 8.0, 8.0, 2.0])
    want = np.array([0.0, 0.0, 3.0, 3.0, 0.0, 0.0])
    assert list(COPY.q_copy_floor(groups, batch, kvh)) == list(want)
    assert GROUPED.q_copy_floor(groups, batch, kvh) == 0.0
    n = len(groups)
    ones = np.ones(n)
    samples = Samples("attention_decode", "bf16", ones, ones, ones, ones, ones,
                      np.zeros(n, bool), "synthetic", ones, (batch, batch, kvh),
                      np.full(n, 128.0), groups, ones)
    idx = np.arange(n)
    got = extra_floor(samples, COPY, idx) - extra_floor(samples, GROUPED, idx)
    assert got == pytest.approx(want * 1e-6)


def test_the_step_model_prices_the_copy_only_with_several_kv_heads_per_device() -> None:
    """Llama-3.1-8B (32 query over 8 KV heads) on one L40S pays the copy in every layer's
    decode attention; the same layout with one KV head (32 query heads over 1) does not."""
    def model(fit: OperatorFit, kv_heads: int) -> InstanceCostModel:
        device = L40S.model_copy(update={"operators": {"vllm": OperatorFits(
            source="t", fits={"attention_decode": fit})}})
        arch = get_model("Llama-3.1-8B").model_copy(update={"num_kv_heads": kv_heads})
        return InstanceCostModel(arch, device, Parallelism(), engine="vllm", fitted=True)

    step = BatchShape.decode(16, 16 * 64)
    layers = get_model("Llama-3.1-8B").num_layers
    slower = model(COPY, 8).step(step).seconds - model(GROUPED, 8).step(step).seconds
    assert slower == pytest.approx(layers * 3e-6, rel=1e-6)
    assert model(COPY, 1).step(step).seconds == model(GROUPED, 1).step(step).seconds


def _l40s_8b(fit: OperatorFit) -> InstanceCostModel:
    device = L40S.model_copy(update={"operators": {"vllm": OperatorFits(
        source="t", fits={"attention_decode": fit})}})
    return InstanceCostModel(get_model("Llama-3.1-8B"), device, Parallelism(), engine="vllm",
                             fitted=True)


def test_one_sequence_and_a_mixed_step_run_no_copy() -> None:
    """FlashAttention-2 swaps the query layout only where every query is one token
    (``max_seqlen_q == 1``): a decode-only step of one sequence, or a step that also
    prefills, runs without the copy; a decode-only step of two pays it once per layer."""
    copy, plain = _l40s_8b(COPY), _l40s_8b(GROUPED)
    layers = get_model("Llama-3.1-8B").num_layers
    alone = BatchShape.decode(1, 300)
    assert copy.step(alone).seconds == plain.step(alone).seconds
    mixed = BatchShape.build([(256, 0, True)], [300, 400])
    assert copy.step(mixed).seconds == plain.step(mixed).seconds
    two = BatchShape.decode(2, 700)
    assert copy.step(two).seconds - plain.step(two).seconds == pytest.approx(layers * 3e-6,
                                                                             rel=1e-6)


def test_a_decode_series_prices_the_copy_as_its_steps_do() -> None:
    cost = _l40s_8b(COPY)
    for seqs in (1, 2, 16):
        sums = np.array([seqs * 64, seqs * 64 + seqs])
        series = cost.decode_series(seqs, sums)
        for j, total in enumerate(sums):
            assert series.seconds[j] == pytest.approx(
                cost.step(BatchShape.decode(seqs, int(total))).seconds, rel=1e-12)


def test_the_copy_needs_the_grouped_kernel_and_a_decode_family() -> None:
    plain = GROUPED.model_dump() | {"group_limit": 0}
    with pytest.raises(ValidationError, match=r"q_copy_us 2.0 prices the grouped decode "
                                              r"kernel and needs group_limit > 0"):
        OperatorFit.model_validate({**plain, "q_copy_us": 2.0})
    with pytest.raises(ValidationError, match=r"attention_prefill\.q_copy_us: only "
                                              r"decode-attention families"):
        OperatorFits(source="t", fits={"attention_prefill": COPY})
