"""The TP all-reduce sums the 16-bit hidden state at every GEMM precision (cost/operators.py
``RESIDUAL_BYTES``), and the engines' measured curves are keyed by its element count."""

from __future__ import annotations

import pytest

from simulator.cost import BatchShape, InstanceCostModel, LinkSet, Parallelism, Precisions
from simulator.hardware.registry import load_device, load_link
from simulator.models import get_model


def _allreduce_s(precision: str) -> float:
    dev = load_device("B200")
    cost = InstanceCostModel(get_model("Llama-3.1-70B"), dev, Parallelism(tp=4),
                             Precisions(precision, precision, "fp8"),
                             LinkSet(tp=load_link(dev.scale_up_link)), engine="trtllm",
                             fitted=True)
    assert cost._ar_curves.get(4) is not None
    return cost.breakdown(BatchShape.decode(512, 512 * 1000))["allreduce"]


@pytest.mark.parametrize("precision", ["fp8", "fp4"])
def test_allreduce_does_not_shrink_with_gemm_precision(precision: str) -> None:
    assert _allreduce_s(precision) == pytest.approx(_allreduce_s("bf16"), rel=1e-12)
