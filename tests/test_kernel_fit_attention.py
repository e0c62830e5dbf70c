"""Attention terms of the fitted per-operator roofline: full query blocks, GQA packing, the
K/V re-read of prefill, head-dimension scaling and the FP8-KV-cache kernels."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.parallel import Precisions
from simulator.cost.roofline import (
    PREFILL_BLOCK_M,
    gemm_tiles,
    kv_reread_bytes,
    prefill_tiles,
    quantisation,
)
from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
from simulator.models import get_model

H100 = load_device("H100-SXM")
SMS = 132
PREFILL = OperatorFit(compute=0.6, half_flops=1e8, memory=0.5, half_bytes=1e6, floor_us=5.0,
                      per_row_ps=100.0, tile_m=128)


def test_a_short_prompt_occupies_a_whole_query_block() -> None:
    # 16 query rows of 64 (sequence, head) pairs: a FlashAttention block has 128 rows whatever
    # the prompt, so 64 blocks with 16 of their 128 rows used (GEMMs pick a 16-row tile).
    whole, exact, _ = gemm_tiles(64, 16, 1.0, 128.0, 128, 0)
    assert whole == 64
    assert exact == pytest.approx(64 * 16 / 128)
    assert quantisation(PREFILL, (64, 16, 1.0, 128.0), SMS) == pytest.approx(SMS / 8)
    assert gemm_tiles(1, 16, 4096, 4096, 128, 128)[1] == pytest.approx(32)


def test_gqa_packing_puts_the_heads_of_one_kv_head_in_one_block() -> None:
    assert prefill_tiles(2, 16, 32, 8, 128.0) == (64, 16, 1.0, 128.0)
    assert prefill_tiles(2, 16, 32, 8, 128.0, pack_gqa=True) == (16, 64, 1.0, 128.0)
    packed = PREFILL.model_copy(update={"pack_gqa": True})
    # 16 rows x 4 heads fill half a block instead of an eighth: 4x less padding.
    plain = quantisation(PREFILL, prefill_tiles(64, 16, 32, 8, 128.0), SMS)
    assert plain / quantisation(packed, prefill_tiles(64, 16, 32, 8, 128.0, True), SMS) == (
        pytest.approx(4.0))


def _prefill_bytes(model: str, tokens: int, fits: dict[str, OperatorFit] | None = None,
                   kv: str = "bf16") -> float:
    device = H100 if fits is None else H100.model_copy(update={"operators": {
        "vllm": OperatorFits(source="t", fits=fits)}})
    cm = InstanceCostModel(get_model(model), device, engine="vllm", fitted=fits is not None,
                           precisions=Precisions(kv_cache=kv))
    return float(cm._prefill_attention_op(BatchShape.prefill(tokens))[1])


def test_prefill_attention_rereads_kv_once_per_query_block() -> None:
    m = get_model("Llama-3.1-8B")
    tokens = 8192
    kv_token = 2 * m.num_kv_heads * m.head_dim * 2.0
    pairs = tokens * (tokens + 1) / 2
    once = tokens * kv_token + tokens * (m.q_width + m.attn_out_width) * 2.0
    assert _prefill_bytes("Llama-3.1-8B", tokens) == pytest.approx(
        once + pairs / PREFILL_BLOCK_M * kv_token)
    assert kv_reread_bytes(pairs, kv_token) == pytest.approx(pairs / 128 * kv_token)


def test_head_dim_scales_attention_work_around_128() -> None:
    fit = PREFILL.model_copy(update={"head_dim_exp": 0.5})
    assert fit.work_scale(128) == 1.0
    assert fit.work_scale(256) == pytest.approx(math.sqrt(2))
    assert fit.work_scale(np.array([64.0, 512.0])) == pytest.approx([math.sqrt(0.5), 2.0])
    assert PREFILL.work_scale(512) == 1.0
    base = _prefill_bytes("Llama-3.1-8B", 2048, {"attention_prefill": PREFILL})
    assert base == pytest.approx(_prefill_bytes(  # Llama-3.1-8B: head_dim 128
        "Llama-3.1-8B", 2048, {"attention_prefill": fit}))


def test_an_fp8_kv_cache_prices_attention_with_its_own_fit() -> None:
    bf16 = PREFILL.model_copy(update={"floor_us": 5.0})
    fp8 = PREFILL.model_copy(update={"floor_us": 50.0})
    decode = OperatorFit(compute=0.3, half_flops=0.0, memory=0.8, half_bytes=0.0,
                         floor_us=4.0, tile_m=512)
    fits = {"attention_prefill": bf16, "attention_prefill_kv_fp8": fp8,
            "attention_decode": decode}
    device = H100.model_copy(update={"operators": {"vllm": OperatorFits(source="t", fits=fits)}})
    m8 = get_model("Llama-3.1-8B")

    def model(kv: str) -> InstanceCostModel:
        return InstanceCostModel(m8, device, engine="vllm", fitted=True,
                                 precisions=Precisions(kv_cache=kv))

    assert model("fp8")._fits["attention_prefill"] is fp8
    assert model("bf16")._fits["attention_prefill"] is bf16
    # No FP8-KV fit for decode: the BF16-KV kernel's constants price it.
    assert model("fp8")._fits["attention_decode"] is decode
    step = BatchShape.prefill(512)
    assert model("fp8").step(step).seconds > model("bf16").step(step).seconds


def test_kernel_fit_finds_gqa_packing_in_the_data() -> None:
    """Synthetic prefill timings from a packed 128-row fit: the fit chooses packing and the
    tile from its training shapes and predicts the held-out head layouts."""
    from simulator.validation.kernel_fit import Samples, evaluate, fit_family

    true = PREFILL.model_copy(update={"pack_gqa": True})
    rng = np.random.default_rng(3)
    n = 1200
    batch = rng.choice([1.0, 4.0, 16.0, 64.0], n)
    isl = rng.choice([16.0, 48.0, 200.0, 1000.0, 4096.0], n)
    layouts = np.array([(32, 8), (64, 8), (32, 32), (28, 4), (16, 2), (40, 8)], float)
    heads, kvh = layouts[rng.integers(0, len(layouts), n)].T
    hd = np.full(n, 128.0)
    pairs = isl * (isl + 1) / 2
    flops = 4 * heads * hd * pairs * batch
    nbytes = batch * isl * (2 * kvh * hd * 2 + 2 * heads * hd * 2)
    rows = batch * isl * heads
    q = quantisation(true, prefill_tiles(batch, isl, heads, kvh, hd, True), SMS)
    seconds = true.seconds(H100.peak_flops("bf16"), H100.memory_bandwidth, flops, nbytes,
                           batch * heads, rows, q)
    samples = Samples("attention_prefill", "bf16", flops, nbytes, batch * heads, rows, seconds,
                      heads == 28.0, "synthetic", tiles=(batch, isl, heads, kvh, hd),
                      head_dim=hd)
    _, fitted = fit_family(samples, H100)
    assert fitted.pack_gqa
    assert fitted.tile_m == 128
    assert evaluate(samples, H100, fitted)["median_ape_after"] < 1.0


def _fitted_h100(pack: bool) -> InstanceCostModel:
    fits = {"attention_prefill": PREFILL.model_copy(update={
        "pack_gqa": pack, "head_dim_exp": 0.3})}
    device = H100.model_copy(update={"operators": {"vllm": OperatorFits(source="t", fits=fits)}})
    return InstanceCostModel(get_model("Llama-3.1-8B"), device, engine="vllm", fitted=True)


@settings(max_examples=150, deadline=None)
@given(st.booleans(), st.lists(st.integers(1, 4096), min_size=1, max_size=3),
       st.integers(1, 4096), st.integers(0, 4096), st.integers(1, 600))
def test_packed_prefill_never_gets_cheaper_as_the_batch_grows(
        pack: bool, prompts: list[int], added: int, ctx: int, longer: int) -> None:
    # Several chunks on cached context are bounded by their longest chunk on all the
    # batch's context (OperatorPricing._prefill_attention_op), which is not monotone in the
    # chunks' lengths; the fresh prompts and one chunk on context below are.
    cm = _fitted_h100(pack)
    before = BatchShape.build([(n, 0, True) for n in prompts])
    another = BatchShape.build([(n, 0, True) for n in [*prompts, added]])
    grown = BatchShape.build([(prompts[0] + longer, 0, True)]
                             + [(n, 0, True) for n in prompts[1:]])
    t0 = cm.step(before).seconds
    assert cm.step(another).seconds >= t0 * (1 - 1e-12)
    assert cm.step(grown).seconds >= t0 * (1 - 1e-12)
    on_ctx = cm.step(BatchShape.build([(prompts[0], ctx, True)])).seconds
    assert cm.step(BatchShape.build([(prompts[0] + longer, ctx, True)])).seconds >= on_ctx
    assert cm.step(BatchShape.build([(prompts[0], ctx + longer, True)])).seconds >= on_ctx


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["H100-SXM", "H200-SXM", "A100-SXM-80GB", "B200", "L40S"]),
       st.sampled_from(["vllm", "trtllm", "sglang"]), st.sampled_from(["bf16", "fp8"]),
       st.sampled_from(["Llama-3.1-8B", "Llama-2-7B"]),
       st.lists(st.integers(1, 4096), min_size=1, max_size=3), st.integers(1, 4096),
       st.integers(1, 4096), st.integers(0, 4096))
def test_the_shipped_attention_fits_never_price_a_larger_batch_faster(
        device: str, engine: str, kv: str, model: str, prompts: list[int], added: int,
        d_ctx: int, more_ctx: int) -> None:
    cm = InstanceCostModel(get_model(model), load_device(device), engine=engine, fitted=True,
                           precisions=Precisions(kv_cache=kv))
    before = BatchShape.build([(n, 0, True) for n in prompts], [d_ctx])
    t0 = cm.step(before).seconds
    assert cm.step(BatchShape.build([(n, 0, True) for n in [*prompts, added]],
                                    [d_ctx])).seconds >= t0 * (1 - 1e-12)
    assert cm.step(BatchShape.build([(n, 0, True) for n in prompts],
                                    [d_ctx + more_ctx])).seconds >= t0 * (1 - 1e-12)
    assert cm.step(BatchShape.build([(n, 0, True) for n in prompts],
                                    [d_ctx, d_ctx])).seconds >= t0 * (1 - 1e-12)
