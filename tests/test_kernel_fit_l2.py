"""The warm L2 of the kernel tables: AIConfigurator's collector replays one kernel on the same
buffers back to back, so an attention working set that fits the L2 is read from it after the
first replay (OperatorFit.l2_speedup). The fit describes those shapes with the term; the step
model prices every layer's KV from memory."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.cost import BatchShape, InstanceCostModel
from simulator.cost.roofline import decode_units
from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
from simulator.models import get_model
from simulator.validation.kernel_fit import Samples, evaluate, fit_family
from simulator.validation.kernel_fit_predict import warm_share

L40S = load_device("L40S")
MIB = 2.0**20
DECODE = OperatorFit(compute=0.6, half_flops=1e8, memory=0.85, half_bytes=0.0,
                     floor_us=4.0, per_row_ps=2e4, row_unit="kv_head")


def test_warm_bytes_run_at_the_l2_speed_and_cold_ones_at_the_memory_speed() -> None:
    warm = DECODE.model_copy(update={"l2_speedup": 4.0})
    peak, bw = L40S.peak_flops("bf16"), L40S.memory_bandwidth
    _, cold = warm.parts(peak, bw, 1e6, 5e7)
    _, hot = warm.parts(peak, bw, 1e6, 5e7, warm=1.0)
    assert hot == pytest.approx(cold / 4.0)
    # Unless told the bytes are warm (the step model never is), the term changes nothing.
    assert warm.seconds(peak, bw, 1e6, 5e7, 10.0, 100.0) == (
        DECODE.seconds(peak, bw, 1e6, 5e7, 10.0, 100.0))


def test_a_working_set_is_warm_where_it_fits_the_devices_l2() -> None:
    assert L40S.l2_cache_mb == 96
    footprint = np.array([1.0, 96.0, 97.0, 500.0]) * MIB
    one = np.ones(4)
    samples = Samples("attention_decode", "bf16", one, footprint, one, one, one,
                      np.zeros(4, bool), "synthetic", footprint=footprint)
    assert list(warm_share(samples, L40S, np.arange(4))) == [1.0, 1.0, 0.0, 0.0]
    no_figure = L40S.model_copy(update={"l2_cache_mb": None})
    assert warm_share(samples, no_figure, np.arange(4)) == 0.0


def _decode_samples(speedup: float) -> Samples:
    """Synthetic decode timings with a warm L2 below 96 MiB of KV (``speedup``)."""
    rng = np.random.default_rng(7)
    n = 1500
    batch = rng.choice([1.0, 4.0, 16.0, 64.0, 256.0, 1024.0], n)
    ctx = rng.choice([16.0, 128.0, 1024.0, 4096.0, 32768.0], n)
    layouts = np.array([(32, 8), (64, 8), (32, 4), (28, 4), (16, 2), (40, 8)], float)
    heads, kvh = layouts[rng.integers(0, len(layouts), n)].T
    hd = 128.0
    kv = batch * ctx * 2 * kvh * hd * 2
    nbytes = kv + batch * 2 * heads * hd * 2
    flops = 4 * heads * hd * ctx * batch
    units, rows = decode_units(batch, batch * ctx, kvh), batch * kvh
    true = DECODE.model_copy(update={"l2_speedup": speedup})
    warm = (nbytes <= 96 * MIB).astype(float)
    seconds = true.seconds(L40S.peak_flops("bf16"), L40S.memory_bandwidth, flops, nbytes,
                           units, rows, warm=warm)
    return Samples("attention_decode", "bf16", flops, nbytes, units, rows, seconds,
                   heads == 28.0, "synthetic", kv_bytes=kv, footprint=nbytes)


def test_the_fit_finds_the_warm_l2_and_keeps_the_memory_efficiency_of_cold_shapes() -> None:
    samples = _decode_samples(3.0)
    _, fitted = fit_family(samples, L40S)
    assert fitted.l2_speedup == pytest.approx(3.0, rel=0.05)
    assert fitted.memory == pytest.approx(0.85, rel=0.05)
    assert evaluate(samples, L40S, fitted)["median_ape_after"] < 1.0
    # Without the device's L2 figure one memory efficiency serves warm and cold shapes.
    no_figure = L40S.model_copy(update={"l2_cache_mb": None})
    _, plain = fit_family(samples, no_figure)
    assert plain.l2_speedup == 1.0
    assert evaluate(samples, no_figure, plain)["median_ape_after"] > 5.0


def test_the_step_model_prices_kv_from_memory_whatever_the_l2_speedup() -> None:
    def step_seconds(fit: OperatorFit) -> float:
        device = L40S.model_copy(update={"operators": {"vllm": OperatorFits(
            source="t", fits={"attention_decode": fit})}})
        cm = InstanceCostModel(get_model("Llama-3.1-8B"), device, engine="vllm", fitted=True)
        return cm.step(BatchShape.decode(4, 4 * 512)).seconds

    assert step_seconds(DECODE.model_copy(update={"l2_speedup": 5.0})) == step_seconds(DECODE)


def test_a_gemm_table_shapes_footprint_counts_the_operands_each_collector_copies() -> None:
    """vLLM's and TensorRT-LLM's collectors give every copy of a GEMM the same input and
    its own weight; SGLang's builds a whole GEMM per copy. A large batch over a small
    weight (32,768 x 1,024 BF16 input, 1,024 x 128 weight: 64 MiB + 0.25 MiB, 8 MiB out)
    then fits a 96 MiB L2 in the first two and spans six times its input in SGLang's."""
    from simulator.validation.kernel_fit_samples import GEMM_COPIES, gemm_footprint

    m, n, k = (np.array([v], dtype=float) for v in (32768, 128, 1024))
    weight, inputs, out = n * k * 2, m * k * 2, m * n * 2
    for engine in ("vllm", "trtllm"):
        got = gemm_footprint(engine, "bf16", m, n, k)
        assert got is not None
        assert got[0] == (inputs + GEMM_COPIES[engine] * weight + out)[0]
        assert got[0] < 96 * MIB
    sglang = gemm_footprint("sglang", "bf16", m, n, k)
    assert sglang is not None
    assert sglang[0] == (6 * (inputs + weight) + out)[0]
    # An FP8 GEMM also keeps the quantised input (one byte per element).
    fp8 = gemm_footprint("vllm", "fp8", m, n, k)
    assert fp8 is not None
    assert fp8[0] == (inputs + m * k + 6 * n * k + out)[0]
    assert gemm_footprint(None, "bf16", m, n, k) is None
