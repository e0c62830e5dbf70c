"""Multi-head latent attention (DeepSeek-V2/V3) priced with its own fitted families
(``attention_prefill_mla``, ``attention_decode_mla`` and their FP8-KV kernels), fitted on
NVIDIA AIConfigurator's MLA tables, never with the GQA curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.accounting import LinkSet
from simulator.cost.parallel import Parallelism, Precisions
from simulator.hardware import load_device, load_link
from simulator.hardware.operator_fits import WHOLE_CONTEXT, OperatorFit, OperatorFits
from simulator.models import get_model

H100 = load_device("H100-SXM")
TP8 = LinkSet(tp=load_link(H100.scale_up_link))
DSV3 = get_model("DeepSeek-V3")
GQA = OperatorFit(compute=0.5, half_flops=1e7, memory=0.8, half_bytes=1e7, floor_us=4.0)
MLA = GQA.model_copy(update={"floor_us": 40.0, "per_row_ps": 2000.0, "half_units": 20.0,
                             "row_unit": "kv_head", "tile_m": 256})
MLA_FP8 = MLA.model_copy(update={"floor_us": 60.0})


def _model(name: str, fits: dict[str, OperatorFit], kv: str = "bf16",
           tp: int = 8) -> InstanceCostModel:
    device = H100.model_copy(update={"operators": {"trtllm": OperatorFits(source="t", fits=fits)}})
    return InstanceCostModel(get_model(name), device, Parallelism(tp=tp), engine="trtllm",
                             fitted=True, precisions=Precisions(kv_cache=kv), links=TP8)


def test_an_mla_model_prices_attention_with_the_mla_fits_never_the_gqa_curves() -> None:
    fits = {"attention_decode": GQA, "attention_prefill": GQA, "attention_decode_mla": MLA,
            "attention_prefill_mla": MLA, "attention_decode_mla_kv_fp8": MLA_FP8}
    ds = _model("DeepSeek-V3", fits)
    assert ds._fits["attention_decode"] is MLA
    assert ds._fits["attention_prefill"] is MLA
    # An FP8 KV cache takes its own MLA kernel where fitted, else the BF16-KV MLA one.
    ds8 = _model("DeepSeek-V3", fits, kv="fp8")
    assert ds8._fits["attention_decode"] is MLA_FP8
    assert ds8._fits["attention_prefill"] is MLA
    # GQA models keep the GQA curves; an MLA model without MLA fits keeps the device-wide
    # constants rather than borrowing them.
    assert _model("Llama-3.1-70B", fits)._fits["attention_decode"] is GQA
    bare = _model("DeepSeek-V3", {"attention_decode": GQA, "attention_prefill": GQA})
    assert "attention_decode" not in bare._fits
    assert "attention_prefill" not in bare._fits
    # The fit changes the step.
    step = BatchShape.decode(64, 64 * 4096)
    assert ds.step(step).seconds != bare.step(step).seconds


def test_mla_decode_runs_one_latent_head_per_sequence() -> None:
    ds = _model("DeepSeek-V3", {"attention_decode_mla": MLA})
    assert ds._decode_kvh == 1.0
    assert ds._decode_rows == 1.0  # per-row work per (sequence, latent head)
    seqs, ctx = 32, 32 * 8192
    units, _ = ds._decode_units(seqs, ctx)
    assert units == pytest.approx(max(seqs, ctx / 256))
    series = ds.decode_series(seqs, np.array([ctx, ctx + seqs]))
    assert series.seconds[0] == pytest.approx(ds.step(BatchShape.decode(seqs, ctx)).seconds,
                                              rel=1e-9)


def _tables(folder: Path) -> None:
    """Two MLA tables in AIConfigurator's layout (times are placeholders)."""
    common = {"framework": "TRTLLM", "version": "x", "device": "d", "kernel_source": "default",
              "mla_dtype": "bfloat16", "tp_size": 8}
    ctx = [dict(common, op_name="mla_context", kv_cache_dtype=kv, num_heads=16, batch_size=4,
                isl=2048, step=0, latency=0.3) for kv in ("bfloat16", "fp8")]
    gen = [dict(common, op_name="mla_generation", kv_cache_dtype=kv, num_heads=16,
                batch_size=64, isl=1, step=4095, latency=0.05) for kv in ("bfloat16", "fp8")]
    pd.DataFrame(ctx).to_parquet(folder / "context_mla_perf.parquet")
    pd.DataFrame(gen).to_parquet(folder / "generation_mla_perf.parquet")


def test_mla_samples_hold_the_work_the_step_model_prices(tmp_path: Path) -> None:
    """The fit sees each measured shape with the FLOPs, bytes, units and per-row work the
    step model gives DeepSeek-V3 at TP 8 (16 query heads per rank), so the fitted curve
    prices serving steps as it priced the tables."""
    from simulator.validation.kernel_fit_samples import mla_samples

    _tables(tmp_path)
    samples = {s.op: s for s in mla_samples(tmp_path)}
    assert sorted(samples) == ["attention_decode_mla", "attention_decode_mla_kv_fp8",
                               "attention_prefill_mla", "attention_prefill_mla_kv_fp8"]
    ds = _model("DeepSeek-V3", {"attention_decode_mla": MLA})
    dec = samples["attention_decode_mla"]
    flops, nbytes, units, _ = ds._decode_attention_op(64, 64 * 4096)
    assert (dec.flops[0], dec.nbytes[0]) == pytest.approx((flops, nbytes), rel=1e-12)
    assert dec.tiles is not None
    assert dec.kv_rows is not None
    assert (dec.tiles[0][0], dec.tiles[1][0], dec.tiles[2][0]) == (64, 64 * 4096, 1)
    assert dec.kv_rows[0] == 64 * ds._decode_rows
    assert dec.rows[0] == 64 * 16
    assert dec.heads is not None  # for OperatorFit.head_tile
    assert dec.heads[0] == 16
    # The FP8 KV cache halves the latent bytes.
    dec8 = samples["attention_decode_mla_kv_fp8"]
    assert dec.nbytes[0] - dec8.nbytes[0] == pytest.approx(64 * 4096 * 576)
    pre = samples["attention_prefill_mla"]
    shape = BatchShape(prefill_tokens=4 * 2048, prefill_seqs=4,
                       prefill_attn_pairs=4 * 2048 * 2049 / 2, prefill_kv_tokens=4 * 2048,
                       prefill_max_tokens=2048)
    flops, nbytes, units, _ = ds._prefill_attention_op(shape)
    assert (pre.flops[0], pre.nbytes[0], pre.units[0]) == pytest.approx((flops, nbytes, units),
                                                                       rel=1e-12)
    assert pre.rows[0] == 4 * 2048 * ds._q_heads


# Measured per-layer MLA, microseconds: aiconfigurator-core 0.12.0
# systems/data/h100_sxm/mla/trtllm/1.3.0rc20/{generation,context}_mla_perf.parquet, BF16 KV,
# 16 query heads per rank (DeepSeek-V3 at TP 8; a layout held out of the fit). Decode:
# (batch, context tokens per sequence); prefill: (batch, prompt tokens). The device-wide
# roofline priced these tables 64-79 % off (median).
MEASURED_DECODE = {(1, 8192): 20.2, (64, 1024): 46.7, (16, 65536): 407.1, (256, 8192): 813.1,
                   (1024, 128): 97.6}
MEASURED_PREFILL = {(1, 16384): 2358.8, (4, 3072): 403.9, (64, 512): 378.4, (16, 1536): 481.1}


def test_the_shipped_trtllm_mla_fits_price_h100_deepseek_v3_at_tp8() -> None:
    cm = InstanceCostModel(DSV3, H100, Parallelism(tp=8), engine="trtllm", fitted=True,
                           links=TP8)
    assert "attention_decode" in cm._fits
    assert "attention_prefill" in cm._fits
    errors = []
    for (seqs, ctx), measured_us in MEASURED_DECODE.items():
        flops, nbytes, units, quant = cm._decode_attention_op(seqs, seqs * ctx)
        compute, memory, _ = cm._roofline("attention_decode", flops, nbytes, 1, units,
                                          seqs * cm._decode_rows, quant)
        errors.append(max(compute, memory) * 1e6 / measured_us - 1)
    for (seqs, isl), measured_us in MEASURED_PREFILL.items():
        shape = BatchShape(prefill_tokens=seqs * isl, prefill_seqs=seqs,
                           prefill_attn_pairs=seqs * isl * (isl + 1) / 2,
                           prefill_kv_tokens=seqs * isl, prefill_max_tokens=isl)
        flops, nbytes, units, quant = cm._prefill_attention_op(shape)
        compute, memory, _ = cm._roofline("attention_prefill", flops, nbytes, 1, units,
                                          seqs * isl * cm._q_heads, quant)
        errors.append(max(compute, memory) * 1e6 / measured_us - 1)
    assert float(np.median(np.abs(errors))) < 0.15, errors
    assert max(np.abs(errors)) < 0.35, errors


def test_mla_verify_chunks_run_the_decode_kernel() -> None:
    """A speculative verify (MTP: the last token and one draft per sequence) of an MLA model
    attends over the latent as a decode step does; a prompt without a cached context still
    runs the prefill kernel."""
    from simulator.cost.speculative import verify_batch

    fits = {"attention_decode_mla": MLA, "attention_prefill_mla": MLA_FP8}
    ds = _model("DeepSeek-V3", fits)
    seqs, ctx = 64, 64 * 2000
    verify = ds.breakdown(verify_batch(ctx, seqs, 1))
    decode = ds.breakdown(BatchShape.decode(seqs, ctx))
    assert verify.get("attention_prefill", 0.0) == 0.0
    # Two query tokens per sequence over the same latent: more than one decode step's
    # attention, less than two.
    assert decode["attention_decode"] < verify["attention_decode"] < 2 * decode["attention_decode"]
    prompt = ds.breakdown(BatchShape.prefill(12))
    assert prompt["attention_prefill"] > 0.0
    assert prompt.get("attention_decode", 0.0) == 0.0
    # A GQA model's verify stays a prefill chunk.
    llama = _model("Llama-3.1-70B", {"attention_prefill": GQA, "attention_decode": GQA})
    assert llama.breakdown(verify_batch(ctx, seqs, 1))["attention_prefill"] > 0.0


# ----- a kernel without split-KV: the heads as padded query-row tiles (OperatorFit.head_tile)
NO_SPLIT = MLA.model_copy(update={"tile_m": WHOLE_CONTEXT, "head_tile": 64, "half_units": 0.0,
                                  "row_unit": "query_head"})


def test_head_tiles_pad_the_heads_and_give_a_block_per_tile() -> None:
    assert NO_SPLIT.head_blocks(16) == (1.0, 4.0)
    assert NO_SPLIT.head_blocks(64) == (1.0, 1.0)
    assert NO_SPLIT.head_blocks(100) == (2.0, pytest.approx(1.28))
    assert NO_SPLIT.head_blocks(128) == (2.0, 1.0)
    assert MLA.head_blocks(16) == (1.0, 1.0)  # no head tile: one latent-head block
    heads = np.array([1.0, 16.0, 100.0, 128.0])
    tiles, pad = NO_SPLIT.head_blocks(heads)
    for j, h in enumerate(heads):
        assert (tiles[j], pad[j]) == pytest.approx(NO_SPLIT.head_blocks(float(h)))


def test_a_kernel_without_split_kv_takes_its_longest_sequence_on_one_block() -> None:
    """With the whole context on one block, one long sequence leaves all SMs but one idle:
    its FLOPs are priced at one SM's share. Sixteen such sequences take the same time, and
    so do sixteen of which one is that long (the kernel waits for its longest block), while
    the work of many more sequences spreads over the SMs. 128 heads (two 64-row tiles per
    sequence) run twice the blocks of 16."""
    sms = H100.sm_count
    assert sms is not None
    ds = _model("DeepSeek-V3", {"attention_decode_mla": NO_SPLIT})
    assert ds.decode_needs_longest
    assert ds._decode_kvh == 1.0  # 16 heads: one tile
    ctx = 131072
    flops, _, units, quant = ds._decode_attention_op(1, ctx)
    assert units == 1.0
    assert quant == sms
    # 16 heads padded to 64 rows: four times the heads' FLOPs.
    assert flops == pytest.approx(4 * 2 * 16 * (2 * 512 + 64) * ctx)

    def attention(shape: BatchShape) -> float:
        return ds.breakdown(shape)["attention_decode"]

    one = attention(BatchShape.decode(1, ctx, ctx))
    assert attention(BatchShape.decode(16, 16 * ctx, ctx)) == pytest.approx(one, rel=0.02)
    skewed = BatchShape.build(decode_contexts=[ctx] + [1000] * 15)
    assert skewed.decode_max_ctx == ctx
    assert attention(skewed) == pytest.approx(one, rel=0.02)
    # Without the longest context the shape is bounded by the longest it can hold.
    assert attention(BatchShape.decode(16, 16 * ctx)) > 10 * one
    # Up to one sequence per SM the kernel takes its longest block; beyond, its work
    # spreads over the SMs: the FLOPs multiplier falls as SMs / sequences, to 1.
    for seqs, multiplier in ((1, sms), (sms // 2, 2.0), (sms, 1.0), (4 * sms, 1.0)):
        assert ds._decode_units(seqs, seqs * 8192, 8192)[1] == pytest.approx(multiplier)
    tp1 = _model("DeepSeek-V3", {"attention_decode_mla": NO_SPLIT}, tp=1)
    assert tp1._decode_kvh == 2.0
    assert tp1._decode_units(8, 8 * ctx)[0] == 16.0
    # The fast path's series prices the same steps as single steps (to rounding: the rest
    # of a series step is summed in another order, InstanceCostModel.decode_series).
    sums, longest = np.array([16 * 8000, 16 * 8000 + 16]), np.array([9000, 9001])
    series = ds.decode_series(16, sums, longest)
    for j in range(2):
        step = ds.step(BatchShape.decode(16, int(sums[j]), int(longest[j])))
        assert series.seconds[j] == pytest.approx(step.seconds, rel=1e-12)


def test_mla_verify_chunks_pad_their_query_rows_per_sequence() -> None:
    """An MTP verify of 2 tokens per sequence at 16 heads has 32 query rows per sequence: one
    64-row block, half of it padding."""
    from simulator.cost.speculative import verify_batch

    ds = _model("DeepSeek-V3", {"attention_decode_mla": NO_SPLIT})
    seqs, ctx = 64, 64 * 2000
    b = verify_batch(ctx, seqs, 1)
    flops, _, units, _, _ = ds._mla_chunks_on_decode_op(b)
    assert flops == pytest.approx(ds._decode_per_ctx * b.prefill_attn_pairs * 2.0)
    assert units == seqs


# Measured per-layer MLA decode, milliseconds: aiconfigurator-core 0.12.0
# systems/data/a100_sxm/mla/trtllm/1.0.0/generation_mla_perf.parquet, BF16 KV, by query heads
# per rank (16: DeepSeek-V3 at TP 8; 128: TP 1) and (batch, context tokens per sequence =
# isl + step). One sequence takes the same time with 16 or 128 heads; at 1,024 sequences
# 128 heads take twice as long. The split-KV fit priced these tables 20 % off (median).
MEASURED_A100_MLA_DECODE = {
    16: {(1, 131072): 15.519, (16, 131072): 16.101, (64, 16384): 2.727, (1024, 16384): 26.057,
         (256, 1024): 0.479},
    128: {(1, 131072): 15.539, (16, 131072): 15.744, (1024, 16384): 50.282, (64, 16384): 4.615}}


def test_the_shipped_trtllm_a100_mla_decode_fit_runs_a_block_per_64_heads() -> None:
    a100 = load_device("A100-SXM-80GB")
    errors = []
    for heads, points in MEASURED_A100_MLA_DECODE.items():
        cm = InstanceCostModel(DSV3, a100, Parallelism(tp=128 // heads), engine="trtllm",
                               fitted=True, precisions=Precisions(kv_cache="bf16"),
                               links=LinkSet(tp=load_link(a100.scale_up_link)))
        fit = cm._fits["attention_decode"]
        assert (fit.tile_m, fit.head_tile) == (WHOLE_CONTEXT, 64)
        for (seqs, ctx), measured_ms in points.items():
            flops, nbytes, units, quant = cm._decode_attention_op(seqs, seqs * ctx, ctx)
            compute, memory, _ = cm._roofline("attention_decode", flops, nbytes, 1, units,
                                              seqs * cm._decode_rows, quant)
            errors.append(max(compute, memory) * 1e3 / measured_ms - 1)
    # Fitted on shapes that include these: median 1.8 %, worst 7.7 % (64 sequences, TP 1).
    assert float(np.median(np.abs(errors))) < 0.05, errors
    assert max(np.abs(errors)) < 0.12, errors
