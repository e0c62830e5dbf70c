"""KV pools as each serving engine sizes them (simulator/cost/engine_memory.py)."""

from __future__ import annotations

import pytest

from simulator.cost import Parallelism, Precisions
from simulator.cost.engine_memory import apply_convention
from simulator.cost.memory import plan_memory
from simulator.hardware.engines import load_engine
from simulator.hardware.registry import load_device
from simulator.models.catalog import get_model
from simulator.runner.build import build_plan
from tests.conftest import make_scenario

GIB = 1024**3
H100 = load_device("H100-SXM")
M8 = get_model("Llama-3.1-8B")
M70 = get_model("Llama-3.1-70B")


def _plan(tp: int = 1, util: float = 0.9, dp: int = 1):  # type: ignore[no-untyped-def]
    par = Parallelism(tp=tp, dp=dp)
    return plan_memory(M70 if tp > 1 else M8, H100, par, Precisions("bf16", "bf16", "bf16"),
                       memory_utilization=util, block_size=16, max_batched_tokens=8192,
                       max_seqs=256, runtime_reserve_gib=0.0,
                       kv_elements_per_token_per_layer_device=2 * 8 // min(tp, 8) * 128)


def test_sglang_fraction_holds_weights_and_kv_only() -> None:
    """SGLang: pool = free after loading - total x (1 - mem_fraction_static), i.e.
    total x fraction - weights; the activation peak is not taken out of it again."""
    plan = _plan(util=0.88)
    sg = apply_convention(plan, 0.88, "weights_and_kv")
    kv = H100.memory_bytes * 0.88 - plan.weight_bytes
    assert sg.kv_capacity_tokens == int(kv // plan.kv_bytes_per_token) // 16 * 16
    # vLLM's convention takes the profiled activation peak out of the same fraction.
    assert plan.kv_capacity_tokens < sg.kv_capacity_tokens
    lost = (sg.kv_capacity_tokens - plan.kv_capacity_tokens) * plan.kv_bytes_per_token
    assert lost == pytest.approx(plan.activation_bytes, rel=0.01)


def test_sglang_fraction_follows_the_tp_size() -> None:
    sg = load_engine("sglang")
    assert [sg.memory_fraction(t) for t in (1, 2, 4, 8, 16)] == [0.88, 0.87, 0.85, 0.81, 0.79]
    assert load_engine("vllm").memory_fraction(8) == load_engine("vllm").memory_utilization
    tp1 = build_plan(make_scenario(engine="sglang")).instances[0]
    tp4 = build_plan(make_scenario(**{"engine": "sglang", "model": "Llama-3.1-70B",
                                      "cluster.pools": [{"name": "main", "device": "H100-SXM",
                                                         "parallelism": {"tp": 4}}]})).instances[0]
    weights70 = M70.weight_bytes("bf16") / 4
    per_token = 2 * M70.num_layers * (M70.num_kv_heads // 4) * M70.head_dim * 2
    want = (H100.memory_bytes * 0.85 - weights70) // per_token
    assert tp4.kv_blocks * tp4.block_size == pytest.approx(want, rel=0.01)
    assert tp1.kv_blocks > 0


@pytest.mark.parametrize("convention", ["weights_and_kv", "free_after_weights"])
def test_every_attention_dp_rank_holds_its_own_pool(convention: str) -> None:
    mix = get_model("Mixtral-8x7B")
    plan = plan_memory(mix, H100, Parallelism(tp=1, ep=2, dp=2),
                       Precisions("bf16", "bf16", "bf16"), memory_utilization=0.9,
                       block_size=32, max_batched_tokens=8192, max_seqs=256,
                       runtime_reserve_gib=0.0,
                       kv_elements_per_token_per_layer_device=2 * mix.num_kv_heads * mix.head_dim)
    one_rank = apply_convention(plan, 0.9, convention)
    assert apply_convention(plan, 0.9, convention, dp=2).kv_capacity_tokens == (
        2 * one_rank.kv_capacity_tokens)


def test_unknown_convention_names_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match="device, weights_and_kv, free_after_weights"):
        apply_convention(_plan(), 0.9, "all")


def test_a_bad_fraction_by_tp_is_refused() -> None:
    data = load_engine("sglang").model_dump(mode="json")
    data["memory_utilization_by_tp"] = {1: 1.2}
    from pydantic import ValidationError

    from simulator.hardware.engines import ServingEngineProfile

    with pytest.raises(ValidationError, match="memory_utilization_by_tp"):
        ServingEngineProfile.model_validate(data)


def test_sglang_fraction_follows_tp_size_counting_dp_attention_ranks() -> None:
    """SGLang keys mem_fraction_static on tp_size, which with DP attention is every rank."""
    ds = {"engine": "sglang", "model": "DeepSeek-V3", "precision.weights": "fp8",
          "precision.activations": "fp8", "precision.kv_cache": "fp8"}
    pool = {"name": "main", "device": "H100-SXM", "parallelism": {"tp": 1, "ep": 16, "dp": 16},
            "placement": {"nodes_per_instance": 2}}
    mem = build_plan(make_scenario(**ds, **{"cluster.pools": [pool]})).pools[0].memory
    # weights + KV = the 16-rank fraction of the device (0.79), not the one-rank 0.88
    assert mem.usable_bytes - mem.activation_bytes == pytest.approx(H100.memory_bytes * 0.79)


@pytest.mark.parametrize(("weights", "embed_bytes"), [("fp8", 2.0), ("fp4", 2.0), ("bf16", 2.0),
                                                       ("fp32", 4.0)])
def test_quantised_checkpoints_keep_embedding_and_lm_head_in_16_bits(
        weights: str, embed_bytes: float) -> None:
    """ModelOpt FP8/NVFP4 checkpoints quantise Linear layers only (lm_head excluded): the
    embedding and LM head of Llama-3.1/3.3-70B FP8 take 2 x 128256 x 8192 bytes each, split
    over TP, in the weight memory and hence out of the KV pool."""
    from simulator.cost.memory import stage_weight_bytes
    from simulator.units import bytes_per_element

    model = get_model("Llama-3.1-70B")
    par = Parallelism(tp=2)
    wb = bytes_per_element(weights)
    embed = model.vocab_size * model.hidden_size  # one of embedding, LM head (untied)
    bf16 = stage_weight_bytes(model, par, "bf16")[0]
    got = stage_weight_bytes(model, par, weights)[0]
    rest = bf16 / 2 - 2 * embed / 2  # elements on one device outside embedding and head
    assert got == pytest.approx(rest * wb + 2 * embed / 2 * embed_bytes)
    total = model.weight_bytes(weights)
    assert total == pytest.approx((model.params_total() - model.embedding_params()) * wb
                                  + model.embedding_params() * embed_bytes)
