"""The TP all-reduce fused with the residual add and RMSNorm after it
(``ServingEngineProfile.allreduce_norm_fusion``, TensorRT-LLM's Llama decoder layer)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from simulator.cost import BatchShape, InstanceCostModel, LinkSet, Parallelism
from simulator.cost.operators import RESIDUAL_BYTES
from simulator.hardware.engines import AllReduceNormFusion, engine_names, load_engine
from simulator.hardware.registry import device_names, load_device, load_link
from simulator.models import get_model
from simulator.runner.run import Simulation
from simulator.scenario.schema import Scenario

H100 = load_device("H100-SXM")
M70 = get_model("Llama-3.1-70B")


def _model(tp: int, fusion_bytes: float) -> InstanceCostModel:
    return InstanceCostModel(M70, H100, Parallelism(tp=tp), links=LinkSet(tp=load_link("nvlink4")),
                             norm_fusion_bytes=fusion_bytes)


def test_a_fused_all_reduce_takes_the_two_norm_kernels_of_every_layer() -> None:
    """Decode steps whose all-reduce fits the workspace run one elementwise kernel per layer
    instead of three: the step is shorter by exactly two kernel launches per layer; the
    norms' traffic is still priced."""
    batch = BatchShape.decode(64, 64 * 1000)
    plain, fused = _model(2, 0.0), _model(2, 16e6)
    saved = plain.step(batch).seconds - fused.step(batch).seconds
    assert saved == pytest.approx(2 * M70.num_layers * H100.kernel_launch_us * 1e-6, rel=1e-9)
    ops_plain, ops_fused = plain.breakdown(batch), fused.breakdown(batch)
    assert ops_fused["allreduce"] == ops_plain["allreduce"]
    assert ops_fused["elementwise"] < ops_plain["elementwise"]


def test_an_all_reduce_above_the_workspace_is_not_fused() -> None:
    tokens = 1000
    limit = tokens * M70.hidden_size * RESIDUAL_BYTES  # the step's all-reduce, bytes
    big = BatchShape.decode(tokens, tokens * 500)
    assert _model(2, limit).step(big).seconds < _model(2, 0.0).step(big).seconds
    assert _model(2, limit - 1).step(big).seconds == _model(2, 0.0).step(big).seconds


def test_without_tensor_parallelism_nothing_is_fused() -> None:
    batch = BatchShape.decode(8, 8000)
    one = InstanceCostModel(M70, H100, Parallelism(tp=1), norm_fusion_bytes=16e6)
    assert one.step(batch).seconds == InstanceCostModel(M70, H100).step(batch).seconds


def test_the_workspace_follows_the_device_tp_and_the_hidden_size() -> None:
    rule = AllReduceNormFusion(min_hidden_size=4097, max_message_bytes_by_tp={2: 16e6, 3: 8e6})
    assert rule.max_message_bytes(2, 8192) == 16e6
    assert rule.max_message_bytes(4, 8192) == rule.max_message_bytes(8, 16384) == 8e6
    assert rule.max_message_bytes(1, 8192) == 0.0
    assert rule.max_message_bytes(2, 4096) == 0.0  # Llama-3.1-8B: not fused
    engine = load_engine("trtllm").model_copy(update={"allreduce_norm_fusion": [
        AllReduceNormFusion(devices=["B200"], max_message_bytes_by_tp={2: 1e6}),
        AllReduceNormFusion(max_message_bytes_by_tp={2: 2e6})]})
    assert engine.norm_fusion_bytes("B200", 2, 4096) == 1e6  # the first rule that lists it
    assert engine.norm_fusion_bytes("H100-SXM", 2, 4096) == 2e6
    assert load_engine("sglang").norm_fusion_bytes("H100-SXM", 8, 8192) == 0.0
    with pytest.raises(ValidationError, match=r"max_message_bytes_by_tp: tp 1 -> 8.0; allowed"):
        AllReduceNormFusion(max_message_bytes_by_tp={1: 8.0})
    with pytest.raises(ValidationError, match=r"allowed: tp >= 2 -> bytes >= 0"):
        AllReduceNormFusion(max_message_bytes_by_tp={2: -1.0})
    gaps = AllReduceNormFusion(max_message_bytes_by_tp={2: 8.0, 3: 0.0, 4: 2.0, 5: 0.0})
    assert [gaps.max_message_bytes(tp, 1) for tp in (2, 3, 4, 6, 8)] == [8.0, 0.0, 2.0, 0.0, 0.0]


def _scenario(model: str, device: str, tp: int, engine: str) -> Scenario:
    return Scenario.model_validate({
        "name": "fusion", "model": model, "engine": engine,
        "precision": {"weights": "fp8", "activations": "fp8", "kv_cache": "fp8"},
        "workload": {"arrival": {"kind": "all_at_once"},
                     "input_tokens": {"kind": "fixed", "tokens": 128},
                     "output_tokens": {"kind": "fixed", "tokens": 16}, "num_requests": 4},
        "cluster": {"pools": [{"name": "main", "device": device, "instances": 1,
                               "parallelism": {"tp": tp}}]},
    })


@pytest.mark.parametrize(("model", "device", "tp", "engine", "expected"), [
    ("Llama-3.1-70B", "H100-SXM", 2, "trtllm", 16e6),
    ("Llama-3.1-70B", "H100-SXM", 4, "trtllm", 8e6),
    ("Llama-3.1-8B", "H100-SXM", 2, "trtllm", 0.0),  # hidden size 4,096: not fused
    ("Llama-3.1-70B", "L40S", 2, "trtllm", 0.0),  # no NVLink: NCCL, norms apart
    ("Llama-3.1-70B", "H100-SXM", 4, "vllm", 2 * 2**20),
    ("Llama-3.1-70B", "B200", 4, "vllm", 32 * 2**20),
    ("Llama-3.1-70B", "H100-SXM", 8, "vllm", 2**19),
    ("Llama-3.1-70B", "H100-SXM", 4, "sglang", 0.0),
    ("Llama-3.1-70B", "H100-SXM", 4, "vllm-0.6", 0.0),
])
def test_instances_take_the_engines_rule(model: str, device: str, tp: int, engine: str,
                                         expected: float) -> None:
    cost = Simulation(_scenario(model, device, tp, engine)).plan.instances[0].cost
    assert cost.norm_fusion_bytes == expected
    small = BatchShape.decode(4, 4000)
    unfused = replace(cost, norm_fusion_bytes=0.0).step(small).seconds
    assert (cost.step(small).seconds < unfused) == bool(expected)


def test_shipped_rules_name_shipped_devices() -> None:
    for name in engine_names():
        for rule in load_engine(name).allreduce_norm_fusion:
            assert rule.devices is None or set(rule.devices) <= set(device_names()), name
