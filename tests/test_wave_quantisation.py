"""Tile and wave quantisation of the fitted per-operator roofline (OperatorFit.tile_m)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.parallel import Precisions
from simulator.cost.roofline import (
    decode_tiles,
    dispatch_tiles,
    gemm_tiles,
    quantisation,
    tile_m_for,
    wave_factor,
)
from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
from simulator.hardware.profiles import DeviceProfile
from simulator.models import get_model
from tests.kernel_cells import measured_cell

H100 = load_device("H100-SXM")
SMS = 132
TILED = OperatorFit(compute=0.7, half_flops=1e8, memory=0.8, half_bytes=1e6, half_units=4.0,
                    floor_us=3.0, per_row_ps=1.0, tile_m=128, tile_n=128)


def test_one_tile_past_a_full_wave_costs_a_second_wave() -> None:
    whole, exact, split = gemm_tiles(1, 128, 128 * 132, 4096, 128, 128)
    assert whole == 132
    assert wave_factor(whole, exact, SMS, split) == pytest.approx(1.0)
    whole, exact, split = gemm_tiles(1, 128, 128 * 133, 4096, 128, 128)
    assert whole == 133
    assert wave_factor(whole, exact, SMS, split) == pytest.approx(2 * 132 / 133)


def test_small_batches_select_small_tiles_and_pay_their_padding() -> None:
    assert tile_m_for(1, 128) == 16
    assert tile_m_for(20, 128) == 32
    assert tile_m_for(5000, 128) == 128
    # m = 20 in a 32-row tile: 12 padding rows are computed too (one wave of 8 tiles).
    whole, exact, split = gemm_tiles(1, 20, 1024, 4096, 128, 128)
    assert whole == 8
    assert wave_factor(whole, exact, SMS, split) == pytest.approx(132 / (8 * 20 / 32))


def test_split_k_fills_the_idle_sms_of_a_small_gemm() -> None:
    whole, exact, split = gemm_tiles(1, 128, 10 * 128, 8192, 128, 128, split_k=True)
    assert whole == 10
    # 13 k-slices per tile: 130 blocks in one wave, 2 SMs idle.
    assert wave_factor(whole, exact, SMS, split) == pytest.approx(132 / 130)
    no_split = gemm_tiles(1, 128, 10 * 128, 8192, 128, 128)
    assert wave_factor(*no_split[:2], SMS) == pytest.approx(13.2)


def test_each_tile_pays_its_fixed_work_once_per_k_slice() -> None:
    # 10 tiles of depth 8192 with 512 of fixed work each; split-K cuts each into 13 slices,
    # and every slice pays the fixed work.
    whole, exact, split = gemm_tiles(1, 128, 10 * 128, 8192, 128, 128, split_k=True)
    assert wave_factor(whole, exact, SMS, split, 512 / 8192) == pytest.approx(
        132 / 130 * (1 + 13 * 512 / 8192))
    fit = TILED.model_copy(update={"tile_k0": 512})
    assert quantisation(fit, (1, 128, 132 * 128, 4096), SMS) == pytest.approx(1 + 512 / 4096)


def test_decode_blocks_are_split_kv_partitions() -> None:
    whole, exact = decode_tiles(2, 2 * 1000, 8, 512)
    assert whole == 8 * 4
    assert exact == pytest.approx(8 * 2000 / 512)
    whole, _ = decode_tiles(64, 64 * 100, 8, 512)
    assert whole == 8 * 64  # short contexts: one block per sequence and KV head


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 4096), st.sampled_from([32, 512, 4096, 65536]),
       st.sampled_from([32, 1024, 8192]), st.sampled_from([64, 128, 256]),
       st.sampled_from([64, 128, 256]), st.booleans(),
       st.sampled_from(["", "cutlass_sm90_fp8", "sgl_kernel_sm90_fp8"]))
def test_gemm_time_never_decreases_with_m(m: int, dm: int, n: int, k: int, tm: int, tn: int,
                                          split: bool, dispatch: str) -> None:
    # GEMMs are fitted without the fill term (kernel_fit): their fixed weight bytes times
    # (units + half_units) / units would fall as rows are added.
    fit = TILED.model_copy(update={"tile_m": tm, "tile_n": tn, "split_k": split,
                                   "half_units": 0.0, "tile_k0": 512,
                                   "tile_dispatch": dispatch})
    peak, bw = H100.peak_flops("bf16"), H100.memory_bandwidth

    def seconds(rows: int) -> float:
        q = quantisation(fit, (1.0, rows, n, k), SMS)
        flops, nbytes = 2.0 * rows * n * k, 2.0 * (rows * k + n * k + rows * n)
        return float(fit.seconds(peak, bw, flops, nbytes, rows, rows * k, q))

    assert seconds(m + dm) >= seconds(m) * (1 - 1e-12)


def _tiled_h100() -> DeviceProfile:
    # Tiled fits carry no fill term but in decode attention (kernel_fit.fit).
    fits = {op: TILED.model_copy(update={"half_units": 0.0})
            for op in ("gemm", "attention_prefill", "moe")}
    fits["attention_decode"] = TILED.model_copy(update={"tile_m": 256, "tile_n": 0})
    return H100.model_copy(update={"operators": {"vllm": OperatorFits(source="t", fits=fits)}})


def _assert_never_faster_when_grown(cm: InstanceCostModel, new: int, ctx: int, d_ctx: int,
                                    more_new: int, more_ctx: int) -> None:
    """More prefill tokens, more decode context or one more decode never price a step lower."""
    small = BatchShape.build([(new, ctx, True)], [d_ctx])
    big = BatchShape.build([(new + more_new, ctx, True)], [d_ctx + more_ctx])
    more_seqs = BatchShape.build([(new, ctx, True)], [d_ctx, d_ctx])
    t0 = cm.step(small).seconds
    assert cm.step(big).seconds >= t0 * (1 - 1e-12)
    assert cm.step(more_seqs).seconds >= t0 * (1 - 1e-12)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["Llama-3.1-8B", "Mixtral-8x7B"]), st.integers(0, 512),
       st.integers(0, 256), st.integers(1, 2048), st.integers(0, 300), st.integers(0, 4096))
def test_a_tiled_step_never_decreases_as_its_batch_grows(model: str, new: int, ctx: int,
                                                          d_ctx: int, more_new: int,
                                                          more_ctx: int) -> None:
    cm = InstanceCostModel(get_model(model), _tiled_h100(), engine="vllm", fitted=True)
    assert cm._fits["gemm_ffn"].tile_m or cm._fits["moe"].tile_m
    _assert_never_faster_when_grown(cm, new, ctx, d_ctx, more_new, more_ctx)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["Llama-2-7B", "Llama-3.1-405B", "Llama-3.1-8B"]),
       st.sampled_from([8, 32]), st.integers(0, 512), st.integers(0, 256), st.integers(1, 2048),
       st.integers(0, 300), st.integers(0, 4096), st.sampled_from([0.0, 0.6, 1.0]),
       st.sampled_from([(1.0, 0.0), (1.3, 0.05), (0.6, 1.0)]))
def test_a_step_past_the_decode_group_limit_never_decreases_as_its_batch_grows(
        model: str, limit: int, new: int, ctx: int, d_ctx: int, more_new: int,
        more_ctx: int, overlap: float, kv_rows: tuple[float, float]) -> None:
    # Llama-2-7B (MHA) never runs the grouped kernel, Llama-3.1-405B (16 per KV head) runs
    # it under limit 32 and not under 8: one block per query head, KV re-read per head;
    # with and without per-row work hidden under the KV stream (row_overlap).
    device = _tiled_h100()
    assert device.operators is not None
    fits = dict(device.operators["vllm"].fits)
    fits["attention_decode"] = fits["attention_decode"].model_copy(update={
        "group_limit": limit, "group_reread": 0.4, "group_row_share": 0.3,
        "row_unit": "kv_head", "row_overlap": overlap, "group_memory": kv_rows[0],
        "group_q_rows": kv_rows[1]})
    grouped = device.model_copy(update={"operators": {"vllm": OperatorFits(source="t",
                                                                           fits=fits)}})
    cm = InstanceCostModel(get_model(model), grouped, engine="vllm", fitted=True)
    _assert_never_faster_when_grown(cm, new, ctx, d_ctx, more_new, more_ctx)


def test_tiles_change_the_step_and_decode_series_agrees() -> None:
    m8 = get_model("Llama-3.1-8B")
    tiled = InstanceCostModel(m8, _tiled_h100(), engine="vllm", fitted=True)
    flat = H100.model_copy(update={"operators": {"vllm": OperatorFits(source="t", fits={
        op: TILED.model_copy(update={"tile_m": 0, "tile_n": 0})
        for op in ("gemm", "attention_prefill", "attention_decode", "moe")})}})
    plain = InstanceCostModel(m8, flat, engine="vllm", fitted=True)
    prefill = BatchShape.prefill(3000)
    assert tiled.step(prefill).seconds > plain.step(prefill).seconds
    ctx = np.array([1000, 5000, 100_000])
    series = tiled.decode_series(48, ctx)
    for j, c in enumerate(ctx):
        assert series.seconds[j] == pytest.approx(
            tiled.step(BatchShape.decode(48, int(c))).seconds, rel=1e-9)


def test_the_hopper_fp8_dispatches_pick_the_engines_tile_per_batch_bucket() -> None:
    # vLLM's sm90 FP8 scaled-MM configs: 64x64 up to 64 rows, 64x128 up to 128, then 128x128.
    assert [dispatch_tiles(m, "cutlass_sm90_fp8") for m in (1, 64, 65, 128, 129, 5000)] == [
        (64.0, 64.0), (64.0, 64.0), (64.0, 128.0), (64.0, 128.0), (128.0, 128.0),
        (128.0, 128.0)]
    arrays = dispatch_tiles(np.array([1.0, 65.0, 129.0]), "cutlass_sm90_fp8")
    assert [a.tolist() for a in arrays] == [[64.0, 64.0, 128.0], [64.0, 128.0, 128.0]]
    # SGLang's sgl-kernel: 64x64 up to 256 rows, 128x128 above.
    assert [dispatch_tiles(m, "sgl_kernel_sm90_fp8") for m in (1, 256, 257)] == [
        (64.0, 64.0), (64.0, 64.0), (128.0, 128.0)]
    # 8192 x 8192 at 129 rows: two 128-row tiles x 64 columns of tiles, not a 256-row tile.
    fit = TILED.model_copy(update={"tile_m": 256, "tile_n": 64, "tile_dispatch": "cutlass_sm90_fp8"})
    assert gemm_tiles(1, 129, 8192, 8192, 256, 64, dispatch="cutlass_sm90_fp8")[0] == 2 * 64
    assert quantisation(fit, (1.0, 129, 8192, 8192), SMS) == pytest.approx(
        SMS / (129 / 128 * 64))


def test_kernel_fit_picks_the_dispatch_that_made_the_data() -> None:
    """Synthetic FP8 GEMM timings from the Hopper dispatch table: the fit, which also tries
    every single tile size, keeps the dispatch on its training shapes."""
    from simulator.validation.kernel_fit import Samples, evaluate, fit_family

    true = TILED.model_copy(update={"half_units": 0.0, "tile_k0": 512,
                                    "tile_dispatch": "cutlass_sm90_fp8"})
    rng = np.random.default_rng(3)
    m = np.exp2(rng.integers(0, 13, 900)) + rng.integers(0, 2, 900)
    n = rng.choice([1024.0, 2560.0, 4096.0, 6144.0, 14336.0], 900)
    k = rng.choice([1024.0, 4096.0, 8192.0], 900)
    flops, nbytes = 2 * m * n * k, m * k + k * n + m * n * 2
    q = quantisation(true, (np.ones_like(m), m, n, k), SMS)
    seconds = true.seconds(H100.peak_flops("fp8"), H100.memory_bandwidth, flops, nbytes, m,
                           m * k, q)
    samples = Samples("gemm_fp8", "fp8", flops, nbytes, m, m * k, seconds, n == 2560.0,
                      "synthetic", tiles=(np.ones_like(m), m, n, k))
    _, fitted = fit_family(samples, H100, ("cutlass_sm90_fp8", "sgl_kernel_sm90_fp8"))
    assert (fitted.tile_dispatch, fitted.tile_k0) == ("cutlass_sm90_fp8", 512)
    assert evaluate(samples, H100, fitted)["median_ape_after"] < 1.0


def test_nvfp4_dispatch_keeps_128_row_tiles_at_every_batch() -> None:
    """FlashInfer's CUTLASS NVFP4 GEMM (SGLang on Blackwell) builds only 128-row CTA tiles: a
    GEMM of 1 to 128 rows costs one 128-row tile (the tables are flat there, then step at
    129 and 257 rows), where the plain tiling shrinks the tile to the next power of two."""
    assert [dispatch_tiles(m, "flashinfer_cutlass_sm100_nvfp4") for m in (1, 33, 128, 129, 8192)] \
        == [(128.0, 128.0)] * 5
    fp4 = TILED.model_copy(update={"tile_dispatch": "flashinfer_cutlass_sm100_nvfp4"})
    # 4096 x 4096 (32 column tiles, one wave on 148 SMs): 16 rows priced as a whole
    # 128-row tile, 8x the FLOPs of their exact share; 129 rows take two row tiles.
    assert quantisation(fp4, (1.0, 16, 4096, 4096), 148) == pytest.approx(148 / (16 / 128 * 32))
    assert quantisation(TILED, (1.0, 16, 4096, 4096), 148) == pytest.approx(148 / 32)
    assert gemm_tiles(1, 129, 4096, 4096, 128, 128,
                      dispatch="flashinfer_cutlass_sm100_nvfp4")[0] == 2 * 32
    # The FLOPs it prices (FLOPs x multiplier) are those of one 128-row tile up to 128 rows.
    priced = [2 * m * 4096 * 4096 * quantisation(fp4, (1.0, m, 4096, 4096), 148)
              for m in (1, 16, 64, 128)]
    assert priced == pytest.approx([priced[-1]] * 4)
    with pytest.raises(ValueError, match="tile_dispatch"):
        OperatorFit.model_validate(TILED.model_dump() | {"tile_dispatch": "flashinfer_sm100"})


def test_a_tiled_fit_needs_the_devices_sm_count() -> None:
    fits = OperatorFits(source="t", fits={"gemm": TILED})
    data = H100.model_dump() | {"sm_count": None, "operators": {"vllm": fits.model_dump()}}
    with pytest.raises(ValueError, match="sm_count"):
        DeviceProfile.model_validate(data)


def test_kernel_fit_picks_the_tiles_that_made_the_data() -> None:
    """Synthetic GEMM timings from a 128 x 64 tiled fit with 256 of per-tile fixed work: the
    fit chooses those from its training shapes and predicts the held-out weight shapes."""
    from simulator.validation.kernel_fit import Samples, evaluate, fit_family

    true = TILED.model_copy(update={"tile_n": 64, "half_units": 0.0, "tile_k0": 256})
    rng = np.random.default_rng(2)
    m = rng.integers(1, 8192, 900).astype(float)
    n = rng.choice([1024.0, 2560.0, 4096.0, 6144.0, 14336.0], 900)
    k = rng.choice([1024.0, 4096.0, 8192.0], 900)
    flops, nbytes = 2 * m * n * k, (m * k + k * n) * 2 + m * n * 2
    q = quantisation(true, (np.ones_like(m), m, n, k), SMS)
    seconds = true.seconds(H100.peak_flops("bf16"), H100.memory_bandwidth, flops, nbytes, m,
                           m * k, q)
    samples = Samples("gemm", "bf16", flops, nbytes, m, m * k, seconds, n == 2560.0,
                      "synthetic", tiles=(np.ones_like(m), m, n, k))
    _, fitted = fit_family(samples, H100)
    assert (fitted.tile_m, fitted.tile_n, fitted.tile_k0) == (128, 64, 256)
    assert evaluate(samples, H100, fitted)["median_ape_after"] < 1.0


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["H100-SXM", "H200-SXM", "A100-SXM-80GB", "B200", "L40S"]),
       st.sampled_from(["vllm", "trtllm", "sglang"]),
       st.sampled_from(["Llama-3.1-8B", "Mixtral-8x7B", "Llama-2-7B"]), st.integers(0, 512),
       st.integers(0, 256), st.integers(1, 2048), st.integers(0, 300), st.integers(0, 4096),
       st.sampled_from(["bf16", "fp8"]))
def test_the_shipped_fits_never_price_a_larger_batch_faster(
        device: str, engine: str, model: str, new: int, ctx: int, d_ctx: int, more_new: int,
        more_ctx: int, precision: str) -> None:
    # FP8 weights and activations price the gemm_fp8 and moe_fp8 fits (where the device has
    # them), BF16 the gemm and moe fits.
    cm = InstanceCostModel(get_model(model), load_device(device), engine=engine, fitted=True,
                           precisions=Precisions(weights=precision, activations=precision))
    _assert_never_faster_when_grown(cm, new, ctx, d_ctx, more_new, more_ctx)


@settings(max_examples=200, deadline=None)
@given(st.floats(0.5, 1e5), st.floats(1.0, 7e4), st.floats(16.0, 3e4), st.booleans(),
       st.sampled_from([0, 256, 1024]),
       st.sampled_from(["", "cutlass_sm90_fp8", "sgl_kernel_sm90_fp8"]))
def test_scalar_and_array_tile_counts_agree(m: float, n: float, k: float, split: bool,
                                           k0: int, dispatch: str) -> None:
    """One step is priced on floats (math), a decode series and the fit on arrays (numpy)."""
    fit = TILED.model_copy(update={"split_k": split, "tile_k0": k0, "tile_dispatch": dispatch})
    scalar = quantisation(fit, (3.0, m, n, k), SMS)
    array = quantisation(fit, (np.array([3.0]), np.array([m]), np.array([n]), np.array([k])), SMS)
    assert isinstance(scalar, float)
    assert scalar == pytest.approx(float(array[0]), rel=1e-12)
    decode = TILED.model_copy(update={"tile_m": 256, "tile_n": 0})
    one = quantisation(decode, (7.0, m * 7, 8.0), SMS, decode=True)
    many = quantisation(decode, (7.0, np.array([m * 7]), 8.0), SMS, decode=True)
    assert one == pytest.approx(float(many[0]), rel=1e-12)


def _tiled_engines() -> list[tuple[str, str]]:
    from simulator.hardware.registry import device_names

    pairs = []
    for name in device_names():
        device = load_device(name)
        for engine, fits in (device.operators or {}).items():
            if any(f.tile_m for f in fits.fits.values()):
                pairs.append((name, engine))
    return pairs


TILED_ENGINES = _tiled_engines()


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TILED_ENGINES), st.sampled_from(["Llama-3.1-8B", "Mixtral-8x7B"]),
       st.lists(st.integers(1, 4096), min_size=1, max_size=3), st.integers(1, 4096))
def test_another_prompt_never_makes_a_shipped_prefill_step_cheaper(
        pair: tuple[str, str], model: str, prompts: list[int], added: int) -> None:
    device, engine = pair
    cm = InstanceCostModel(get_model(model), load_device(device), engine=engine, fitted=True)
    before = BatchShape.build([(n, 0, True) for n in prompts])
    after = BatchShape.build([(n, 0, True) for n in [*prompts, added]])
    assert cm.step(after).seconds >= cm.step(before).seconds * (1 - 1e-12)


def test_a_short_prompt_next_to_a_longer_one_costs_more_than_the_longer_alone() -> None:
    # Prompts of 179 and 8 tokens prefilled together on H100-SXM at TP2 (vLLM fits): the
    # prefill-attention tiles of their mean length (93.5 rows) priced the pair at 5.256 ms,
    # below the 179-token prompt alone.
    from simulator.runner import Simulation
    from tests.conftest import make_scenario

    scenario = make_scenario(**{"cluster.pools": [{
        "name": "prefill", "role": "prefill", "device": "H100-SXM", "instances": 1,
        "parallelism": {"tp": 2}}, {"name": "decode", "role": "decode", "device": "H100-SXM",
                                     "instances": 1}]})
    cm = Simulation(scenario).plan.instances[0].cost
    assert cm.parallelism.tp == 2
    assert cm.fitted
    alone = cm.step(BatchShape.prefill(179)).seconds
    both = cm.step(BatchShape.build([(179, 0, True), (8, 0, True)])).seconds
    assert both >= alone


def test_full_waves_keep_the_longest_chunk_grid_of_a_mixed_prefill() -> None:
    # H100-SXM with SGLang's fits (GQA packed, 256-row tiles): prompts of 1, 704 and 1 token
    # launch 3 x 8 KV heads x 11 query blocks = 264 blocks, two full waves on 132 SMs, so the
    # tile/wave multiplier is exactly 1; the grid of the longest chunk was then dropped and the
    # three prompts were priced at 16.52 ms, below the 16.82 ms of the first two alone.
    cm = InstanceCostModel(get_model("Llama-3.1-8B"), load_device("H100-SXM"), engine="sglang",
                           fitted=True)
    two = cm.step(BatchShape.build([(1, 0, True), (704, 0, True)])).seconds
    three = cm.step(BatchShape.build([(1, 0, True), (704, 0, True), (1, 0, True)])).seconds
    assert three >= two


L40S_SMS = 142
CUBLAS = TILED.model_copy(update={"half_units": 0.0, "split_k": True, "tile_k0": 128,
                                  "tile_dispatch": "cublas_fastest", "tile_load_rows": 56.0})


def test_cublas_candidates_price_the_least_work_of_their_tiles() -> None:
    """cuBLAS picks a kernel per GEMM shape among several thread-block tiles
    (``tile_dispatch`` ``cublas_fastest``): a small GEMM over many rows takes 64 x 64 tiles,
    a large one 128 x 256, each tile's FLOPs weighted by its operand loads."""
    from simulator.cost.roofline import TILE_CANDIDATES, candidate_factor

    assert TILE_CANDIDATES["cublas_fastest"] == ((64, 64), (128, 128), (128, 256))
    assert candidate_factor(64, 64, 56.0) == pytest.approx(56.0 / 32.0)
    assert candidate_factor(128, 256, 56.0) == 1.0  # 128 x 256 / 384 = 85 rows > 56

    def single(tm: int, tn: int, shape: tuple[float, float, float, float]) -> float:
        plain = CUBLAS.model_copy(update={"tile_m": tm, "tile_n": tn, "tile_dispatch": "",
                                          "tile_load_rows": 0.0})
        return float(quantisation(plain, shape, L40S_SMS)) * candidate_factor(tm, tn, 56.0)

    small = (1.0, 4096.0, 32.0, 32.0)  # 32 x 32 weights at 4,096 rows
    assert quantisation(CUBLAS, small, L40S_SMS) == pytest.approx(single(64, 64, small))
    assert single(64, 64, small) < single(128, 256, small) / 2
    large = (1.0, 8192.0, 8192.0, 8192.0)  # 128 x 128: 29 waves of 142 tiles, 1.02
    assert quantisation(CUBLAS, large, L40S_SMS) == pytest.approx(single(128, 128, large))
    assert single(128, 128, large) < single(128, 256, large) < single(64, 64, large)
    # The one-tile fit of the same constants prices the small GEMM's padding at 128 x 128.
    assert quantisation(CUBLAS.model_copy(update={"tile_dispatch": "", "tile_load_rows": 0.0}),
                        small, L40S_SMS) > 2 * quantisation(CUBLAS, small, L40S_SMS)


def test_tile_load_rows_need_the_candidate_tiles() -> None:
    with pytest.raises(ValueError, match="tile_load_rows"):
        OperatorFit.model_validate(TILED.model_dump() | {"tile_load_rows": 56.0})
    with pytest.raises(ValueError, match="tile_load_rows"):
        OperatorFit.model_validate(TILED.model_dump() | {"tile_load_rows": -1.0,
                                                         "tile_dispatch": "cublas_fastest"})


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 20_000), st.integers(1, 4096), st.sampled_from([32, 512, 4096, 65536]),
       st.sampled_from([32, 1024, 8192]), st.sampled_from([0.0, 32.0, 56.0, 96.0]),
       st.booleans(), st.sampled_from([0, 128, 1024]))
def test_cublas_candidates_never_price_more_rows_faster(m: int, dm: int, n: int, k: int,
                                                       rows: float, split: bool,
                                                       k0: int) -> None:
    fit = CUBLAS.model_copy(update={"tile_load_rows": rows, "split_k": split, "tile_k0": k0})
    peak, bw = H100.peak_flops("bf16"), H100.memory_bandwidth

    def seconds(r: int) -> float:
        q = quantisation(fit, (1.0, r, n, k), L40S_SMS)
        flops, nbytes = 2.0 * r * n * k, 2.0 * (r * k + n * k + r * n)
        return float(fit.seconds(peak, bw, flops, nbytes, r, r * k, q))

    assert seconds(m + dm) >= seconds(m) * (1 - 1e-12)
    scalar = quantisation(fit, (3.0, m, n, k), L40S_SMS)
    array = quantisation(fit, (np.array([3.0]), np.array([float(m)]), np.array([float(n)]),
                               np.array([float(k)])), L40S_SMS)
    assert isinstance(scalar, float)
    assert scalar == pytest.approx(float(array[0]), rel=1e-12)


def test_kernel_fit_picks_the_cublas_candidates_that_made_the_data() -> None:
    """Synthetic BF16 GEMM timings from cuBLAS's candidate tiles with 56 load rows on the
    L40S: offered the candidates (only on the L40S tables), the fit keeps them on its
    training shapes and prices the held-out weights closer than the best single tile."""
    from simulator.validation.kernel_fit import (
        ADA_TABLES,
        DISPATCH_CHOICES,
        DISPATCH_TABLES,
        LOAD_ROW_CHOICES,
        Samples,
        evaluate,
        fit_family,
    )

    assert DISPATCH_TABLES["cublas_fastest"] == ADA_TABLES == ("l40s",)
    assert all(DISPATCH_CHOICES[(e, "gemm")] == ("cublas_fastest",)
               for e in ("vllm", "sglang", "trtllm"))
    l40s = load_device("L40S")
    assert l40s.sm_count == L40S_SMS
    assert l40s.kernel_tables == "l40s"
    rng = np.random.default_rng(5)
    m = np.exp2(rng.integers(0, 15, 900)) + rng.integers(0, 2, 900)
    n = rng.choice([32.0, 256.0, 1024.0, 4096.0, 14336.0], 900)
    k = rng.choice([32.0, 1024.0, 4096.0, 8192.0], 900)
    flops, nbytes = 2 * m * n * k, (m * k + k * n) * 2 + m * n * 2
    q = quantisation(CUBLAS, (np.ones_like(m), m, n, k), L40S_SMS)
    seconds = CUBLAS.seconds(l40s.peak_flops("bf16"), l40s.memory_bandwidth, flops, nbytes, m,
                             m * k, q)
    samples = Samples("gemm", "bf16", flops, nbytes, m, m * k, seconds, n == 1024.0,
                      "synthetic", tiles=(np.ones_like(m), m, n, k))
    _, fitted = fit_family(samples, l40s, ("cublas_fastest",))
    assert fitted.tile_dispatch == "cublas_fastest"
    assert fitted.tile_load_rows in LOAD_ROW_CHOICES
    assert evaluate(samples, l40s, fitted)["median_ape_after"] < 1.0
    _, single = fit_family(samples, l40s)  # one tile size for every shape
    assert (evaluate(samples, l40s, fitted)["p90_ape_after"]
            < evaluate(samples, l40s, single)["p90_ape_after"])


@pytest.mark.kernels  # deselected by default; `pytest -m kernels` with the extra installed
@pytest.mark.parametrize(("engine", "limit"), [("vllm", 10.5), ("trtllm", 10.2)])
def test_the_shipped_l40s_bf16_gemms_take_cublas_candidates(engine: str, limit: float) -> None:
    """vLLM 0.24.0's and TensorRT-LLM 1.3.0rc20's L40S BF16 GEMMs (held out 11.4 / 10.9 %
    with one tile size), median APE on held-out shapes with cuBLAS's candidate tiles."""
    from simulator.validation.kernel_fit import evaluate

    dev, samples, fit = measured_cell(engine, "L40S", "gemm")
    assert (fit.tile_dispatch, fit.tile_load_rows) == ("cublas_fastest", 56.0)
    assert evaluate(samples, dev, fit)["median_ape_after"] < limit
