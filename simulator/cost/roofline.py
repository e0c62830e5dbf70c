"""The roofline: time of one operator from its FLOPs and bytes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.hardware.operator_fits import OperatorFit
from simulator.hardware.profiles import DeviceProfile


@dataclass(frozen=True, slots=True)
class OpTime:
    seconds: float
    compute_s: float
    memory_s: float
    launch_s: float

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"


def roofline(
    flops: float,
    nbytes: float,
    peak_flops: float,
    bandwidth: float,
    eta_compute: float,
    eta_memory: float,
    launch_s: float = 0.0,
) -> OpTime:
    """``max(flops / (peak * eta_c), bytes / (bw * eta_m)) + launch``.

    Defined for every non-negative input: zero work costs only the launch, and the time
    never decreases when FLOPs or bytes grow (efficiencies are fixed for the call).
    """
    if flops < 0 or nbytes < 0:
        raise ValueError(f"work must be non-negative, got flops={flops}, bytes={nbytes}")
    compute_s = flops / (peak_flops * eta_compute) if flops else 0.0
    memory_s = nbytes / (bandwidth * eta_memory) if nbytes else 0.0
    return OpTime(max(compute_s, memory_s) + launch_s, compute_s, memory_s, launch_s)


def op_time(device: DeviceProfile, precision: str, flops: float, nbytes: float,
            kernels: int = 1) -> OpTime:
    """Roofline time of an operator on ``device``, with the profile's efficiency curves."""
    eff = device.efficiency
    return roofline(
        flops,
        nbytes,
        device.peak_flops(precision),
        device.memory_bandwidth,
        eff.eta_compute(flops, precision),
        eff.eta_memory(nbytes),
        kernels * device.kernel_launch_us * 1e-6,
    )


# ----- tile and wave quantisation of fitted operators ----------------------------------
# A GPU kernel cuts its output into tiles, one thread block each, and runs them in waves
# of one block per SM: a kernel of 133 tiles on 132 SMs takes two waves, and a GEMM whose
# m is not a multiple of its tile computes the padding rows too. The functions below count
# tiles; ``wave_factor`` turns them into the multiplier of a fitted operator's FLOPs
# (:meth:`simulator.hardware.operator_fits.OperatorFit.parts`, ``quant``).

DECODE_SPLIT_TOKENS = 512
"""Context tokens per split-KV partition of a decode-attention kernel (vLLM's paged
attention v2 ``PARTITION_SIZE``; FlashInfer and FlashAttention split long contexts the
same way): a long sequence fills the GPU with partitions, not with one thread block."""


def decode_units(seqs: Any, ctx_tokens: Any, kv_heads: Any,
                 split: int = DECODE_SPLIT_TOKENS) -> Any:
    """Parallel work units of a decode-attention step: (sequence, KV head) pairs, or its
    split-KV partitions when the contexts are long. Grows with every sequence and token, so
    adding a sequence to a batch never makes the step cheaper."""
    if _arr(seqs) or _arr(ctx_tokens):
        return kv_heads * np.maximum(seqs, np.asarray(ctx_tokens, dtype=float) / split)
    return kv_heads * float(max(seqs, float(ctx_tokens) / split))


PREFILL_BLOCK_M = 128
"""Query rows per thread block of a FlashAttention-class prefill kernel (FlashAttention-2
``kBlockM`` = 128 for head dims up to 128, csrc/flash_attn/src/flash_fwd_launch_template.h;
FlashAttention-3 hopper/tile_size.h likewise 128 rows for head dim 128)."""


def kv_reread_bytes(pairs: Any, kv_bytes_per_token: Any) -> Any:
    """Bytes a prefill attention kernel streams re-reading K and V: each block of
    ``PREFILL_BLOCK_M`` query rows loads every key/value before it (FlashAttention-2,
    Dao 2023, section 3.1: K and V are read once per query block; causal blocks past the
    diagonal are skipped), so the KV traffic is ``pairs / PREFILL_BLOCK_M`` tokens of KV,
    counted per KV head (the query heads sharing one are served from L2). With few KV
    heads it is small against the FLOPs; with one per query head (MHA) it can bound the
    kernel. Grows with every token, so a larger batch is never cheaper."""
    return pairs / PREFILL_BLOCK_M * kv_bytes_per_token


def prefill_tiles(seqs: Any, rows: Any, heads: Any, kv_heads: Any, head_dim: Any,
                  pack_gqa: bool = False) -> tuple[Any, Any, Any, Any]:
    """``(groups, m, n, k)`` tile shape of prefill attention for :func:`quantisation`:
    ``rows`` query rows of each of ``seqs`` sequences (``k``, the head dimension, is not
    used: attention fits have neither split-K nor per-tile fixed work).

    ``pack_gqa``: the query heads sharing a KV head are packed into the block's rows
    (FlashAttention-3 PackGQA, always on for the variable-length batches the engines run and
    never for MHA; hopper/heuristics.h ``should_pack_gqa``, flash_api.cpp ``get_pack_gqa``),
    so a block covers ``rows * heads / kv_heads`` rows of one (sequence, KV head) and short
    prompts of a GQA model fill their blocks. Whether a device's kernels pack is chosen by
    the fit (``OperatorFit.pack_gqa``), and always taken with FlashAttention-3's whole key
    blocks (``operator_fits.PACKED_KEY_TILES``)."""
    if pack_gqa:
        return seqs * kv_heads, rows * heads / kv_heads, 1.0, head_dim
    return seqs * heads, rows, 1.0, head_dim


def causal_share(sms: int, tile_m: int, heads: Any, longest_rows: Any, longest_kv: Any,
                 pairs: Any) -> Any:
    """``r`` of :func:`causal_quantisation`: the work of a causal prefill's longest tile
    times the SMs, over the operator's work. The longest tile is the last query block of the
    longest chunk, ``min(tile_m, rows)`` query rows over all ``longest_kv`` keys (a block
    reads the keys up to its last row, and the kernel computes whole blocks); the
    operator's work is ``heads`` x ``pairs``, the causal query-key pairs of every sequence.
    With one long prompt on few heads ``r`` exceeds 1: the kernel waits for that tile."""
    return sms * _min(tile_m, longest_rows) * longest_kv / _max(heads * pairs, 1e-9)


def causal_quantisation(quant: Any, share: Any, tail: float) -> Any:
    """The FLOPs multiplier of causal prefill attention under a persistent tile scheduler
    (``OperatorFit.causal_tail``): the larger of the tile/wave multiplier ``quant``, the
    longest tile alone (``share``, :func:`causal_share`) and the balanced work plus
    ``tail`` of the longest tile for the SMs idle at its end. The product with the FLOPs
    never falls as sequences or rows are added (the longest tile never shrinks)."""
    return _max(quant, _max(share, 1.0 + tail * share))


MIN_TILE_M = 16
"""Smallest tile along ``m``: Ampere's ``mma.m16n8k16`` and the M16 bucket of vLLM's
CUTLASS GEMM dispatch (vllm-project/vllm csrc/quantization/cutlass_w8a8/c3x/
scaled_mm_sm90_fp8_dispatch.cuh: tile configurations per bucket of ``next_pow_2(m)``,
M16 / M64 / M128 / larger)."""


# The tile counts take floats (one step, priced scalar by scalar: math is ~20x faster than
# numpy on them) or numpy arrays (decode series, the fit); the helpers pick which.
def _arr(x: Any) -> bool:
    return isinstance(x, np.ndarray)


def _ceil(x: Any) -> Any:
    return np.ceil(x) if _arr(x) else float(math.ceil(x))


def _floor(x: Any) -> Any:
    return np.floor(x) if _arr(x) else float(math.floor(x))


def _max(a: Any, b: Any) -> Any:
    return np.maximum(a, b) if _arr(a) or _arr(b) else float(max(a, b))


def _min(a: Any, b: Any) -> Any:
    return np.minimum(a, b) if _arr(a) or _arr(b) else float(min(a, b))


def _pow2_ceil(x: Any) -> Any:
    return np.exp2(np.ceil(np.log2(x))) if _arr(x) else 2.0 ** math.ceil(math.log2(x))


def tile_m_for(m: Any, tile_m: int) -> Any:
    """The tile a kernel uses along ``m``: the next power of two of ``m`` (at least
    ``MIN_TILE_M``), up to the family's ``tile_m``: small batches select smaller tiles (the
    dispatch cited above) instead of padding one row to a full tile. Never decreases in m."""
    pow2 = _pow2_ceil(_max(m, 1.0))
    return _min(_max(pow2, min(MIN_TILE_M, tile_m)), tile_m)


TILE_DISPATCH: dict[str, tuple[tuple[int, int, int], ...]] = {
    "cutlass_sm90_fp8": ((64, 64, 64), (128, 64, 128), (0, 128, 128)),
    "sgl_kernel_sm90_fp8": ((256, 64, 64), (0, 128, 128)),
    "flashinfer_cutlass_sm100_nvfp4": ((0, 128, 128),),
}
"""Tile shapes a kernel library picks by batch size, ``(m_max, tile_m, tile_n)`` per bucket
of ``max(64, next_pow_2(m))`` (``m_max`` 0: no bound). ``cutlass_sm90_fp8``: vLLM's CUTLASS
FP8 scaled-MM dispatch for Hopper (vllm-project/vllm
csrc/quantization/cutlass_w8a8/c3x/scaled_mm_sm90_fp8_dispatch.cuh: ``sm90_fp8_config_M64``
64x64 tiles for m <= 64, ``M128`` 64x128 for m <= 128, the default 128x128 above).
``sgl_kernel_sm90_fp8``: SGLang's ``fp8_scaled_mm`` for Hopper (sgl-project/sglang
sgl-kernel/csrc/gemm/fp8_gemm_kernel.cu ``sm90_fp8_dispatch_shape``: 64x64 tiles up to
256 rows, 128x128 above). ``flashinfer_cutlass_sm100_nvfp4``: FlashInfer's CUTLASS NVFP4
block-scaled GEMM for Blackwell (``mm_fp4(..., backend="cutlass")``, which SGLang's NVFP4
linear layers and AIConfigurator's SGLang collector call: ai-dynamo/aiconfigurator
collector/sglang/collect_gemm.py): every SM100 CTA shape it builds is 128 rows tall
(flashinfer-ai/flashinfer include/flashinfer/gemm/fp4_gemm_cutlass_template.h,
``dispatchNVFP4xNVFP4GemmCTAShapeSm100``: 128x64, 128x128 and 128x256), and without autotuning
it runs its first candidate, 128x128 (``getConfigs``), so one row costs a whole 128-row tile
at every ``m``. A fit names one in ``OperatorFit.tile_dispatch`` instead of one
``tile_m x tile_n``."""


TILE_CANDIDATES: dict[str, tuple[tuple[int, int], ...]] = {
    "cublas_fastest": ((64, 64), (128, 128), (128, 256)),
}
"""Tile shapes ``(tile_m, tile_n)`` a library chooses among per GEMM shape, for a fit whose
``OperatorFit.tile_dispatch`` names one: the FLOPs multiplier is the least, over the
candidates, of :func:`wave_factor` times the tile's operand-load factor
``max(1, tile_load_rows * (1 / tile_m + 1 / tile_n))`` (:func:`candidate_factor`).
``cublas_fastest``: cuBLAS, which ``torch.nn.functional.linear`` calls for the BF16 GEMMs of
vLLM, SGLang and TensorRT-LLM's torch flow, picks one of its kernels per ``(m, n, k)`` by a
heuristic that ranks them by expected time; the kernels differ by their thread-block tile
(the CTA tile is part of each kernel's name, e.g. ``..._128x256_...``, ``..._64x64_...``).
Each candidate's tile along ``m`` still follows the next power of two of small batches
(:func:`tile_m_for`). A small tile fills the SMs of a small GEMM, a large one loads fewer
operand bytes per FLOP: a ``tm x tn`` tile reads ``(tm + tn) * k`` elements for
``2 * tm * tn * k`` FLOPs, so below ``tm * tn / (tm + tn) = tile_load_rows`` its loads bound
it (``OperatorFit.tile_load_rows``, fitted). The least of functions that never decrease in
``m`` never decreases either."""


def candidate_factor(tile_m: float, tile_n: float, load_rows: float) -> float:
    """The operand-load factor of a ``tile_m x tile_n`` tile (:data:`TILE_CANDIDATES`)."""
    return max(1.0, load_rows * (1.0 / tile_m + 1.0 / tile_n))


def dispatch_tiles(m: Any, dispatch: str) -> tuple[Any, Any]:
    """``(tile_m, tile_n)`` the dispatch ``dispatch`` (:data:`TILE_DISPATCH`) picks for ``m``
    rows. The tile never shrinks as ``m`` grows."""
    mp2 = _max(_pow2_ceil(_max(m, 1.0)), 64.0)
    buckets = TILE_DISPATCH[dispatch]
    tm, tn = float(buckets[-1][1]), float(buckets[-1][2])
    if _arr(mp2):
        tm_a, tn_a = np.full_like(mp2, tm), np.full_like(mp2, tn)
        for m_max, b_m, b_n in reversed(buckets[:-1]):
            tm_a = np.where(mp2 <= m_max, float(b_m), tm_a)
            tn_a = np.where(mp2 <= m_max, float(b_n), tn_a)
        return tm_a, tn_a
    for m_max, b_m, b_n in buckets[:-1]:
        if mp2 <= m_max:
            return float(b_m), float(b_n)
    return tm, tn


SPLIT_K_TILE = 64
"""Depth of one k-slice of a split-K GEMM: a split never holds less than this of ``k``."""


def gemm_tiles(groups: Any, m: Any, n: Any, k: Any, tile_m: int, tile_n: int,
               split_k: bool = False, dispatch: str = "",
               full_m: bool = False) -> tuple[Any, Any, Any]:
    """(whole, exact, most split) thread blocks of ``groups`` GEMMs of ``m x n`` outputs over
    depth ``k``: ``groups * ceil(m / tm) * ceil(n / tn)``, the same without rounding up, and
    the most k-slices one tile may be split into (1 without ``split_k``).

    ``tile_n = 0`` counts ``n`` as a number of independent units (attention heads), each
    one tile wide, and keeps the full ``tile_m`` along ``m``: a FlashAttention-class kernel
    has one query-block size per head dimension (``kBlockM``, csrc/flash_attn/src/
    flash_fwd_launch_template.h), so a 16-token prompt still occupies a whole block; only
    the GEMM dispatch picks smaller tiles for small ``m`` (:func:`tile_m_for`). Grouped MoE
    GEMMs: ``groups`` experts of ``m`` tokens each. With ``split_k`` a kernel of fewer
    tiles than SMs splits ``k`` over ``floor(SMs / tiles)`` blocks per tile (cuBLAS
    split-K, CUTLASS stream-K; at least ``SPLIT_K_TILE`` of k per split): counted here
    as more blocks of proportionally less work, see :func:`wave_factor`'s ``sms``.
    ``dispatch`` names a tile table by batch size (:func:`dispatch_tiles`), which replaces
    ``tile_m x tile_n``. ``full_m``: the tile keeps its ``tile_m`` rows for small ``m`` too
    (FlashInfer's CUTLASS grouped MoE GEMM on Hopper, ``OperatorFit.moe_kernel``).
    """
    tn: Any = tile_n
    if dispatch and tile_n:
        tm, tn = dispatch_tiles(m, dispatch)
    else:
        tm = tile_m_for(m, tile_m) if tile_n and not full_m else tile_m
    m = _max(m, 1e-9)
    cols = n / tn if tile_n else n
    whole = groups * _ceil(m / tm) * (_ceil(cols) if tile_n else cols)
    exact = groups * (m / tm) * cols
    if split_k:
        return whole, exact, _max(k / SPLIT_K_TILE, 1.0)
    return whole, exact, 1.0


def decode_tiles(seqs: Any, ctx_tokens: Any, kv_heads: Any, split: int) -> tuple[Any, Any]:
    """(whole, exact) thread blocks of a split-KV decode-attention kernel: per KV head, one
    per sequence or one per ``split`` context tokens when contexts are long (the same
    count :func:`simulator.cost.step.decode_units` uses, rounded up to whole partitions).
    Grows with every sequence and token."""
    whole = kv_heads * _max(seqs, _ceil(ctx_tokens / split))
    return whole, kv_heads * _max(seqs, ctx_tokens / split)


def wave_factor(whole: Any, exact: Any, sms: int, max_split: Any = 1.0,
                overhead: Any = 0.0) -> Any:
    """``waves * SMs / (exact tiles * split) * (1 + overhead * split)``, with ``waves =
    ceil(whole tiles * split / SMs)``: the multiplier of an operator's FLOPs for the idle SMs
    of its last wave and the padding of its partial tiles (1 for a kernel of full tiles
    filling whole waves).

    ``split`` (at most ``max_split``; 1 without split-K) is ``floor(SMs / whole tiles)`` for
    a kernel of fewer tiles than SMs. ``overhead`` is each block's fixed work relative to its
    full depth (``tile_k0 / k``: pipeline fill and epilogue), paid once per k-slice. The
    FLOPs times this factor are ``waves * SMs * (FLOPs of one block)``, which never
    decreases as tiles are added, so a fitted step stays monotone in its batch.
    """
    whole = _max(whole, 1.0)
    split = _max(_min(_floor(sms / whole), _floor(max_split)), 1.0)
    waves = _ceil(whole * split / sms)
    return waves * sms / (_max(exact, 1e-9) * split) * (1.0 + overhead * split)


def quantisation(fit: OperatorFit, shape: tuple[Any, ...] | None, sms: int | None,
                 decode: bool = False) -> Any:
    """The FLOPs multiplier of ``fit`` for an operator of ``shape``: 1 where the fit has no
    tiles; else :func:`wave_factor` of ``(groups, m, n, k)`` GEMM-like tiles, or for decode
    attention (``decode``) of ``(sequences, context tokens, KV heads)`` split-KV blocks."""
    if not fit.tile_m or shape is None:
        return 1.0
    if sms is None:
        raise ValueError("a fit with tile_m needs the device's sm_count")
    if decode:
        seqs, ctx, kv_heads = shape[:3]
        whole, exact = decode_tiles(seqs, ctx, kv_heads, fit.tile_m)
        # wave_factor(whole, exact, sms) without split-K or fixed work: its split is 1, so
        # the factor is waves * SMs / exact blocks (the same floats in fewer array passes).
        return _ceil(_max(whole, 1.0) / sms) * sms / _max(exact, 1e-9)
    groups, m, n, k = shape
    if fit.moe_kernel:  # gate+up (n columns over k) and down (k columns over n / 2)
        gate_up = _gemm_quantisation(fit, groups, m, n, k, sms)
        return (2.0 * gate_up + _gemm_quantisation(fit, groups, m, k, n / 2.0, sms)) / 3.0
    return _gemm_quantisation(fit, groups, m, n, k, sms)


def _gemm_quantisation(fit: OperatorFit, groups: Any, m: Any, n: Any, k: Any, sms: int) -> Any:
    """:func:`wave_factor` of ``groups`` GEMMs of ``m x n`` over ``k`` under ``fit``'s tiles
    (with a candidate set, :data:`TILE_CANDIDATES`, the least over its tiles)."""
    overhead = fit.tile_k0 / _max(k, 1.0) if fit.tile_k0 else 0.0
    candidates = TILE_CANDIDATES.get(fit.tile_dispatch)
    if candidates is not None:
        best: Any = None
        for tm, tn in candidates:
            whole, exact, max_split = gemm_tiles(groups, m, n, k, tm, tn, fit.split_k)
            q = (wave_factor(whole, exact, sms, max_split, overhead)
                 * candidate_factor(tm, tn, fit.tile_load_rows))
            best = q if best is None else _min(best, q)
        return best
    whole, exact, max_split = gemm_tiles(groups, m, n, k, fit.tile_m, fit.tile_n, fit.split_k,
                                         fit.tile_dispatch, bool(fit.moe_kernel))
    return wave_factor(whole, exact, sms, max_split, overhead)


def decode_blocks(seqs: int, ctx: np.ndarray, kv_heads: float, tile_m: int,
                  sms: int | None) -> tuple[np.ndarray, Any]:
    """:func:`decode_units` and :func:`quantisation` (``decode``) of a decode series priced
    with a fit whose split-KV partition ``tile_m`` is also its tile (``ctx`` a float array,
    ``tile_m = 0``: multiplier 1): the same operations in the same order, bit for bit
    (tests/test_step_pricing.py), each done once. The units are the exact block count, and
    ``ctx / tile_m``, its quotient, is shared with the whole blocks. With ``seqs`` and
    ``kv_heads`` at least 1 both counts are at least 1, so their floors at 1 and 1e-9 keep
    every value and are left out."""
    split = tile_m or DECODE_SPLIT_TOKENS
    per_split = ctx / split
    units = kv_heads * np.maximum(seqs, per_split)
    if not tile_m:
        return units, 1.0
    if sms is None:
        raise ValueError("a fit with tile_m needs the device's sm_count")
    whole = kv_heads * np.maximum(seqs, np.ceil(per_split))
    if seqs < 1 or kv_heads < 1:  # counts below 1 possible: the floors as in quantisation
        return units, np.ceil(np.maximum(whole, 1.0) / sms) * sms / np.maximum(units, 1e-9)
    return units, np.ceil(whole / sms) * sms / units


def whole_context_quantisation(tiles: Any, ctx_tokens: Any, longest: Any,
                               resident: float | None) -> Any:
    """FLOPs multiplier of a decode kernel whose blocks each read one sequence's whole
    context (:attr:`OperatorFit.head_tile`), ``tiles`` blocks per sequence, ``resident``
    blocks running at once (:attr:`OperatorFit.resident_blocks`, else the SMs): the kernel
    takes at least its work spread over the resident blocks and at least its longest
    block alone, ``max(1, resident x longest / (ctx_tokens x tiles))`` with ``longest``
    the longest sequence's context and ``ctx_tokens`` the batch's sum (the FLOPs,
    proportional to ``ctx_tokens x tiles``, times this are the larger of the two). It
    never decreases as sequences or tokens are added while ``longest`` is the batch's
    longest context."""
    if resident is None:
        raise ValueError("a fit with head_tile needs the device's sm_count")
    return _max(1.0, resident * longest / (_max(ctx_tokens, 1e-9) * tiles))


def scalar_quantisation(fit: OperatorFit, shape: tuple[float, ...], sms: int | None,
                        decode: bool = False) -> float:
    """:func:`quantisation` of one operator's floats (a fit with ``tile_m`` and the device's
    ``sm_count``): the same operations in the same order on plain floats, bit for bit
    (tests/test_step_pricing.py), without the per-call array dispatch of the helpers above:
    a step prices several tile counts, and first-time step prices dominate some runs."""
    if sms is None:
        raise ValueError("a fit with tile_m needs the device's sm_count")
    if decode:  # decode_tiles, then waves * SMs / exact blocks as in quantisation
        seqs, ctx, kv_heads = shape[:3]
        whole = kv_heads * float(max(seqs, float(math.ceil(ctx / fit.tile_m))))
        exact = kv_heads * float(max(seqs, ctx / fit.tile_m))
        return float(math.ceil(max(whole, 1.0) / sms)) * sms / max(exact, 1e-9)
    groups, m, n, k = shape
    if fit.moe_kernel:  # as quantisation: gate+up, then down, weighted by FLOPs
        gate_up = _scalar_gemm_quantisation(fit, groups, m, n, k, sms)
        return (2.0 * gate_up + _scalar_gemm_quantisation(fit, groups, m, k, n / 2.0, sms)) / 3.0
    return _scalar_gemm_quantisation(fit, groups, m, n, k, sms)


def _scalar_gemm_quantisation(fit: OperatorFit, groups: float, m: float, n: float, k: float,
                              sms: int) -> float:
    """:func:`_gemm_quantisation` on plain floats, the same operations in the same order."""
    candidates = TILE_CANDIDATES.get(fit.tile_dispatch)
    if candidates is not None:
        best = math.inf
        for tm, tn in candidates:
            best = min(best, _scalar_tiles(tm, tn, "", False, fit, groups, m, n, k, sms)
                       * candidate_factor(tm, tn, fit.tile_load_rows))
        return best
    return _scalar_tiles(fit.tile_m, fit.tile_n, fit.tile_dispatch, bool(fit.moe_kernel), fit,
                         groups, m, n, k, sms)


def _scalar_tiles(tile_m: int, tile_n: int, dispatch: str, full_m: bool, fit: OperatorFit,
                  groups: float, m: float, n: float, k: float, sms: int) -> float:
    """:func:`gemm_tiles` and :func:`wave_factor` of ``tile_m x tile_n`` tiles (or the
    ``dispatch`` table's) with ``fit``'s split-K and fixed work, on plain floats."""
    tm: float = tile_m
    tn: float = tile_n
    if tile_n and dispatch:  # gemm_tiles with a dispatch table
        tm, tn = dispatch_tiles(m, dispatch)
    elif tile_n and not full_m:  # tile_m_for
        pow2 = 2.0 ** math.ceil(math.log2(float(max(m, 1.0))))
        tm = float(min(float(max(pow2, min(MIN_TILE_M, tile_m))), tile_m))
    m = float(max(m, 1e-9))
    cols = n / tn if tile_n else n
    whole = groups * float(math.ceil(m / tm)) * (float(math.ceil(cols)) if tile_n else cols)
    exact = groups * (m / tm) * cols
    max_split = max(k / SPLIT_K_TILE, 1.0) if fit.split_k else 1.0
    overhead = fit.tile_k0 / float(max(k, 1.0)) if fit.tile_k0 else 0.0
    whole = max(whole, 1.0)  # wave_factor (floats stay floats: max and min pick one)
    split = max(min(float(math.floor(sms / whole)), float(math.floor(max_split))), 1.0)
    waves = float(math.ceil(whole * split / sms))
    return waves * sms / (max(exact, 1e-9) * split) * (1.0 + overhead * split)
