"""The scheduler limits of the shipped trtllm-bench rows are the heuristic's
(simulator/validation/trtllm_limits.py)."""

from __future__ import annotations

import pytest

from simulator._paths import data_dir
from simulator.models.catalog import get_model
from simulator.validation.serving_io import read_serving
from simulator.validation.trtllm_limits import (
    FILES,
    checkpoint_elements,
    kv_cache_requests,
    limits,
    row_limits,
)

ROWS = {"serving_trtllm_llama8b.csv": 20, "serving_trtllm_dense.csv": 40,
        "serving_trtllm_fp4.csv": 40, "serving_trtllm_dense_devguide.csv": 17,
        "serving_trtllm_moe.csv": 19}


@pytest.mark.parametrize("name", FILES)
def test_every_trtllm_bench_row_carries_the_heuristics_limits(name: str) -> None:
    rows = read_serving(data_dir("scenarios") / "validation" / name)
    assert len(rows) == ROWS[name]
    for row in rows.to_dict("records"):
        assert row["arrival"] == "all_at_once"
        assert row_limits(row) == (row["max_num_seqs"], row["max_num_batched_tokens"]), row["line"]


def test_the_8b_worked_example_of_the_docs() -> None:
    """docs/VALIDATION.md: 128/2048 on an H100, FP8 weights and KV cache: about 516
    requests fit, which the heuristic rounds up to 640; the token limit floors at 2048."""
    model = get_model("Llama-3.1-8B")
    assert kv_cache_requests(model, "fp8", "fp8", 81_559, 1, 1, 128, 2048) == pytest.approx(
        516.2, abs=0.1)
    assert limits(model, "fp8", "fp8", 81_559, 1, 1, 128, 2048) == (640, 2048)


def test_tensor_parallelism_multiplies_memory_and_not_the_kv_heads_up_to_their_count() -> None:
    model = get_model("Llama-3.1-405B")  # 8 KV heads: TP8 keeps a full KV row per token
    one = kv_cache_requests(model, "fp8", "fp8", 143_771, 8, 1, 1000, 1000)
    gib = 143_771 / 1024 * 8 - model.params_total() / 1024 ** 3
    per_request = 2 * 126 * 8 * 128 * 2000 / 1024 ** 3
    assert one == pytest.approx(0.95 * gib / per_request)


def test_nvfp4_checkpoints_count_packed_elements_and_block_scales() -> None:
    model = get_model("Llama-3.1-70B")
    kept = model.embedding_params() + model.num_layers * model.norm_params_per_layer()
    linear = model.params_total() - kept
    assert checkpoint_elements(model, "fp8") == model.params_total()
    assert checkpoint_elements(model, "fp4") == linear // 2 + linear // 16 + kept
    assert 40.5e9 < checkpoint_elements(model, "fp4") < 40.7e9
