"""Per-operator roofline constants and measured all-reduce curves in the device profiles."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.cost import BatchShape, InstanceCostModel, LinkSet, Parallelism, allreduce_time
from simulator.hardware import load_device, load_link
from simulator.hardware.operator_fits import CollectiveCurve, OperatorFit, OperatorFits
from simulator.models import get_model
from simulator.validation.kernel_fit_comm import knot_errors

FIT = OperatorFit(compute=0.7, half_flops=1e9, memory=0.8, half_bytes=1e6, half_units=30.0,
                  floor_us=5.0, per_row_ps=2.0)
H100 = load_device("H100-SXM")
NVL = load_link("nvlink4")
M8 = get_model("Llama-3.1-8B")

pos = st.floats(min_value=1.0, max_value=1e14, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(pos, pos, st.floats(1.0, 1e5), st.floats(1.0, 4.0))
def test_fitted_roofline_never_decreases_when_work_grows(f: float, b: float, u: float,
                                                         grow: float) -> None:
    """More work on the same units, or work growing with its units, never takes less time
    (up to the last bit of rounding: work and fill move in opposite directions, and a growth
    of one ulp in both can round the product down by one)."""
    base = FIT.seconds(1e15, 3e12, f, b, u, u)
    assert base > 0
    floor = base * (1 - 1e-12)
    assert FIT.seconds(1e15, 3e12, f * grow, b * grow, u, u) >= floor
    assert FIT.seconds(1e15, 3e12, f * grow, b * grow, u * grow, u * grow) >= floor


def test_fitted_roofline_pieces() -> None:
    # Large work on many units: the efficiency terms; small work: the floor.
    big = FIT.seconds(1e15, 3e12, 1e15, 0.0, 1e9)
    assert big == pytest.approx((1e15 + 1e9) / (0.7e15) + 5e-6, rel=1e-6)
    assert FIT.seconds(1e15, 3e12, 0.0, 0.0) == pytest.approx(5e-6)
    assert FIT.seconds(1e15, 3e12, 0.0, 0.0, 1, 1e6) == pytest.approx(5e-6 + 2e-6)


EXPOSED = FIT.model_copy(update={"exposed": 0.4, "half_units": 0.0})


@settings(max_examples=200, deadline=None)
@given(pos, pos, st.floats(1.0, 4.0))
def test_an_exposed_share_never_makes_more_work_faster(f: float, b: float, grow: float) -> None:
    base = EXPOSED.seconds(1e15, 3e12, f, b)
    assert EXPOSED.seconds(1e15, 3e12, f * grow, b) >= base
    assert EXPOSED.seconds(1e15, 3e12, f, b * grow) >= base


def test_an_exposed_share_adds_that_share_of_the_shorter_side() -> None:
    """``exposed`` 0.4: the busy time is the longer of compute and memory plus 0.4 of the
    shorter, on the fit's own curve and in the step model's operator pricing, which adds
    it (and the fixed work) to the side that bounds the operator."""
    flops, nbytes = 4e11, 2e8
    compute = (flops + 1e9) / (1e15 * 0.7)
    memory = (nbytes + 1e6) / (3e12 * 0.8)
    assert compute > memory
    plain = FIT.model_copy(update={"half_units": 0.0})
    assert plain.seconds(1e15, 3e12, flops, nbytes) == pytest.approx(compute + 5e-6, rel=1e-12)
    assert EXPOSED.seconds(1e15, 3e12, flops, nbytes) == pytest.approx(
        compute + 0.4 * memory + 5e-6, rel=1e-12)
    device = H100.model_copy(update={"operators": {"vllm": OperatorFits(
        source="t", fits={"gemm": EXPOSED})}})
    cost = InstanceCostModel(M8, device, engine="vllm", fitted=True)
    peak, bw = cost._peak, cost._bw
    c, m = EXPOSED.parts(peak, bw, flops, nbytes)
    assert c > m
    priced = cost._roofline("gemm_ffn", flops, nbytes, 1, 1.0, 0.0)
    assert priced == pytest.approx((c + 0.4 * m + 5e-6, m, 0.0), rel=1e-12)
    without = InstanceCostModel(M8, H100.model_copy(update={"operators": {"vllm": OperatorFits(
        source="t", fits={"gemm": plain})}}), engine="vllm", fitted=True)
    assert without._roofline("gemm_ffn", flops, nbytes, 1, 1.0, 0.0) == pytest.approx(
        (c + 5e-6, m, 0.0), rel=1e-12)


def test_prefill_attention_pays_its_exposed_share_of_the_kv_traffic() -> None:
    """A prefill-attention fit with ``exposed`` adds that share of the shorter of compute and
    memory (the K/V re-read under the tensor cores' work) to the operator the step model
    prices, and the step costs more by it; the FLOPs, bytes and tiles stay the same."""
    plain = FIT.model_copy(update={"half_units": 0.0})
    shape = BatchShape.prefill(2048)
    costs = [InstanceCostModel(M8, H100.model_copy(update={"operators": {"vllm": OperatorFits(
        source="t", fits={"attention_prefill": fit})}}), engine="vllm", fitted=True)
        for fit in (plain, EXPOSED)]
    ops = [cost._prefill_attention_op(shape) for cost in costs]
    assert ops[0] == ops[1]
    flops, nbytes, units, quant = ops[0]
    c, m = EXPOSED.parts(costs[1]._peak16, costs[1]._bw, flops, nbytes, units, quant)
    priced = [cost._roofline("attention_prefill", flops, nbytes, 1, units, 0.0, quant)
              for cost in costs]
    assert sum(priced[1]) - sum(priced[0]) == pytest.approx(0.4 * min(c, m), rel=1e-9)
    assert costs[1].step(shape).seconds > costs[0].step(shape).seconds


def test_the_new_terms_are_refused_on_families_that_do_not_price_them() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError,
                       match=r"attention_decode\.exposed: only GEMM, MoE and prefill-attention"):
        OperatorFits(source="t", fits={"attention_decode": EXPOSED})
    OperatorFits(source="t", fits={"attention_prefill": EXPOSED,
                                   "attention_prefill_kv_fp8": EXPOSED})
    with pytest.raises(ValidationError, match=r"gemm\.per_group_ns: only MoE"):
        OperatorFits(source="t", fits={"gemm": FIT.model_copy(update={"per_group_ns": 100.0})})
    OperatorFits(source="t", fits={"gemm_fp8": EXPOSED, "moe": FIT.model_copy(
        update={"per_group_ns": 100.0, "exposed": 0.5})})


def test_a_group_of_gemms_costs_what_its_gemms_cost_alone() -> None:
    """The attention projections (QKV and output) are priced as one operator of two GEMMs.
    Each GEMM pays the fit's half-work terms, floor and per-token work as the single GEMMs
    the fit was made on did, so two memory-bound GEMMs priced as a group cost what they
    cost one by one. The groups had paid ``half_bytes`` once: under TensorRT-LLM's H100 FP8
    fit (13.4 MB of it) 5.5 us less per group and layer, 0.88 ms (5 %) of a one-sequence
    decode step of Llama-3.1-70B in FP8 on two H100s."""
    fit = OperatorFit(compute=0.7, half_flops=1e9, memory=0.8, half_bytes=5e6, floor_us=3.0,
                      per_row_ps=2.0, per_unit_ns=1.0, exposed=0.3)
    device = H100.model_copy(update={"operators": {"vllm": OperatorFits(
        source="t", fits={"gemm": fit})}})
    cost = InstanceCostModel(M8, device, engine="vllm", fitted=True)
    tokens = 2.0
    qkv, out = (6144.0, 4096.0), (4096.0, 4096.0)
    alone = [cost._roofline("gemm_attention", 2 * tokens * n * k, n * k + tokens * (n + k) * 2,
                            1, tokens, tokens * k) for n, k in (qkv, out)]
    assert all(c < m for c, m, _ in alone)  # both memory-bound
    group = cost._roofline("gemm_attention", sum(2 * tokens * n * k for n, k in (qkv, out)),
                           sum(n * k + tokens * (n + k) * 2 for n, k in (qkv, out)), 2, tokens,
                           tokens * (qkv[1] + out[1]))
    assert sum(group) == pytest.approx(sum(sum(a) for a in alone), rel=1e-12)


def test_collective_curve_interpolates_linearly_and_stops_at_its_ends() -> None:
    curve = CollectiveCurve(ranks=8, points=[(1e3, 5.0), (1e5, 5.0), (1e7, 500.0)])
    assert curve.seconds(1e4) == pytest.approx(5e-6)
    assert curve.seconds(1e6) == pytest.approx(50e-6)
    assert curve.seconds(1e2) is None
    assert curve.seconds(1e8) is None
    with pytest.raises(ValueError, match="increase"):
        CollectiveCurve(ranks=2, points=[(10, 1.0), (5, 2.0)])


def test_collective_curve_is_exact_on_a_latency_plus_bandwidth_law() -> None:
    """Between knots of one algorithm (time = latency + size / bandwidth) the curve returns the
    law itself; straight lines in log-log priced the midpoints up to 40 % too slow."""
    law = lambda size: 10.0 + size / 1e3  # noqa: E731  (us)
    sizes = [4.0 ** j * 1e3 for j in range(8)]
    curve = CollectiveCurve(ranks=4, points=[(b, law(b)) for b in sizes])
    for lo, hi in itertools.pairwise(sizes):
        mid = (lo + hi) / 2
        assert curve.seconds(mid) == pytest.approx(law(mid) * 1e-6, rel=1e-12)
    assert max(knot_errors(curve)) == pytest.approx(0.0, abs=1e-9)
    assert max(knot_errors(curve, log_log=True)) > 20.0


def test_collective_curve_reads_a_slow_knot_as_the_next_larger_message() -> None:
    """A knot above a larger message's time (a timing's noise only adds) is read as that
    later time: a smaller message never costs more than a larger one."""
    curve = CollectiveCurve(ranks=8, points=[(128, 25.0), (512, 33.0), (2048, 34.0),
                                             (8192, 27.8), (32768, 91.4)])
    sizes, times = curve.knots()
    assert list(sizes) == [128, 512, 2048, 8192, 32768]
    assert list(times) == [25.0, 27.8, 27.8, 27.8, 91.4]
    assert curve.seconds(1024) == pytest.approx(27.8e-6)
    assert curve.seconds(256) == pytest.approx((25.0 + (27.8 - 25.0) * 128 / 384) * 1e-6)
    grid = np.geomspace(128, 32768, 200)
    got = [curve.seconds(b) for b in grid]
    assert all(b >= a for a, b in itertools.pairwise(got))  # type: ignore[operator]


def test_profiles_carry_fits_with_their_source_per_engine() -> None:
    for name in ("H100-SXM", "H200-SXM", "B200", "A100-SXM-80GB"):
        ops = load_device(name).operators
        assert ops is not None
        assert "vllm" in ops
        assert "aiconfigurator-core" in ops["vllm"].source
        assert {"attention_prefill", "attention_decode"} <= set(ops["vllm"].fits)
        assert ops["vllm"].allreduce
    # Devices without measured tables keep the device-wide efficiencies.
    assert load_device("MI300X").operators is None
    assert load_device("GroqLPU-v1").operators is None


def test_small_all_reduce_is_the_engines_custom_kernel_not_nccl() -> None:
    """vLLM's custom all-reduce on 8 H100s takes ~5 us for a decode message; NCCL ~16 us.

    A TP8 decode step prices its all-reduces from the engine's measured curve, which the
    link's NCCL-fitted alpha-beta model overestimated ~3x for small messages.
    """
    curve = H100.allreduce_curves("vllm")[8]
    nbytes = M8.hidden_size * 2  # one decoding sequence, bf16
    measured = curve.seconds(M8.hidden_size)  # the curve counts elements
    assert measured is not None
    assert measured < 8e-6
    assert allreduce_time(nbytes, 8, NVL) > 2 * measured
    cm = InstanceCostModel(M8, H100, Parallelism(tp=8), links=LinkSet(tp=NVL), engine="vllm",
                           fitted=True)
    ops = cm.breakdown(BatchShape.decode(1, 500))
    assert ops["allreduce"] == pytest.approx(2 * M8.num_layers * measured)


def test_fits_follow_the_engine_and_fall_back_for_others() -> None:
    shape = BatchShape.decode(32, 32 * 2000)
    vllm = InstanceCostModel(M8, H100, engine="vllm", fitted=True).step(shape).seconds
    trt = InstanceCostModel(M8, H100, engine="trtllm", fitted=True).step(shape).seconds
    assert vllm != trt
    other = InstanceCostModel(M8, H100, engine="groq", fitted=True).step(shape).seconds
    assert other == pytest.approx(vllm)  # an engine without fits uses vLLM's
    plain = InstanceCostModel(M8, H100, engine="vllm").step(shape).seconds
    assert plain != pytest.approx(vllm)  # the default roofline keeps device-wide factors


def test_decode_series_matches_steps_with_fitted_attention() -> None:
    import numpy as np

    cm = InstanceCostModel(M8, H100, engine="vllm", graph_launch_factor=0.5, fitted=True)
    ctx = np.array([1000, 1064, 5000, 100_000])
    series = cm.decode_series(64, ctx)
    for j, c in enumerate(ctx):
        assert series.seconds[j] == pytest.approx(cm.step(BatchShape.decode(64, int(c))).seconds,
                                                  rel=1e-9)


def test_fitted_predictor_from_the_scenario() -> None:
    from simulator.runner.run import Simulation
    from tests.conftest import make_scenario

    fitted = Simulation(make_scenario(**{"cost.predictor": "fitted"})).run()
    plain = Simulation(make_scenario(**{"cost.predictor": "roofline"})).run()
    assert fitted.summary["cost_predictor"] == "fitted"
    assert plain.summary["cost_predictor"] == "roofline"
    assert fitted.summary["e2e_mean_s"] != pytest.approx(plain.summary["e2e_mean_s"])


def test_default_predictor_is_fitted_where_the_device_has_fits() -> None:
    """``cost.predictor`` unset: the fitted constants on a device that carries them (H100),
    the device-wide roofline on one that does not (MI300X), and the summary says which."""
    from simulator.runner.run import Simulation
    from tests.conftest import make_scenario

    default = Simulation(make_scenario()).run()
    fitted = Simulation(make_scenario(**{"cost.predictor": "fitted"})).run()
    assert default.summary["cost_predictor"] == "fitted"
    assert default.requests.equals(fitted.requests)
    amd = make_scenario(**{"cluster.pools": [{"name": "main", "role": "colocated",
                                              "device": "MI300X"}]})
    assert load_device("MI300X").operators is None
    assert Simulation(amd).run().summary["cost_predictor"] == "roofline"


def test_summary_names_the_predictor_of_each_device_when_they_differ() -> None:
    from simulator.cost.predictor import predictor_summary

    mi = load_device("MI300X")
    both = [InstanceCostModel(M8, H100, engine="vllm", fitted=True), InstanceCostModel(M8, mi)]
    assert predictor_summary(both) == {"cost_predictor": "fitted (H100-SXM), roofline (MI300X)"}


def test_kernel_fit_recovers_a_known_operator_on_held_out_shapes() -> None:
    """The fit script's solver, on synthetic timings from known constants (no extra needed)."""
    import numpy as np

    from simulator.validation.kernel_fit import Samples, evaluate, fit, training_ape

    true = OperatorFit(compute=0.75, half_flops=5e8, memory=0.85, half_bytes=2e6, half_units=4.0,
                       floor_us=3.0, per_row_ps=1.0)
    rng = np.random.default_rng(0)
    m = rng.integers(1, 8192, 600).astype(float)
    n = rng.choice([1024.0, 4096.0, 8192.0, 14336.0], 600)
    k = rng.choice([1024.0, 4096.0, 8192.0], 600)
    flops, nbytes = 2 * m * n * k, (m * k + k * n) * 2 + m * n * 2
    peak, bw = H100.peak_flops("bf16"), H100.memory_bandwidth
    seconds = true.seconds(peak, bw, flops, nbytes, m, m * k)
    held_out = n == 14336.0  # whole weight shapes the fit never sees
    samples = Samples("gemm", "bf16", flops, nbytes, m, m * k, seconds, held_out, "synthetic")
    fitted = fit(samples, H100)
    row = evaluate(samples, H100, fitted)
    assert row["held_out_rows"] == int(held_out.sum())
    assert row["median_ape_after"] < 1.0
    assert training_ape(samples, H100, fitted) < training_ape(samples, H100, None)


def test_decode_attention_rows_per_kv_head_when_the_fit_counts_them_so() -> None:
    """``row_unit: kv_head``: the per-row term of decode attention scales with sequences x
    KV heads (one thread block per sequence and KV head), not with the query heads."""
    m70 = get_model("Llama-3.1-70B")  # 64 query heads, 8 KV heads
    fit = OperatorFit(compute=0.5, half_flops=0.0, memory=0.8, half_bytes=0.0,
                      floor_us=2.0, per_row_ps=20_000.0)
    costs = {}
    for unit in ("query_head", "kv_head"):
        fits = {"attention_decode": fit.model_copy(update={"row_unit": unit})}
        dev = H100.model_copy(update={"operators": {"vllm": OperatorFits(source="t", fits=fits)}})
        cm = InstanceCostModel(m70, dev, engine="vllm", fitted=True)
        costs[unit] = cm.breakdown(BatchShape.decode(32, 32 * 1000))["attention_decode"]
    rows_saved = 32 * (64 - 8) * m70.num_layers
    assert costs["query_head"] - costs["kv_head"] == pytest.approx(rows_saved * 20e-9, rel=1e-6)


def test_kernel_fit_picks_the_row_unit_that_made_the_data() -> None:
    import numpy as np

    from simulator.validation.kernel_fit import Samples, fit_family

    rng = np.random.default_rng(1)
    batch = rng.choice([1.0, 4.0, 16.0, 64.0, 256.0], 800)
    kv = rng.choice([128.0, 1024.0, 8192.0], 800)
    heads, kvh = rng.choice([32.0, 64.0, 16.0], 800), rng.choice([2.0, 8.0], 800)
    flops = 4 * heads * 128 * kv * batch
    nbytes = batch * (kv * 2 * kvh * 128 * 2 + 2 * heads * 128 * 2)
    peak, bw = H100.peak_flops("bf16"), H100.memory_bandwidth
    for unit, rows in (("kv_head", batch * kvh), ("query_head", batch * heads)):
        true = OperatorFit(compute=0.3, half_flops=0.0, memory=0.85, half_bytes=1e6,
                           half_units=2.0, floor_us=4.0, per_row_ps=20_000.0)
        seconds = true.seconds(peak, bw, flops, nbytes, batch * kvh, rows)
        family = Samples("attention_decode", "bf16", flops, nbytes, batch * kvh, batch * heads,
                         seconds, heads == 16.0, "synthetic", kv_rows=batch * kvh)
        _, fitted = fit_family(family, H100)
        assert fitted.row_unit == unit


def test_summary_sees_through_the_speculative_wrapper() -> None:
    """A pool with speculative decoding wraps its predictor; the summary names the one
    inside (before, the wrapper had no ``fitted`` and read as ``roofline``)."""
    from simulator.cost.predictor import predictor_summary
    from simulator.cost.speculative import Acceptance, SpeculativeConfig, SpeculativePredictor

    spec = SpeculativeConfig("mtp", Acceptance.from_mean(1.8, 1))
    inner = InstanceCostModel(M8, H100, engine="vllm", fitted=True)
    wrapped = SpeculativePredictor(inner, spec, M8.num_layers)
    assert predictor_summary([wrapped]) == {"cost_predictor": "fitted"}


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["H100-SXM", "H200-SXM", "A100-SXM-80GB", "L40S"]),
       st.integers(1, 256), st.integers(0, 200_000))
def test_a_fitted_decode_step_is_never_cheaper_than_its_longest_sequence(
        device: str, seqs: int, extra: int) -> None:
    """The batch shape keeps only the context sum; under the fitted fill term a batch of a
    long and a short sequence priced as equal halves came out cheaper than the long one
    alone (TPOT below the one-sequence floor). ``seqs`` sequences holding ``ctx`` tokens
    are at least as slow as one sequence of ``ctx - (seqs - 1)`` tokens."""
    cm = InstanceCostModel(M8, load_device(device), engine="vllm", fitted=True)
    ctx = seqs + extra
    batch = cm.step(BatchShape.decode(seqs, ctx)).seconds
    alone = cm.step(BatchShape.decode(1, ctx - (seqs - 1))).seconds
    assert batch >= alone * (1 - 1e-12)
