"""SGLang on Blackwell: FlashInfer's CUTLASS NVFP4 GEMM, whose tiles are 128 rows at every
batch (``OperatorFit.tile_dispatch`` ``flashinfer_cutlass_sm100_nvfp4``), and the decode
kernel's per-row work by head dimension (``OperatorFit.group_row_head_dim_exp``), offered to
SGLang's B200 and GB200 decode fits without the TensorRT-LLM collector's RoPE kernel."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from tests.kernel_cells import measured_cell
from tests.test_kernel_fit_decode_width import H100, WIDE, _xqa_decode


def test_sglang_blackwell_decode_is_offered_the_width_without_the_rope_kernel() -> None:
    from simulator.validation.kernel_fit import (
        BLACKWELL_TABLES,
        ROW_WIDTH_ENGINES,
        ROW_WIDTH_TABLES,
    )

    assert "sglang" not in ROW_WIDTH_ENGINES  # the RoPE kernel is TensorRT-LLM's collector's
    assert ROW_WIDTH_TABLES["sglang"] == BLACKWELL_TABLES
    assert "h100_sxm" not in ROW_WIDTH_TABLES["sglang"]


def test_kernel_fit_finds_the_width_with_the_rope_kernel_not_offered() -> None:
    """Synthetic grouped decode timings whose blocks grow as head_dim ** 0.75: offered the
    width alone (``rope_kernel=False``), the fit recovers it and never adds a RoPE kernel."""
    from simulator.validation.kernel_fit import GROUP_LIMIT_CHOICES, evaluate, fit_family

    samples = _xqa_decode(WIDE, 5)
    rows, fitted = fit_family(samples, H100, (), GROUP_LIMIT_CHOICES["trtllm"], row_width=True,
                              rope_kernel=False)
    assert fitted.group_row_head_dim_exp == pytest.approx(0.75, abs=0.05)
    assert fitted.rope_kernel_us == 0.0
    assert evaluate(rows, H100, fitted)["median_ape_after"] < 1.0


@pytest.mark.kernels  # deselected by default; `pytest -m kernels` with the extra installed
@pytest.mark.parametrize(("device", "op", "limit"), [
    ("B200", "gemm_fp4", 8.5), ("GB200-NVL72", "gemm_fp4", 8.5),
    ("B200", "attention_decode", 9.0)])
def test_the_shipped_sglang_blackwell_fits_on_held_out_measured_shapes(
        device: str, op: str, limit: float) -> None:
    """SGLang 0.5.14's B200 / GB200 NVFP4 GEMM (held out 11.1 / 11.0 % before the 128-row
    tiles) and B200 decode attention (10.3 % before the width), median APE on held-out
    shapes."""
    from simulator.validation.kernel_fit import evaluate

    dev, samples, fit = measured_cell("sglang", device, op)
    if op == "gemm_fp4":
        assert fit.tile_dispatch == "flashinfer_cutlass_sm100_nvfp4"
    else:
        assert fit.group_row_head_dim_exp > 0
        assert fit.rope_kernel_us == 0.0
        if fit.row_unit == "kv_head" and samples.kv_rows is not None:
            samples = replace(samples, rows=samples.kv_rows, kv_rows=None)
    assert evaluate(samples, dev, fit)["median_ape_after"] < limit
    assert np.isfinite(samples.seconds).all()
