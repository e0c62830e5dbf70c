"""DeepEP dispatch/combine priced from the device's measured single-node kernels."""

from __future__ import annotations

import itertools

import pytest

from simulator.cost.batch import BatchShape
from simulator.cost.moe_comm import EPGroup, alltoall_seconds, low_latency_sms
from simulator.cost.parallel import Parallelism, Precisions
from simulator.cost.step import InstanceCostModel, LinkSet
from simulator.hardware.registry import load_device, load_link
from simulator.models.catalog import get_model

H100 = load_device("H100-SXM")
NVL, IB = load_link("nvlink4"), load_link("ib-ndr")
DSV3 = get_model("DeepSeek-V3")

# AIConfigurator 0.12.0 systems/data/h100_sxm/comm/sglang/0.5.12: hidden 6144, top-8 of 256
# experts, EP 8 (a hidden size the fit never saw), microseconds.
MEASURED_6144 = [
    ("low_latency", "dispatch", 1, 12.914), ("low_latency", "combine", 1, 13.294),
    ("low_latency", "dispatch", 128, 32.694), ("low_latency", "combine", 128, 58.820),
    ("normal", "dispatch", 1, 25.959), ("normal", "combine", 1, 44.337),
    ("normal", "dispatch", 4096, 443.540), ("normal", "combine", 4096, 870.798),
]


def _measured(ranks: int, per_node: int = 8) -> EPGroup:
    return EPGroup(ranks, per_node, NVL, IB, 4, measured=H100.deepep, sm_count=H100.sm_count)


@pytest.mark.parametrize(("kernel", "phase", "tokens", "us"), MEASURED_6144)
def test_shipped_h100_constants_reproduce_held_out_table_points(kernel: str, phase: str,
                                                                tokens: int, us: float) -> None:
    got = alltoall_seconds(phase, kernel, tokens, 6144, 256, 8, _measured(8)) * 1e6  # type: ignore[arg-type]
    assert got == pytest.approx(us, rel=0.25)


def test_link_bandwidth_alone_misses_the_kernels_fixed_latency() -> None:
    plain = EPGroup(8, 8, NVL, IB, 4)
    for kernel, phase, tokens, us in MEASURED_6144[:2] + MEASURED_6144[4:6]:
        assert alltoall_seconds(phase, kernel, tokens, 6144, 256, 8, plain) * 1e6 < 0.5 * us  # type: ignore[arg-type]


def test_low_latency_kernels_launch_one_sm_per_expert_group() -> None:
    assert [low_latency_sms(e, 132) for e in (8, 16, 128, 160, 256, 384)] == [8, 16, 128, 80, 128, 128]
    assert low_latency_sms(256, 148) == 128


def test_few_experts_run_the_low_latency_kernels_on_few_sms() -> None:
    # Same bytes (top-2 of 8 experts vs top-2 of 128): 8 SMs instead of 128.
    few = alltoall_seconds("dispatch", "low_latency", 512, 4096, 8, 2, _measured(8))
    many = alltoall_seconds("dispatch", "low_latency", 512, 4096, 128, 2, _measured(8))
    assert few > 2 * many


@pytest.mark.parametrize("kernel", ["low_latency", "normal"])
def test_measured_exchange_grows_with_tokens_and_never_drops_across_nodes(kernel: str) -> None:
    for ranks in (8, 16, 32):
        times = [alltoall_seconds(p, kernel, t, 7168, 256, 8, _measured(ranks))  # type: ignore[arg-type]
                 for p in ("dispatch", "combine") for t in (1, 16, 128, 1024)]
        assert all(a < b for a, b in itertools.pairwise(times[:4]))
        assert all(a < b for a, b in itertools.pairwise(times[4:]))
    for tokens in (1, 16, 128, 1024):
        one = alltoall_seconds("dispatch", kernel, tokens, 7168, 256, 8, _measured(8))  # type: ignore[arg-type]
        two = alltoall_seconds("dispatch", kernel, tokens, 7168, 256, 8, _measured(16))  # type: ignore[arg-type]
        assert two >= one


def test_measured_group_needs_the_sm_count() -> None:
    with pytest.raises(ValueError, match="sm_count"):
        EPGroup(8, 8, NVL, IB, measured=H100.deepep)


def _dp8(fitted: bool) -> InstanceCostModel:
    return InstanceCostModel(DSV3, H100, Parallelism(1, 1, 8, dp=8), Precisions("fp8", "fp8", "bf16"),
                             LinkSet(), ep_group=EPGroup(8, 8, NVL, IB, 4), engine="sglang",
                             fitted=fitted)


def test_fitted_step_prices_the_nvlink_exchange_as_measured() -> None:
    decode = BatchShape.decode(8 * 128, 8 * 128 * 2000)  # 128 sequences on every rank
    fitted, plain = _dp8(True), _dp8(False)
    assert fitted.ep_group is not None
    assert fitted.ep_group.measured == H100.deepep
    assert plain.ep_group is not None
    assert plain.ep_group.measured is None
    layers = DSV3.num_moe_layers
    per_layer = sum(alltoall_seconds(p, "low_latency", 128, DSV3.hidden_size, DSV3.num_experts,
                                     DSV3.num_experts_per_token, _measured(8))
                    for p in ("dispatch", "combine"))
    assert fitted.breakdown(decode)["moe_alltoall"] == pytest.approx(layers * per_layer)
    assert fitted.breakdown(decode)["moe_alltoall"] > plain.breakdown(decode)["moe_alltoall"]


@pytest.mark.kernels  # deselected by default; `pytest -m kernels` with the extra installed
def test_shipped_constants_are_the_fit_and_beat_the_link_model_on_held_out_sizes() -> None:
    from simulator.runner.kernel_tables import tables_root
    from simulator.validation.deepep_fit import fit_device

    root = tables_root()
    assert root is not None
    for name in ("H100-SXM", "H200-SXM", "B200", "GB200-NVL72"):
        device = load_device(name)
        found = fit_device(root, device, None)
        assert found is not None
        fits, report = found
        assert fits == device.deepep, f"{name}: run python -m simulator.validation.deepep_fit --write"
        for row in report:
            assert row["median_ape_after"] < 10.0, row
            assert row["median_ape_after"] < row["median_ape_before"] / 4, row
