"""A GEMM's time per unit of its depth (``OperatorFit.per_k_ps``).

A thread block walks its k in a serial main loop, one k-slice after another, and the kernel
waits for its blocks' loops: in AIConfigurator's vLLM 0.24.0 L40S BF16 tables a GEMM of 2-16
rows takes 2.1 us over a 128 x 128 weight, 3.7 us over 512 x 512 and 5.5 us over
1,024 x 1,024, where the weights' bytes make under 1.5 us of the difference.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost import BatchShape, InstanceCostModel
from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
from simulator.models import get_model
from tests.kernel_cells import measured_cell

L40S = load_device("L40S")
BASE = OperatorFit(compute=0.7, half_flops=1e8, memory=0.8, half_bytes=1e6, floor_us=1.5,
                   per_row_ps=0.2, tile_m=128, tile_n=128, split_k=True, tile_k0=128)


def test_each_gemm_pays_its_depth_beside_the_other_fixed_terms() -> None:
    deep = BASE.model_copy(update={"per_k_ps": 250.0})
    for units, rows, depth in ((1.0, 512.0, 512.0), (4096.0, 4096.0 * 8192, 8192.0)):
        plain = BASE.seconds(1e15, 1e12, 1e9, 1e6, units, rows, 1.0, 0.0, depth)
        assert deep.seconds(1e15, 1e12, 1e9, 1e6, units, rows, 1.0, 0.0, depth) == \
            pytest.approx(plain + depth * 250e-12, rel=1e-12)
    # Without a depth (every family but GEMM passes none) nothing changes.
    assert deep.fixed(1e6, 0.0, 8.0) == BASE.fixed(1e6, 0.0, 8.0)
    with pytest.raises(ValueError, match="per_k_ps"):
        OperatorFits(source="t", fits={"attention_prefill": BASE.model_copy(
            update={"per_k_ps": 1.0})})
    with pytest.raises(ValueError, match="per_k_ps"):
        OperatorFit.model_validate(BASE.model_dump() | {"per_k_ps": -1.0})


def test_kernel_fit_recovers_the_depth_term_on_held_out_shapes() -> None:
    """Synthetic tiled GEMM timings with 250 ps per unit of k: the fit offered the term
    finds it on shapes it never saw; without it the same fit is further off."""
    from simulator.cost.roofline import quantisation
    from simulator.validation.kernel_fit import Samples, evaluate, fit

    true = BASE.model_copy(update={"per_k_ps": 250.0})
    rng = np.random.default_rng(4)
    m = np.exp(rng.uniform(0, np.log(8192), 900)).round()
    n = rng.choice([128.0, 512.0, 1024.0, 2560.0, 4096.0, 14336.0], 900)
    k = rng.choice([128.0, 512.0, 1024.0, 4096.0, 8192.0, 16384.0], 900)
    flops, nbytes = 2 * m * n * k, (m * k + k * n) * 2 + m * n * 2
    q = quantisation(true, (np.ones_like(m), m, n, k), L40S.sm_count)
    seconds = true.seconds(L40S.peak_flops("bf16"), L40S.memory_bandwidth, flops, nbytes, m,
                           m * k, q, 0.0, k)
    samples = Samples("gemm", "bf16", flops, nbytes, m, m * k, seconds, n == 2560.0,
                      "synthetic", tiles=(np.ones_like(m), m, n, k))
    fitted = fit(samples, L40S, 128, 128, True, 128, depth=True)
    assert fitted.per_k_ps == pytest.approx(250.0, rel=0.1)
    assert evaluate(samples, L40S, fitted)["median_ape_after"] < 1.0
    without = fit(samples, L40S, 128, 128, True, 128)
    assert without.per_k_ps == 0.0
    assert evaluate(samples, L40S, without)["p90_ape_after"] > \
        evaluate(samples, L40S, fitted)["p90_ape_after"]


def test_a_step_pays_each_gemms_depth() -> None:
    """In the step model each GEMM of a layer walks its own k: QKV and gate+up the hidden
    size, the output projection the attention width, down the intermediate size."""
    model = get_model("Llama-3.1-8B")
    cost = InstanceCostModel(model, L40S, engine="vllm", fitted=True)
    shape = BatchShape.prefill(512)
    before = cost.step(shape)
    depth = 0.0
    for label, shapes in (("gemm_attention", cost._attn_shapes), ("gemm_ffn", cost._ffn_shapes)):
        fit = cost._fits[label]
        cost._fits[label] = fit.model_copy(update={"per_k_ps": fit.per_k_ps + 1000.0})
        depth += sum(k for _, k in shapes)
    cost._quant_memo.clear()
    after = cost.step(shape)
    assert depth == 2 * model.hidden_size + model.hidden_size + model.intermediate_size
    assert after.seconds - before.seconds == pytest.approx(
        model.num_layers * depth * 1000e-12, rel=1e-6)


def test_the_depth_term_is_offered_on_the_l40s_and_sglangs_b200_tables() -> None:
    from simulator.validation.kernel_fit import ADA_TABLES, GEMM_DEPTH_TABLES

    assert GEMM_DEPTH_TABLES["vllm"] == GEMM_DEPTH_TABLES["trtllm"] == ADA_TABLES
    assert GEMM_DEPTH_TABLES["sglang"] == (*ADA_TABLES, "b200_sxm")


@pytest.mark.kernels  # deselected by default; `pytest -m kernels` with the extra installed
@pytest.mark.parametrize(("engine", "device", "op", "limit"), [
    ("vllm", "L40S", "gemm", 9.8), ("vllm", "L40S", "gemm_fp8", 9.5),
    ("sglang", "B200", "gemm_fp8", 9.8)])
def test_the_shipped_gemm_fits_pay_their_depth_on_held_out_shapes(
        engine: str, device: str, op: str, limit: float) -> None:
    """vLLM 0.24.0's L40S BF16 and FP8 GEMMs (held out 11.4 / 10.2 % before cuBLAS's tiles
    and the depth term) and SGLang 0.5.14's B200 FP8 GEMM (10.4 %), median APE on held-out
    shapes."""
    from simulator.validation.kernel_fit import evaluate

    dev, samples, fit = measured_cell(engine, device, op)
    assert fit.per_k_ps > 0
    assert evaluate(samples, dev, fit)["median_ape_after"] < limit
