"""The per-token term of the GEMM fits (``OperatorFit.per_unit_ns``).

vLLM quantises an FP8 GEMM's input with one thread block per token
(csrc/quantization/w8a8/fp8/common.cu, ``static_scaled_fp8_quant``: grid = num_tokens):
AIConfigurator's vLLM FP8 GEMM tables grow by about 6-8 ns per row of ``m`` at large ``m``
whatever ``n`` and ``k`` (512 x 512 and 1536 x 256 alike), where BF16 grows by under 1 ns.
"""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.parallel import Precisions
from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit
from simulator.models import get_model

H100 = load_device("H100-SXM")
BASE = OperatorFit(compute=0.7, half_flops=1e9, memory=0.8, half_bytes=1e6, floor_us=5.0,
                   per_row_ps=1.5)


def test_each_input_row_adds_its_time_beside_the_per_element_term() -> None:
    per_token = BASE.model_copy(update={"per_unit_ns": 6.0})
    for units, rows in ((1.0, 512.0), (32768.0, 32768.0 * 512), (4096.0, 4096.0 * 8192)):
        plain = BASE.seconds(1e15, 3e12, 1e9, 1e6, units, rows)
        assert per_token.seconds(1e15, 3e12, 1e9, 1e6, units, rows) == pytest.approx(
            plain + units * 6e-9, rel=1e-12)
    # Without input rows (every family but GEMM passes none to ``fixed``) nothing changes.
    assert per_token.fixed(1e6, 0.0) == BASE.fixed(1e6, 0.0)


def test_kernel_fit_recovers_a_per_token_kernel_on_held_out_shapes() -> None:
    """Synthetic timings with a per-token term: the fit of a GEMM family finds it (and the
    per-element term beside it) on shapes it never saw."""
    from simulator.validation.kernel_fit import Samples, evaluate, fit

    true = BASE.model_copy(update={"per_unit_ns": 6.0, "floor_us": 3.0})
    rng = np.random.default_rng(1)
    m = np.exp(rng.uniform(0, np.log(32768), 900)).round()
    n = rng.choice([256.0, 512.0, 1536.0, 4096.0, 8192.0, 14336.0], 900)
    k = rng.choice([256.0, 512.0, 1024.0, 4096.0, 8192.0], 900)
    flops, nbytes = 2 * m * n * k, m * k + k * n + m * n * 2
    peak, bw = H100.peak_flops("fp8"), H100.memory_bandwidth
    seconds = true.seconds(peak, bw, flops, nbytes, m, m * k)
    held_out = n == 1536.0
    samples = Samples("gemm_fp8", "fp8", flops, nbytes, m, m * k, seconds, held_out,
                      "synthetic")
    fitted = fit(samples, H100)
    assert fitted.per_unit_ns == pytest.approx(6.0, rel=0.1)
    assert evaluate(samples, H100, fitted)["median_ape_after"] < 1.0


def test_an_fp8_step_pays_the_per_token_term_once_per_gemm_input() -> None:
    """In the step model each GEMM of a layer quantises its own input: a prefill of ``T``
    tokens pays ``T x per_unit_ns`` per GEMM (QKV, O, gate-up, down)."""
    model = get_model("Llama-3.1-8B")
    cost = InstanceCostModel(model, H100, engine="vllm", fitted=True,
                             precisions=Precisions("fp8", "fp8", "bf16"))
    shape = BatchShape.prefill(2048)
    before = cost.step(shape)
    for label in ("gemm_attention", "gemm_ffn"):
        fit = cost._fits[label]
        cost._fits[label] = fit.model_copy(update={"per_unit_ns": fit.per_unit_ns + 10.0})
    cost._quant_memo.clear()
    after = cost.step(shape)
    gemms = 4 * model.num_layers
    assert after.seconds - before.seconds == pytest.approx(gemms * 2048 * 10e-9, rel=1e-6)
