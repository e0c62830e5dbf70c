"""Prefill attention that computes whole key blocks up to the causal diagonal
(``OperatorFit.key_tiles``: FlashAttention-3's and TensorRT-LLM's SM90 tiles)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from simulator.cost import BatchShape, InstanceCostModel
from simulator.hardware import load_device
from simulator.hardware.operator_fits import (
    KEY_TILES,
    PACKED_KEY_TILES,
    OperatorFit,
    OperatorFits,
    key_tile_extra,
)
from simulator.models import get_model
from simulator.validation.kernel_fit import key_tile_choice
from simulator.validation.kernel_fit_predict import flops
from simulator.validation.kernel_fit_samples import Samples

H100 = load_device("H100-SXM")
PREFILL = OperatorFit(compute=0.6, half_flops=1e8, memory=0.7, half_bytes=1e6, floor_us=5.0,
                      per_row_ps=200.0, tile_m=128)


def _computed_pairs(rows: int, past: int, tile_m: int, tile_n: int) -> int:
    """Query-key pairs a causal kernel of ``tile_m`` x ``tile_n`` tiles computes for
    ``rows`` new tokens on ``past`` cached ones: each query block's rows take whole key
    blocks up to its last row (FlashAttention-3 ``n_block_max``), at most the keys there are
    rounded up to a block."""
    keys = past + rows
    total = 0
    for block in range(math.ceil(rows / tile_m)):
        first, last = block * tile_m, min((block + 1) * tile_m, rows)
        blocks = min(math.ceil((past + (block + 1) * tile_m) / tile_n), math.ceil(keys / tile_n))
        total += (last - first) * blocks * tile_n
    return total


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(KEY_TILES)), st.sampled_from([64, 96, 128, 192, 256]),
       st.integers(1, 12), st.integers(0, 4096))
def test_the_extra_keys_are_what_whole_key_blocks_compute(table: str, head_dim: int,
                                                          cycles: int, past: int) -> None:
    """Over whole cycles of query blocks (their count a multiple of N / gcd(M, N)) the key
    blocks' rounding repeats, and the pairs computed are the causal pairs plus
    ``key_tile_extra`` per row, exactly, with or without cached context (the last key block
    is then never cut short: its keys are a whole number of blocks only where it ends)."""
    _, tile_m, tile_n = next(r for r in KEY_TILES[table] if head_dim <= r[0])
    rows = cycles * tile_m * (tile_n // math.gcd(tile_m, tile_n))
    past = past // tile_n * tile_n  # a cache of whole key blocks: the cycle starts aligned
    exact = rows * past + rows * (rows + 1) / 2
    computed = _computed_pairs(rows, past, tile_m, tile_n)
    assert computed == exact + rows * key_tile_extra(table, head_dim)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(KEY_TILES)), st.sampled_from([64, 128, 256]),
       st.integers(1, 20000), st.integers(0, 20000))
def test_any_prompt_is_charged_within_one_key_block_per_row_of_its_kernel(
        table: str, head_dim: int, rows: int, past: int) -> None:
    """Outside whole cycles the charge is an average: it never misses more than a key block
    per row and never adds more than one (the last block's rounding, for prompts shorter
    than a key block)."""
    _, tile_m, tile_n = next(r for r in KEY_TILES[table] if head_dim <= r[0])
    exact = rows * past + rows * (rows + 1) / 2
    charged = exact + rows * key_tile_extra(table, head_dim)
    computed = _computed_pairs(rows, past, tile_m, tile_n)
    assert abs(charged - computed) <= rows * tile_n


def test_the_fa3_tiles_at_head_dim_128() -> None:
    # vllm-project/flash-attention hopper/tile_size.h: causal 16-bit 128 x 128, FP8 over a
    # paged cache without TMA 128 x 160.
    assert key_tile_extra("fa3_sm90_bf16", 128) == (127 + 0) / 2
    assert key_tile_extra("fa3_sm90_fp8", 128) == (127 + 160 - 32) / 2
    assert key_tile_extra("fa3_sm90_fp8", 64) == (191 + 160 - 32) / 2  # 192 x 160
    assert key_tile_extra("fa3_sm90_bf16", 512) == key_tile_extra("fa3_sm90_bf16", 256)
    # TensorRT-LLM's SM90 context kernels (fmha_cubin.h): 64 x 128 (16-bit), 64 x 256 (E4M3).
    assert key_tile_extra("fmha_v2_sm90_bf16", 128) == (63 + 128 - 64) / 2
    assert key_tile_extra("fmha_v2_sm90_fp8", 128) == (63 + 256 - 64) / 2


def _h100(fit: OperatorFit, model: str = "Llama-3.1-8B") -> InstanceCostModel:
    device = H100.model_copy(update={"operators": {"vllm": OperatorFits(
        source="t", fits={"attention_prefill": fit})}})
    return InstanceCostModel(get_model(model), device, engine="vllm", fitted=True)


@pytest.mark.parametrize("shape", [BatchShape.prefill(1024), BatchShape.prefill(3000, 1000),
                                   BatchShape.build([(512, 0, True), (2048, 4096, False)])])
def test_the_step_charges_each_new_token_the_extra_keys(shape: BatchShape) -> None:
    """Only the FLOPs change, by 4 x head dim x query heads per extra key of each new token;
    bytes, units and the tile/wave multiplier (which follow the causal pairs) do not."""
    plain = _h100(PREFILL)._prefill_attention_op(shape)
    keyed = _h100(PREFILL.model_copy(update={"key_tiles": "fa3_sm90_fp8"})
                  )._prefill_attention_op(shape)
    # Llama-3.1-8B: 32 query heads over 8 KV heads, packed 4 to a token in a block's rows.
    extra = 4 * 32 * 128 * shape.prefill_tokens * key_tile_extra("fa3_sm90_fp8", 128, 4)
    assert key_tile_extra("fa3_sm90_fp8", 128, 4) != key_tile_extra("fa3_sm90_fp8", 128)
    assert keyed[0] == pytest.approx(plain[0] + extra, rel=1e-12)
    assert keyed[1:] == plain[1:]
    # A longer prompt never costs less, and the step prices it.
    cost = _h100(PREFILL.model_copy(update={"key_tiles": "fa3_sm90_fp8"}))
    assert cost.step(shape).seconds > _h100(PREFILL).step(shape).seconds


def test_the_fit_charges_the_measured_shapes_the_same_extra_keys() -> None:
    """The kernel tables time ``sequences`` prompts of ``rows`` tokens: the fit's FLOPs are
    the causal pairs' plus the extra keys of every row, per head dimension and query heads
    per KV head."""
    seqs, rows, heads, kvh, hd = (np.array(v, dtype=float) for v in (
        [4, 1], [1024, 8192], [32, 16], [8, 4], [128, 64]))
    pairs = rows * (rows + 1) / 2
    samples = Samples("attention_prefill_kv_fp8", "bf16", 4 * heads * hd * pairs * seqs,
                      np.ones(2), seqs * heads, seqs * rows * heads, np.ones(2),
                      np.zeros(2, dtype=bool), "t", tiles=(seqs, rows, heads, kvh, hd))
    keyed = PREFILL.model_copy(update={"key_tiles": "fa3_sm90_fp8"})
    got = flops(samples, keyed, np.arange(2))
    want = [4 * h * d * s * (p + r * key_tile_extra("fa3_sm90_fp8", d, h / g))
            for h, g, d, s, p, r in zip(heads, kvh, hd, seqs, pairs, rows, strict=True)]
    assert list(got) == pytest.approx(want, rel=1e-12)
    assert list(flops(samples, PREFILL, np.arange(2))) == list(samples.flops)


def test_the_tables_are_offered_where_the_engines_run_flashattention3() -> None:
    assert key_tile_choice("vllm", H100, "attention_prefill") == "fa3_sm90_bf16"
    assert key_tile_choice("sglang", H100, "attention_prefill_kv_fp8") == "fa3_sm90_fp8"
    assert key_tile_choice("trtllm", H100, "attention_prefill") == "fmha_v2_sm90_bf16"
    assert key_tile_choice("trtllm", H100, "attention_prefill_kv_fp8") == "fmha_v2_sm90_fp8"
    assert key_tile_choice("trtllm", load_device("B200"), "attention_prefill") == ""
    assert key_tile_choice("vllm", load_device("B200"), "attention_prefill") == ""
    assert key_tile_choice("vllm", H100, "attention_prefill_mla") == ""
    assert key_tile_choice("vllm", H100, "attention_decode") == ""


def test_key_tiles_are_refused_outside_prefill_attention() -> None:
    keyed = PREFILL.model_copy(update={"key_tiles": "fa3_sm90_bf16"})
    for family in ("attention_decode", "attention_prefill_mla", "gemm"):
        with pytest.raises(ValidationError, match=rf"{family}\.key_tiles: only prefill"):
            OperatorFits(source="t", fits={family: keyed})
    OperatorFits(source="t", fits={"attention_prefill_kv_fp8": keyed})
    with pytest.raises(ValidationError, match="key_tiles"):
        OperatorFit.model_validate({**PREFILL.model_dump(), "key_tiles": "fa2"})


def _packed_pairs(tokens: int, past: int, group: int, tile_m: int, tile_n: int) -> int:
    """Query-key pairs FlashAttention-3 computes for one KV head when it packs GQA: its rows
    are (token, query head) pairs, row ``r`` of token ``r // group``, and each block of
    ``tile_m`` rows takes whole key blocks up to the last token it holds."""
    rows, keys = tokens * group, past + tokens
    total = 0
    for block in range(math.ceil(rows / tile_m)):
        first, last = block * tile_m, min((block + 1) * tile_m, rows)
        last_token = (last - 1) // group
        blocks = min(math.ceil((past + last_token + 1) / tile_n), math.ceil(keys / tile_n))
        total += (last - first) * blocks * tile_n
    return total


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(PACKED_KEY_TILES)), st.sampled_from([64, 128, 256]),
       st.integers(1, 24), st.integers(1, 3), st.integers(0, 4096))
def test_packed_gqa_rows_compute_the_extra_keys_of_their_blocks(
        table: str, head_dim: int, group: int, periods: int, past: int) -> None:
    """With the query heads of a KV head packed into a block's rows, a block spans
    ``tile_m / group`` tokens: over whole periods of blocks and key rounding the pairs
    computed are the causal pairs of every (token, head) row plus ``key_tile_extra`` per row,
    exactly, with or without cached context."""
    _, tile_m, tile_n = next(r for r in KEY_TILES[table] if head_dim <= r[0])
    tokens = periods * math.lcm(tile_m, group * tile_n) // group
    past = past // tile_n * tile_n
    exact = group * (tokens * past + tokens * (tokens + 1) // 2)
    computed = _packed_pairs(tokens, past, group, tile_m, tile_n)
    assert computed == pytest.approx(
        exact + tokens * group * key_tile_extra(table, head_dim, group), rel=1e-12)


def test_only_flashattention3_packs_and_one_head_is_the_unpacked_charge() -> None:
    assert {"fa3_sm90_bf16", "fa3_sm90_fp8"} == PACKED_KEY_TILES
    for table in KEY_TILES:
        assert key_tile_extra(table, 128, 1) == key_tile_extra(table, 128)
    # FP8 at head dim 128 (128 x 160): 16 tokens per block at 8 heads per KV head.
    assert key_tile_extra("fa3_sm90_fp8", 128, 8) == (15 + 160 - 16) / 2
    assert key_tile_extra("fa3_sm90_fp8", 128, 8) < key_tile_extra("fa3_sm90_fp8", 128)
    # TensorRT-LLM's kernels run one head per block: the group changes nothing.
    assert key_tile_extra("fmha_v2_sm90_fp8", 128, 8) == key_tile_extra("fmha_v2_sm90_fp8", 128)
