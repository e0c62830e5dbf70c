"""MoE samples of the kernel fit: only gated (SwiGLU) expert layouts are fitted and scored."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from simulator.validation.kernel_fit_samples import gated_moe, moe_samples

_COLUMNS = ["kernel_source", "moe_dtype", "num_tokens", "hidden_size", "inter_size", "topk",
            "num_experts", "moe_tp_size", "moe_ep_size", "distribution", "latency"]


def _table(rows: list[tuple[object, ...]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=_COLUMNS)


def _layouts(tokens: int = 4) -> list[tuple[object, ...]]:
    """One row per layout: gated Mixtral and Qwen3 layouts, non-gated Nemotron-3 layouts
    (Super's latent MoE, Nano) and a TensorRT-LLM non-gated kernel."""
    t = tokens
    return [
        ("sglang_fused_moe_triton", "bfloat16", t, 4096, 14336, 2, 8, 1, 1, "balanced", 0.5),
        ("sglang_fused_moe_triton", "bfloat16", t, 2048, 768, 8, 128, 1, 1, "balanced", 0.1),
        ("sglang_fused_moe_triton", "bfloat16", t, 1024, 2688, 22, 512, 1, 1, "balanced", 0.1),
        ("sglang_flashinfer_cutlass_moe", "bfloat16", t, 2688, 1856, 6, 128, 1, 1,
         "balanced", 0.2),
        ("moe_torch_flow_nongated", "bfloat16", t, 3072, 1024, 8, 256, 1, 1, "balanced", 0.2),
    ]


def test_non_gated_layouts_and_kernels_are_left_out() -> None:
    kept = gated_moe(_table(_layouts()))
    assert sorted(zip(kept["hidden_size"], kept["topk"], strict=True)) == [(2048, 8), (4096, 2)]


def test_a_gated_layout_sharing_expert_count_and_topk_with_nano_is_kept() -> None:
    # Nemotron-3 Nano is 2688/1856 with top-6 of 128; another top-6-of-128 model is gated.
    rows = [("sglang_fused_moe_triton", "bfloat16", 4, 2048, 1408, 6, 128, 1, 1, "balanced",
             0.1)]
    assert len(gated_moe(_table(rows))) == 1


def test_moe_samples_hold_only_gated_layouts(tmp_path: Path) -> None:
    rows = [r for t in (1, 2, 4, 8, 16, 64) for r in _layouts(t)]
    _table(rows).to_parquet(tmp_path / "moe_perf.parquet")
    (bf16,) = moe_samples(tmp_path)
    assert bf16.op == "moe"
    # Two gated layouts x six token counts; the grouped-GEMM depth k is the hidden size.
    assert len(bf16.seconds) == 12
    assert sorted(set(bf16.tiles[3].tolist())) == [2048.0, 4096.0]
