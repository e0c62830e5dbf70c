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
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
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
