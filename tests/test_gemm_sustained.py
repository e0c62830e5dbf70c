"""A long GEMM's slower rate (``OperatorFit.sustained_us``, ``sustained_rate``).

A dense GEMM at full tensor-core load draws the card's power limit; AIConfigurator's
collector times a long kernel over a window long enough for the clock to fall, and its
tables show the lower rate (TensorRT-LLM's B200 BF16 GEMMs 1,460 TFLOP/s at 1-4 ms,
1,215-1,340 at 16-128 ms).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.hardware import load_device
from simulator.hardware.operator_fits import OperatorFit, OperatorFits
from simulator.validation.kernel_fit_samples import Samples

H100 = load_device("H100-SXM")
BASE = OperatorFit(compute=0.7, half_flops=1e9, memory=0.8, half_bytes=1e6, floor_us=5.0)
SLOW = BASE.model_copy(update={"sustained_us": 1000.0, "sustained_rate": 0.75})
PEAK, BW = 1e15, 3e12
REPO = Path(__file__).resolve().parents[1]


def _synthetic_gemms(true: OperatorFit, *, seed: int, count: int, max_m: int,
                     held_n: float, scatter: float = 0.0) -> Samples:
    """BF16 GEMMs of random shapes on H100 timed by ``true`` (times scattered by a lognormal
    factor of ``scatter``), the shapes of width ``held_n`` held out, with their tiles."""
    rng = np.random.default_rng(seed)
    m = np.exp(rng.uniform(0, np.log(max_m), count)).round()
    n = rng.choice([512.0, 1536.0, 4096.0, 8192.0, 28672.0], count)
    k = rng.choice([512.0, 1024.0, 4096.0, 8192.0], count)
    flops, nbytes = 2 * m * n * k, 2 * (m * k + k * n + m * n)
    peak, bw = H100.peak_flops("bf16"), H100.memory_bandwidth
    seconds = true.seconds(peak, bw, flops, nbytes, m, m * k)
    if scatter:
        seconds = seconds * np.exp(rng.normal(0, scatter, count))
    return Samples("gemm", "bf16", flops, nbytes, m, m * k, seconds, n == held_n, "synthetic",
                   tiles=(np.ones_like(m), m, n, k))


def test_a_long_kernel_runs_at_the_lower_rate_and_a_short_one_at_the_whole_rate() -> None:
    """``sustained_us`` 1,000, ``sustained_rate`` 0.75 (a third more time at the lower
    rate): a kernel of 1 ms compute takes half of that third more, 1 s nearly all of it,
    10 us nearly none. A group of two kernels pays it per kernel: two GEMMs of 1 ms each
    take what each takes alone."""
    def flops(seconds: float, kernels: int = 1) -> float:  # FLOPs of that compute time
        return seconds * PEAK * 0.7 - kernels * 1e9

    def compute(fit: OperatorFit, seconds: float, kernels: int = 1) -> float:
        return float(fit.parts(PEAK, BW, flops(seconds, kernels), 1e3, kernels=kernels)[0])

    assert compute(SLOW, 1e-3) == pytest.approx(1e-3 * (1 + (1 / 3) / 2), rel=1e-9)
    assert compute(SLOW, 1.0) == pytest.approx(1.0 * (1 + (1 / 3) * 1000 / 1001), rel=1e-9)
    assert compute(SLOW, 1e-5) == pytest.approx(1e-5 * (1 + (1 / 3) * 10 / 1010), rel=1e-9)
    assert compute(BASE, 1e-3) == pytest.approx(1e-3, rel=1e-9)
    assert compute(SLOW, 2e-3, kernels=2) == pytest.approx(2 * compute(SLOW, 1e-3), rel=1e-9)
    # Arrays price as scalars do.
    arr = SLOW.parts(PEAK, BW, np.array([flops(1e-3), flops(1.0)]), np.array([1e3, 1e3]))[0]
    assert arr.tolist() == pytest.approx([compute(SLOW, 1e-3), compute(SLOW, 1.0)], rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.floats(1.0, 1e16), st.floats(1.0, 1e12), st.floats(1.0, 4.0))
def test_a_slower_long_rate_never_makes_more_work_faster(f: float, b: float,
                                                         grow: float) -> None:
    base = SLOW.seconds(PEAK, BW, f, b)
    assert SLOW.seconds(PEAK, BW, f * grow, b) >= base
    assert SLOW.seconds(PEAK, BW, f, b) >= BASE.seconds(PEAK, BW, f, b)


def test_only_gemm_families_take_it() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"moe\.sustained_rate: only GEMM families"):
        OperatorFits(source="t", fits={"moe": SLOW})
    OperatorFits(source="t", fits={"gemm": SLOW, "gemm_fp8": SLOW, "gemm_fp4": SLOW})


def test_kernel_fit_recovers_a_long_kernels_rate_on_held_out_shapes() -> None:
    """Synthetic GEMM timings whose long kernels run at 0.7 of the rate (halfway at 2 ms of
    compute): the fit offered the term finds it and prices shapes it never saw to within
    1 %; without it the long GEMMs of those shapes are priced too fast."""
    from simulator.validation.kernel_fit import evaluate, fit

    true = BASE.model_copy(update={"sustained_us": 2000.0, "sustained_rate": 0.7})
    samples = _synthetic_gemms(true, seed=3, count=900, max_m=65536, held_n=4096.0)
    held_out, seconds = samples.held_out, samples.seconds
    found = fit(samples, H100, sustained=True)
    assert found.sustained_rate == pytest.approx(0.7, abs=0.03)
    assert found.sustained_us == pytest.approx(2000.0, rel=0.15)
    assert evaluate(samples, H100, found)["median_ape_after"] < 1.0
    plain = fit(samples, H100)
    long = held_out & (seconds > 4e-3)
    from simulator.validation.kernel_fit_predict import predict
    off = predict(samples, H100, plain, np.flatnonzero(long)) / seconds[long] - 1
    assert np.median(off) < -0.05


def test_a_lower_rate_without_its_length_is_refused_with_the_file_and_key(
        tmp_path: Path) -> None:
    """``sustained_rate`` below 1 without ``sustained_us`` would divide by zero when priced:
    a device profile giving it is refused where it is read, naming the file and the fit."""
    from pydantic import ValidationError

    from simulator.errors import ConfigError
    from simulator.hardware.registry import load_device

    with pytest.raises(ValidationError, match=r"sustained_rate 0.8 needs sustained_us > 0"):
        BASE.model_validate({**BASE.model_dump(), "sustained_rate": 0.8})
    text = (REPO / "hardware_profiles" / "devices" / "H100-SXM.yaml").read_text()
    fit = re.search(r"      gemm: \{[^}]*\}", text)
    assert fit is not None
    assert "sustained_us" in fit.group(0)
    broken = re.sub(r"sustained_us: [0-9.e+]+, ", "", fit.group(0))
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(fit.group(0), broken, 1))
    with pytest.raises(ConfigError, match=r"bad\.yaml: operators\.\w+\.fits\.gemm: "
                                          r"sustained_rate [0-9.]+ needs sustained_us > 0"):
        load_device(str(bad))


def _long_and_short_gemms() -> tuple[Samples, np.ndarray]:
    """Synthetic BF16 GEMM timings: most kernels short and scattered by 8 %, about 4 % of
    them over 1 ms and at 0.6 of the rate there (the term's truth, halfway at 3 ms)."""
    true = BASE.model_copy(update={"sustained_us": 3000.0, "sustained_rate": 0.6})
    samples = _synthetic_gemms(true, seed=5, count=1500, max_m=16384, held_n=1536.0,
                               scatter=0.08)
    return samples, samples.seconds


def test_the_time_weighted_median_is_the_value_at_half_the_weight() -> None:
    from simulator.validation.kernel_fit_predict import time_weighted_median

    values = np.array([5.0, 1.0, 30.0, 2.0])
    assert time_weighted_median(values, np.ones(4)) == 2.0  # the lower middle, as weights tie
    assert time_weighted_median(values, np.array([1.0, 1.0, 10.0, 1.0])) == 30.0
    assert time_weighted_median(values, np.array([0.0, 0.0, 1.0, 0.0])) == 30.0


def test_the_long_rate_is_kept_where_only_the_time_weighted_score_sees_it() -> None:
    """A fit exact on the short kernels but 40 % fast on the long ones has the better plain
    median; the fit with the long kernels' rate, a little slower on every short kernel, is
    the better one per unit of time. The long rate is kept (kernel_fit.keeps_long_rate),
    where the plain median alone would have refused it."""
    from simulator.validation.kernel_fit import keeps_long_rate
    from simulator.validation.kernel_fit_predict import training_ape, training_time_score

    samples, seconds = _long_and_short_gemms()
    assert 0.02 < float(np.mean(seconds > 1e-3)) < 0.08
    plain = BASE  # the truth without the long kernels' rate
    longer = BASE.model_copy(update={"sustained_us": 3000.0, "sustained_rate": 0.6,
                                     "floor_us": 6.0})
    assert training_ape(samples, H100, longer) > training_ape(samples, H100, plain)
    assert training_time_score(samples, H100, longer) < training_time_score(samples, H100, plain)
    assert keeps_long_rate(H100, (samples, plain), (samples, longer))
    # A rate that makes the long kernels too slow is worse on both scores: refused.
    too_slow = longer.model_copy(update={"sustained_rate": 0.25})
    assert not keeps_long_rate(H100, (samples, plain), (samples, too_slow))
