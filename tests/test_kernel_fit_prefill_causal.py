"""Prefill attention under a persistent causal tile scheduler (``OperatorFit.causal_tail``,
``kv_reread_share``) and the softmax work of each query-key pair (``softmax_dim``)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.roofline import (
    causal_quantisation,
    causal_share,
    kv_reread_bytes,
    prefill_tiles,
    quantisation,
)
from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
from simulator.models import get_model
from tests.kernel_cells import measured_cell

B200 = load_device("B200")
SMS = 148
PREFILL = OperatorFit(compute=0.6, half_flops=1e8, memory=0.7, half_bytes=1e6, floor_us=5.0,
                      per_row_ps=200.0, tile_m=256)
CAUSAL = PREFILL.model_copy(update={"causal_tail": 0.6})


def test_one_long_prompt_waits_for_the_last_query_block_of_its_sequence() -> None:
    # 16,384 tokens on one head: 64 blocks of 256 rows on 148 SMs, one wave, but the last
    # block reads all 16,384 keys, 2 x 64 / 65 times the mean block's work.
    pairs = 16384 * 16385 / 2
    one = causal_share(SMS, 256, 1.0, 16384.0, 16384.0, pairs)
    assert one == pytest.approx(SMS * 256 * 2 / 16385)
    assert causal_quantisation(1.0, one, 0.6) == pytest.approx(one)  # the longest tile
    # On 64 heads the work balances over the SMs and the tail adds 0.6 of that tile.
    many = causal_share(SMS, 256, 64.0, 16384.0, 16384.0, pairs)
    assert many == pytest.approx(one / 64)
    assert causal_quantisation(1.0, many, 0.6) == pytest.approx(1 + 0.6 * many)
    # Never below the tile/wave multiplier (short prompts: padded blocks).
    assert causal_quantisation(16.0, many, 0.6) == 16.0
    arrays = causal_quantisation(np.array([1.0, 16.0]), np.array([one, many]), 0.6)
    assert list(arrays) == pytest.approx([one, 16.0])


def _b200(fit: OperatorFit, model: str = "Llama-3.1-8B") -> InstanceCostModel:
    device = B200.model_copy(update={"operators": {"vllm": OperatorFits(
        source="t", fits={"attention_prefill": fit})}})
    return InstanceCostModel(get_model(model), device, engine="vllm", fitted=True)


def test_the_step_prices_a_long_prompt_with_its_longest_tile() -> None:
    # Llama-3.1-8B at TP1: 32 query heads, a 16,384-token prompt: 2,048 blocks.
    plain, causal = _b200(PREFILL), _b200(CAUSAL)
    b = BatchShape.prefill(16384)
    flops, nbytes, units, quant = plain._prefill_attention_op(b)
    share = causal_share(SMS, 256, 32.0, 16384.0, 16384.0, b.prefill_attn_pairs)
    assert quant == pytest.approx(quantisation(
        PREFILL, prefill_tiles(1, 16384.0, 32.0, 8.0, 128.0), SMS))
    assert causal._prefill_attention_op(b) == pytest.approx(
        (flops, nbytes, units, causal_quantisation(quant, share, 0.6)))
    assert causal.step(b).seconds > plain.step(b).seconds
    # A chunk on cached context: its last block reads the context's keys too.
    chunk = BatchShape.build([(2048, 14336, True)])
    share = causal_share(SMS, 256, 32.0, 2048.0, 16384.0, chunk.prefill_attn_pairs)
    q = plain._prefill_attention_op(chunk)[3]
    assert causal._prefill_attention_op(chunk)[3] == pytest.approx(
        causal_quantisation(q, share, 0.6))


def test_small_head_dimensions_pay_the_softmax_of_each_pair() -> None:
    fit = PREFILL.model_copy(update={"softmax_dim": 160.0, "head_dim_exp": 0.2})
    assert fit.flops_scale(64) == pytest.approx(fit.work_scale(64) * 2.5)
    assert fit.flops_scale(256) == pytest.approx(fit.work_scale(256))
    hd = np.array([64.0, 128.0, 256.0])
    assert list(fit.flops_scale(hd)) == pytest.approx([fit.flops_scale(h) for h in hd])
    # The step: Llama-3.1-8B's head dimension 128 is below 160, its FLOPs x 1.25, bytes not.
    b = BatchShape.prefill(4096)
    base = _b200(PREFILL.model_copy(update={"head_dim_exp": 0.2}))._prefill_attention_op(b)
    floor = _b200(fit)._prefill_attention_op(b)
    assert floor[0] == pytest.approx(base[0] * 1.25)
    assert floor[1:] == pytest.approx(base[1:])


def test_the_kv_reread_that_hits_l2_costs_no_memory_time() -> None:
    # Llama-2-7B (MHA, 32 KV heads): a 16,384-token prompt re-reads 128 blocks' K and V.
    b = BatchShape.prefill(16384)
    full = _b200(CAUSAL, "Llama-2-7B")._prefill_attention_op(b)
    quarter = _b200(CAUSAL.model_copy(update={"kv_reread_share": 0.25}),
                    "Llama-2-7B")._prefill_attention_op(b)
    m = get_model("Llama-2-7B")
    reread = kv_reread_bytes(b.prefill_attn_pairs, 2 * m.num_kv_heads * m.head_dim * 2.0)
    assert quarter[1] == pytest.approx(full[1] - 0.75 * reread)
    assert (quarter[0], quarter[2], quarter[3]) == (full[0], full[2], full[3])


def test_kernel_fit_recovers_the_causal_tail_and_the_softmax_floor() -> None:
    """Synthetic timings from a 256-row causal fit with a softmax floor at head dim 112 and
    30 % of the K/V re-read reaching memory: the fit chooses the causal schedule and tile on
    its training shapes, recovers the three terms and predicts the held-out head layouts."""
    from simulator.validation.kernel_fit import Samples, evaluate, fit_family
    from simulator.validation.kernel_fit_predict import predict

    true = CAUSAL.model_copy(update={"softmax_dim": 112.0, "head_dim_exp": 0.1,
                                     "kv_reread_share": 0.3})
    rng = np.random.default_rng(5)
    n = 1500
    batch = rng.choice([1.0, 2.0, 4.0, 16.0, 64.0], n)
    isl = rng.choice([16.0, 200.0, 1000.0, 4096.0, 8192.0, 16384.0], n)
    layouts = np.array([(1, 1), (4, 4), (8, 1), (32, 8), (64, 8), (16, 2), (12, 4)], float)
    heads, kvh = layouts[rng.integers(0, len(layouts), n)].T
    hd = rng.choice([64.0, 128.0, 256.0], n)
    pairs = isl * (isl + 1) / 2
    flops = 4 * heads * hd * pairs * batch
    reread = kv_reread_bytes(batch * pairs, kvh * 2 * hd * 2)
    nbytes = batch * isl * (2 * kvh * hd * 2 + 2 * heads * hd * 2) + reread
    rows = batch * isl * heads

    def samples(seconds: np.ndarray) -> Samples:
        return Samples("attention_prefill", "bf16", flops, nbytes, batch * heads, rows,
                       seconds, heads == 12.0, "synthetic", tiles=(batch, isl, heads, kvh, hd),
                       head_dim=hd, kv_bytes=reread)

    measured = samples(predict(samples(np.ones(n)), B200, true, np.arange(n)))
    _, fitted = fit_family(measured, B200)
    assert fitted.tile_m == 256
    assert not fitted.pack_gqa
    assert fitted.causal_tail == pytest.approx(0.6, abs=0.05)
    assert fitted.softmax_dim == pytest.approx(112.0, rel=0.05)
    assert fitted.kv_reread_share == pytest.approx(0.3, abs=0.05)
    assert evaluate(measured, B200, fitted)["median_ape_after"] < 1.0


def _mla_prefill_shapes(seed: int, n: int) -> tuple[np.ndarray, ...]:
    """``n`` random MLA prefill shapes (DeepSeek-V3's 576-wide latent, 320-wide heads):
    batch, prompt length, heads, causal pairs, FLOPs and bytes without K/V re-reads."""
    rng = np.random.default_rng(seed)
    batch = rng.choice([1.0, 4.0, 16.0, 64.0], n)
    isl = rng.choice([64.0, 1000.0, 4096.0, 16384.0], n)
    heads = rng.choice([1.0, 2.0, 4.0, 16.0, 64.0, 128.0], n)
    pairs = isl * (isl + 1) / 2
    flops = 2 * heads * 320 * pairs * batch
    nbytes = batch * isl * (576 * 2 + heads * 320 * 2)
    return batch, isl, heads, pairs, flops, nbytes


def test_a_prefill_family_without_a_head_dimension_term_fits_its_causal_tail() -> None:
    """MLA's prefill families carry no head-dimension exponent (one layout): their causal
    logits follow the seven base constants directly, and the planted tail and re-read share
    come back."""
    from simulator.validation.kernel_fit import Samples, fit

    true = CAUSAL.model_copy(update={"kv_reread_share": 0.4, "head_dim_exp": 0.0})
    n = 600
    batch, isl, heads, pairs, flops, nbytes = _mla_prefill_shapes(7, n)
    reread = kv_reread_bytes(batch * pairs, heads * 576 * 2)
    nbytes = nbytes + reread
    hd = np.full(n, 128.0)

    def samples(seconds: np.ndarray) -> Samples:
        return Samples("attention_prefill_mla", "bf16", flops, nbytes, batch * heads,
                       batch * isl * heads, seconds, heads == 4.0, "synthetic",
                       tiles=(batch, isl, heads, heads, hd), kv_bytes=reread)

    from simulator.validation.kernel_fit_predict import predict

    measured = samples(predict(samples(np.ones(n)), B200, true, np.arange(n)))
    fitted = fit(measured, B200, 256, causal=True)
    assert fitted.head_dim_exp == 0.0
    assert fitted.causal_tail == pytest.approx(0.6, abs=0.05)
    assert fitted.kv_reread_share == pytest.approx(0.4, abs=0.05)


@pytest.mark.kernels  # deselected by default; `pytest -m kernels` with the extra installed
@pytest.mark.parametrize(("device", "op", "limit", "long_limit"), [
    ("B200", "attention_prefill", 9.0, 6.0),
    ("B200", "attention_prefill_kv_fp8", 13.0, 9.0),
    ("GB200-NVL72", "attention_prefill", 9.0, 7.0),
    ("GB200-NVL72", "attention_prefill_kv_fp8", 13.0, 10.0)])
def test_the_shipped_blackwell_prefill_fits_on_held_out_measured_shapes(
        device: str, op: str, limit: float, long_limit: float) -> None:
    """vLLM 0.24.0's prefill attention on Blackwell (FlashInfer's TensorRT-LLM-gen context
    kernels): held-out median APE of all shapes and of prompts above 8,192 tokens. The fits
    before the causal tail and softmax floor scored 15.9 / 21.5 % (B200, BF16 KV) and
    17.9 / 27.6 % (FP8 KV), 15.2 / 23.8 % and 16.4 / 27.0 % on GB200."""
    from simulator.validation.kernel_fit_predict import predict

    dev, samples, fit = measured_cell("vllm", device, op, "0.24.0")
    held = np.flatnonzero(samples.held_out)
    ape = np.abs(predict(samples, dev, fit, held) / samples.seconds[held] - 1) * 100
    assert samples.tiles is not None
    long = samples.tiles[1][held] > 8192
    assert long.sum() > 200
    assert np.median(ape) <= limit
    assert np.median(ape[long]) <= long_limit


def test_a_family_without_reread_bytes_or_head_dimension_fits_neither_term() -> None:
    """MLA prefill reads its latent once (no per-block re-read) and has one head dimension:
    its fit carries no re-read share and no softmax floor that the step model would ignore."""
    from simulator.validation.kernel_fit import Samples, fit_family
    from simulator.validation.kernel_fit_predict import predict

    n = 500
    batch, isl, heads, _, flops, nbytes = _mla_prefill_shapes(3, n)

    def samples(seconds: np.ndarray) -> Samples:
        return Samples("attention_prefill_mla", "bf16", flops, nbytes, batch * heads,
                       batch * isl * heads, seconds, heads == 4.0, "synthetic",
                       tiles=(batch, isl, heads, heads, np.full(n, 128.0)))

    measured = samples(predict(samples(np.ones(n)), B200, CAUSAL, np.arange(n)))
    _, fitted = fit_family(measured, B200)
    assert fitted.causal_tail > 0
    assert fitted.kv_reread_share == 1.0
    assert fitted.softmax_dim == 0.0
