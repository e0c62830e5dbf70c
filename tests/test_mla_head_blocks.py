"""MLA decode in a split-KV kernel's head blocks (``OperatorFit.head_block``): SGLang's Triton
decode kernel on L40S runs a sequence's query heads in blocks of 16, each (sequence, head
block) pair adding per-row work of its own."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.accounting import LinkSet
from simulator.cost.parallel import Parallelism, Precisions
from simulator.hardware import load_device, load_link
from simulator.hardware.operator_fits import WHOLE_CONTEXT, OperatorFit, OperatorFits
from simulator.models import get_model
from simulator.validation.kernel_fit_predict import predict
from simulator.validation.kernel_fit_samples import Samples

L40S = load_device("L40S")
DSV3 = get_model("DeepSeek-V3")
PLAIN = OperatorFit(compute=0.14, half_flops=0.0, memory=0.8, half_bytes=4e6, floor_us=6.0,
                    per_row_ps=19000.0)
BLOCKS = PLAIN.model_copy(update={"head_block": 16, "head_block_rows": 20.0,
                                   "head_block_reread": 0.25})


def _model(fit: OperatorFit, tp: int) -> InstanceCostModel:
    device = L40S.model_copy(update={"operators": {"sglang": OperatorFits(
        source="t", fits={"attention_decode_mla": fit})}})
    return InstanceCostModel(DSV3, device, Parallelism(tp=tp), engine="sglang", fitted=True,
                             precisions=Precisions(kv_cache="bf16"),
                             links=LinkSet(tp=load_link(L40S.scale_up_link)))


def test_each_block_of_sixteen_heads_adds_its_rows() -> None:
    assert BLOCKS.block_rows(16) == 20.0
    assert BLOCKS.block_rows(17) == 40.0
    assert BLOCKS.block_rows(2) == 20.0  # a partial block is a whole block
    assert BLOCKS.block_rows(128) == 160.0
    np.testing.assert_allclose(BLOCKS.block_rows(np.array([1.0, 16.0, 32.0, 64.0])),
                               [20.0, 20.0, 40.0, 80.0])
    assert PLAIN.block_rows(128) == 0.0  # off: nothing
    # Each further block re-reads the latent, a quarter of it from memory.
    assert BLOCKS.block_kv_scale(16) == 1.0
    assert BLOCKS.block_kv_scale(32) == 1.25
    assert BLOCKS.block_kv_scale(128) == 2.75
    np.testing.assert_allclose(BLOCKS.block_kv_scale(np.array([2.0, 64.0])), [1.0, 1.75])
    assert PLAIN.block_kv_scale(128) == 1.0


def test_the_step_model_prices_the_head_blocks_per_sequence() -> None:
    # DeepSeek-V3's 128 heads: 16 per rank at TP 8 (one block), 32 at TP 4 (two).
    rows_only = BLOCKS.model_copy(update={"head_block_reread": 0.0})
    for tp, heads, blocks in ((8, 16, 1), (4, 32, 2)):
        with_blocks, plain = _model(rows_only, tp), _model(PLAIN, tp)
        assert plain._decode_rows == heads
        assert with_blocks._decode_rows == heads + 20.0 * blocks
        step = BatchShape.decode(64, 64 * 2048)
        extra = 64 * 20.0 * blocks * PLAIN.per_row_ps * 1e-12 * DSV3.num_layers
        assert (with_blocks.step(step).seconds - plain.step(step).seconds
                == pytest.approx(extra, rel=1e-6))
        # The latent re-read of each further block.
        rereads = _model(BLOCKS, tp)
        assert rereads._decode_kv_elems == pytest.approx(
            plain._decode_kv_elems * (1.0 + (blocks - 1) * 0.25))


def test_the_fit_prices_a_measured_shape_as_the_step_model_does() -> None:
    """The fit's rows and bytes (kernel_fit_predict) and the step model's agree on 64
    sequences of 2,048 tokens over 16 and 64 heads (DeepSeek-V3 at TP 8 and 2)."""
    seqs, ctx = 64, 64 * 2048
    one = np.array([1.0])
    for tp, heads in ((8, 16), (2, 64)):
        cm = _model(BLOCKS, tp)
        plain = _model(PLAIN, tp)  # the samples' work is the step model's without the blocks
        flops, nbytes, units, quant = plain._decode_attention_op(seqs, ctx, 2048)
        kv = ctx * 576 * 2.0
        samples = Samples("attention_decode_mla", "bf16", flops * one, nbytes * one,
                          units * one, seqs * heads * one, one, np.array([False]), "t",
                          kv_rows=seqs * one, tiles=(seqs * one, ctx * one, one),
                          kv_bytes=kv * one, footprint=one, heads=heads * one)
        fitted = predict(samples, L40S, BLOCKS, np.array([0]))[0]
        flops, nbytes, units, quant = cm._decode_attention_op(seqs, ctx, 2048)
        compute, memory, _ = cm._roofline("attention_decode", flops, nbytes, 1, units,
                                          seqs * cm._decode_rows, quant)
        assert fitted == pytest.approx(max(compute, memory), rel=1e-9)


def test_head_blocks_need_their_count_one_kernel_and_an_mla_decode_family() -> None:
    plain = PLAIN.model_dump()
    with pytest.raises(ValidationError, match=r"head_block_rows 20.0 prices the head blocks"):
        OperatorFit.model_validate({**plain, "head_block_rows": 20.0})
    with pytest.raises(ValidationError, match=r"describe two kernels"):
        OperatorFit.model_validate({**plain, "head_block": 16, "head_tile": 64,
                                    "tile_m": WHOLE_CONTEXT})
    with pytest.raises(ValidationError, match=r"attention_decode\.head_block: only MLA decode"):
        OperatorFits(source="t", fits={"attention_decode": BLOCKS})
    OperatorFits(source="t", fits={"attention_decode_mla": BLOCKS})


# Measured SGLang 0.5.14 MLA decode on L40S, microseconds, 16 query heads per rank (DeepSeek-V3
# at TP 8, a layout held out of the fit), BF16 latent: aiconfigurator-core 0.12.0
# systems/data/l40s/mla/sglang/0.5.14/generation_mla_perf.parquet, (sequences, context tokens
# per sequence). Shapes whose latent is too small to matter or too large for the L2 (the step
# model prices every latent from memory).
MEASURED_L40S_16_HEADS = {(8, 2): 16.0, (64, 2): 55.6, (256, 2): 194.0, (1, 131072): 270.9,
                          (8, 131072): 1695.1, (64, 8192): 875.2, (256, 8192): 3357.0,
                          (16, 65536): 1712.6}


def test_the_shipped_sglang_l40s_mla_decode_fit_runs_blocks_of_sixteen_heads() -> None:
    cm = InstanceCostModel(DSV3, L40S, Parallelism(tp=8), engine="sglang", fitted=True,
                           precisions=Precisions(kv_cache="bf16"),
                           links=LinkSet(tp=load_link(L40S.scale_up_link)))
    fit = cm._fits["attention_decode"]
    assert fit.head_block == 16
    assert fit.head_block_rows > 0
    errors = []
    for (seqs, ctx), measured_us in MEASURED_L40S_16_HEADS.items():
        flops, nbytes, units, quant = cm._decode_attention_op(seqs, seqs * ctx, ctx)
        compute, memory, _ = cm._roofline("attention_decode", flops, nbytes, 1, units,
                                          seqs * cm._decode_rows, quant)
        errors.append(max(compute, memory) * 1e6 / measured_us - 1)
    # With the head blocks: median 3.8 %, 8 sequences of 2 tokens +15 %, one sequence of
    # 131,072 tokens -15 % (the fit before them: median 6.0 %, +26 % and -14 %).
    assert float(np.median(np.abs(errors))) < 0.05, errors
    assert max(np.abs(errors)) < 0.2, errors


def test_the_fit_finds_the_head_blocks_where_the_times_step_with_them() -> None:
    """Synthetic MLA decode shapes whose time steps with every 16 heads, each further block
    re-reading 30 % of the latent from memory: offered the head blocks
    (kernel_fit.HEAD_BLOCK_TABLES), the fit takes them and prices the shapes far closer than
    the per-query-head rows alone."""
    from simulator.cost.roofline import decode_units
    from simulator.validation.kernel_fit import fit_family

    grid = np.array([(b, c, h) for b in (1, 4, 16, 64, 256) for c in (2, 512, 8192)
                     for h in (2, 4, 8, 16, 32, 64, 128)], dtype=float)
    batch, ctx, heads = grid.T
    kv_bytes = batch * ctx * 576 * 2.0
    nbytes = kv_bytes + batch * heads * 384 * 2.0
    read = nbytes + kv_bytes * (np.ceil(heads / 16) - 1) * 0.3  # each further block re-reads
    flops = 2 * heads * (2 * 512 + 64) * ctx * batch
    seconds = (6e-6 + batch * heads * 10e-9 + batch * np.ceil(heads / 16) * 0.4e-6
               + np.maximum(read / 690e9, flops / 50e12))
    ones = np.ones_like(batch)
    held = heads == 16
    samples = Samples("attention_decode_mla", "bf16", flops, nbytes,
                      decode_units(batch, batch * ctx, ones), batch * heads, seconds, held, "t",
                      kv_rows=batch, tiles=(batch, batch * ctx, ones), kv_bytes=kv_bytes,
                      footprint=nbytes * 1e3, heads=heads)
    device = L40S.model_copy(update={"l2_cache_mb": None})
    s0, plain = fit_family(samples, device)
    s1, fitted = fit_family(samples, device, head_blocks=(16,))
    assert (plain.head_block, fitted.head_block) == (0, 16)
    every = np.arange(len(seconds))

    def worst(s: Samples, f: OperatorFit) -> float:
        return float(np.max(np.abs(predict(s, device, f, every) / seconds - 1)))
    assert worst(s1, fitted) < 0.05 < worst(s0, plain)
