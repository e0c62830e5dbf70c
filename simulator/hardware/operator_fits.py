"""Per-operator roofline constants fitted on measured kernels, and engines' all-reduce curves.

A device profile (:class:`simulator.hardware.profiles.DeviceProfile`) carries these per
serving engine (its ``operators`` key); the cost model prices each operator family through
:class:`OperatorFit` and each in-domain all-reduce through :class:`CollectiveCurve`.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator


class Frozen(BaseModel):
    """Immutable profile record: unknown keys are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)


OperatorClass = Literal["gemm", "gemm_fp8", "gemm_fp4", "attention_prefill", "attention_decode",
                        "attention_prefill_kv_fp8", "attention_decode_kv_fp8",
                        "attention_prefill_mla", "attention_decode_mla",
                        "attention_prefill_mla_kv_fp8", "attention_decode_mla_kv_fp8",
                        "moe", "moe_fp8", "moe_flashinfer_trtllm", "moe_fp8_flashinfer_trtllm",
                        "moe_tuned", "moe_few_tokens", "elementwise"]
"""``*_kv_fp8``: attention over an FP8 KV cache, a kernel of its own (see OperatorFit);
``*_mla``: multi-head latent attention (DeepSeek-V2/V3), whose kernels are not the GQA ones;
``moe_flashinfer_trtllm`` / ``moe_fp8_flashinfer_trtllm``: BF16 / FP8 experts on FlashInfer's
TensorRT-LLM fused MoE, which SGLang runs for some architectures on Blackwell
(:func:`moe_kernel_family`); ``moe_tuned``: BF16
experts on SGLang's Triton fused MoE where the engine ships a tuned kernel configuration for
the layout (:data:`SGLANG_TUNED_MOE_CONFIGS`), ``moe`` where it falls back to its default,
and ``moe_few_tokens`` on that default for batches of at most as many tokens as the rank has
experts, where the default's blocks are others (:func:`moe_fit_labels`)."""

SGLANG_FLASHINFER_TRTLLM_MOE: dict[str, tuple[str, ...]] = {
    "Qwen3MoeForCausalLM": ("bf16", "fp8", "fp4"),
    "Qwen3VLMoeForConditionalGeneration": ("bf16", "fp8", "fp4"),
    "Qwen3NextForCausalLM": ("bf16", "fp8", "fp4"),
    "Qwen3_5MoeForConditionalGeneration": ("bf16", "fp8", "fp4"),
    "DeepseekV3ForCausalLM": ("fp8", "fp4"),
    "GlmMoeDsaForCausalLM": ("bf16", "fp8", "fp4"),
}
"""Architectures (and expert precisions) SGLang runs on FlashInfer's TensorRT-LLM fused MoE
(``--moe-runner-backend flashinfer_trtllm``) on Blackwell SM100 when the backend is left at
``auto`` and no all-to-all backend is set; every other case of ``auto`` runs BF16 experts on
the Triton fused MoE. From sgl-project/sglang python/sglang/srt/server_args.py
(``ServerArgs._handle_model_specific_adjustments``, SGLang 0.5.x, the series of the 0.5.14
tables): the Qwen3 MoE family (Qwen3-MoE, Qwen3-VL-MoE, Qwen3-Next, Qwen3.5-MoE) with
unquantised, FP8 or ModelOpt FP4 experts; DeepSeek-V3 with FP8 or ModelOpt FP8/FP4 experts.
The engine's B200 and GB200 tables agree layout by layout (the ``kernel_source`` column of
aiconfigurator-core 0.12.0 systems/data/{b200_sxm,gb200}/moe/sglang/0.5.14/moe_perf.parquet):
the Qwen3 and Qwen3.5 MoE layouts on ``sglang_flashinfer_trtllm_moe``, Mixtral, Llama-4 and
Gemma-4 on ``sglang_fused_moe_triton``. GLM-5 (``GlmMoeDsaForCausalLM``) is listed from the
tables, which time its BF16 experts on the TensorRT-LLM kernel."""


SGLANG_TUNED_MOE_CONFIGS: dict[str, frozenset[tuple[int, int]]] = {
    "h100_sxm": frozenset({
        (1, 3072), (8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168), (16, 1024),
        (16, 1344), (16, 1856), (16, 2048), (16, 2688), (20, 2048), (24, 1024), (32, 224),
        (32, 448), (32, 896), (32, 928), (32, 1792), (32, 1856), (64, 192), (64, 320),
        (64, 384), (64, 464), (64, 640), (64, 768), (64, 928), (64, 1280), (64, 1536),
        (64, 1856), (64, 2688), (65, 1536), (128, 192), (128, 232), (128, 352), (128, 384),
        (128, 464), (128, 512), (128, 704), (128, 768), (128, 928), (128, 1344), (128, 1856),
        (128, 2688), (144, 512), (256, 672), (256, 1344), (256, 2688), (512, 64), (512, 128),
        (512, 336), (512, 672), (512, 1344), (512, 2688)}),
    "h200_sxm": frozenset({
        (8, 1792), (8, 2048), (8, 3584), (8, 4096), (8, 7168), (8, 14336), (16, 1024),
        (20, 1536), (64, 320), (64, 640), (64, 1280), (64, 2560), (128, 192), (128, 384),
        (128, 704), (128, 768), (129, 384), (161, 192), (512, 64), (512, 128), (512, 256)}),
    "b200_sxm": frozenset({
        (16, 1024), (16, 1856), (16, 2048), (32, 224), (32, 448), (32, 896), (32, 928),
        (32, 1792), (32, 1856), (64, 192), (64, 384), (64, 464), (64, 768), (64, 928),
        (64, 1536), (64, 1856), (64, 2688), (128, 232), (128, 352), (128, 464), (128, 704),
        (128, 928), (128, 1344), (128, 1856), (128, 2688), (256, 256), (256, 512), (256, 672),
        (256, 1344), (256, 2688), (512, 128), (512, 256), (512, 336), (512, 672), (512, 1344),
        (512, 2688)}),
    "a100_sxm": frozenset({
        (1, 1792), (1, 3584), (1, 7168), (1, 14336), (8, 1792), (8, 2048), (8, 3584),
        (8, 4096), (8, 7168), (16, 1344), (16, 1792), (16, 2688), (16, 3584), (16, 7168),
        (16, 14336), (64, 640), (64, 1280), (257, 64)}),
    "l40s": frozenset({(8, 3584), (128, 928), (128, 1856)}),
}
"""``(E, N)`` layouts for which SGLang ships a tuned configuration of its Triton fused-MoE
kernel with unquantised (BF16/FP16) experts, per system of the kernel tables. ``E`` is the
experts one rank holds (``w2.shape[0]``) and ``N`` the expert intermediate size per rank
(``w2.shape[2]``, the intermediate size over the experts' TP). Read from the file names of
the ``sglang`` 0.5.14 wheel on PyPI (the engine version of the tables),
``sglang/srt/layers/moe/moe_runner/triton_utils/configs/triton_*/
E={E},N={N},device_name={torch device name}.json``, every Triton-version folder: the engine
looks in its own Triton version's folder first and then in the others, newest first, and
otherwise uses ``get_default_config`` (64 x 64 x 32 blocks, or 16 x 32 x 64 where the tokens
are at most ``E``) (``fused_moe_triton_config.py``, ``get_moe_configs``,
``try_get_optimal_moe_config``). Device names: ``NVIDIA_H100_80GB_HBM3``, ``NVIDIA_H200``,
``NVIDIA_B200``, ``NVIDIA_A100-SXM4-80GB``, ``NVIDIA_L40S``; the wheel has none for GB200.
In the engine's H100 tables the single curve fitted over both priced the tuned layouts a
median 29 % too slow on held-out shapes, so the two are fitted apart (``moe_tuned`` and
``moe``)."""


def tuned_moe_layout(tuned: frozenset[tuple[int, int]], experts: float,
                     intermediate: float) -> bool:
    """Whether ``experts`` experts per rank of ``intermediate`` columns per rank (whole numbers
    only) are one of the ``tuned`` layouts (:data:`SGLANG_TUNED_MOE_CONFIGS`)."""
    key = (int(experts), int(intermediate))
    return key == (experts, intermediate) and key in tuned


def few_token_batch(tokens: Any, experts: Any) -> Any:
    """Whether the Triton fused MoE's default configuration takes its few-token blocks
    (16 x 32 rather than 64 x 64) for a batch of ``tokens`` on a rank of ``experts``
    experts: at most as many tokens as experts (``get_default_config``, ``M <= E``)."""
    return tokens <= experts



EXPANDED_SCALE_BLOCK = 128
"""Columns of one FP8 scale block of the DeepSeek-style block-scaled activation (one thread
block's columns in the expanded-space activation kernel, :func:`expanded_activation_blocks`)."""


def expanded_activation_blocks(tokens: Any, topk: Any, intermediate: Any, sm_count: int) -> Any:
    """Thread-block iterations of the separate SwiGLU + FP8 re-quantisation kernel that
    FlashInfer's TensorRT-LLM-gen fused MoE runs between its two grouped GEMMs for
    block-scaled FP8 experts (``activationDeepSeekKernel``; flashinfer-ai/flashinfer
    csrc/trtllm_fused_moe_dev_kernel.cu, ``activation::run`` with ``mUseDeepSeekFp8``).

    The kernel grids over the *expanded* slots of the whole batch the kernel is handed,
    ``tokens`` x ``topk``, not over the rank's own rows: one 128-thread block per
    (128-column scale block of the ``intermediate`` output columns, group of tokens, top-k
    slot), each looking its slot up in ``expandedIdxToPermutedIdx`` and running a block-wide
    max reduction and a barrier whether or not the slot is on the rank (-1: another rank's
    expert). Tokens per block: 4 where ``scale blocks x tokens x topk`` exceeds 32 x the SMs,
    2 above 4 x the SMs, else 1 (the launcher's heuristic). Under expert parallelism without a
    token exchange every rank is handed every token, so the count does not fall with EP while
    the rank's own rows do. (TensorRT-LLM later added a kernel over the permuted rows for that
    reason: NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/trtllmGenKernels/blockScaleMoe/
    DevKernel.cu, ``activationDeepSeekPermutedKernel``.)"""
    blocks = np.ceil(np.asarray(intermediate, dtype=float) / EXPANDED_SCALE_BLOCK)
    tok, k = np.asarray(tokens, dtype=float), np.asarray(topk, dtype=float)
    launched = blocks * tok * k
    per_block = np.where(launched > 32 * sm_count, 4.0, np.where(launched > 4 * sm_count,
                                                                 2.0, 1.0))
    out = blocks * np.ceil(tok / per_block) * k * (tok > 0)
    return out if out.ndim else float(out)

def moe_fit_labels(engine: str | None, tables: str | None, architecture: str, precision: str,
                   experts: float, intermediate: float,
                   deepep: bool) -> tuple[tuple[str, ...], str | None]:
    """The fit labels that price the routed experts of a model of ``architecture`` with
    experts at ``precision`` (``bf16``, ``fp8``, ``fp4``), ``experts`` per rank of
    ``intermediate`` columns per rank, on the system ``tables`` under ``engine``: the
    labels to try in order, and the label of the few-token batches' fit (:func:`few_token_batch`)
    or None. SGLang's dispatch:

    - on Blackwell, the kernel :func:`moe_kernel_family` names, where the profile has it;
    - with DeepEP (``deepep``: data-parallel attention) FP8 experts on DeepGEMM's grouped
      GEMMs (sglang/srt/layers/moe/ep_moe/layer.py, ``DeepEPMoE``: JIT DeepGEMM with an
      ``Fp8Config``), which its tables do not time: no fit, the device-wide roofline;
    - BF16 experts on the Triton fused MoE with a tuned configuration
      (:data:`SGLANG_TUNED_MOE_CONFIGS`, ``moe_tuned``) or its default (``moe``, and
      ``moe_few_tokens`` for the few-token blocks).
    """
    base = {"bf16": "moe", "fp8": "moe_fp8"}.get(precision)
    if base is None or (engine == "sglang" and precision == "fp8" and deepep):
        return (), None
    kernel = moe_kernel_family(engine, architecture, precision)
    if kernel:
        return (base + kernel, base), None
    if engine == "sglang" and precision == "bf16":
        if tables is not None and tuned_moe_layout(
                SGLANG_TUNED_MOE_CONFIGS.get(tables, frozenset()), experts, intermediate):
            return ("moe_tuned", "moe"), None
        return ("moe",), "moe_few_tokens"
    return (base,), None


def moe_kernel_family(engine: str | None, architecture: str, precision: str) -> str:
    """The fit label suffix of the MoE kernel ``engine`` runs for a model of
    ``architecture`` with experts at ``precision``: ``'_flashinfer_trtllm'`` where SGLang
    selects FlashInfer's TensorRT-LLM MoE (:data:`SGLANG_FLASHINFER_TRTLLM_MOE`), else ''.
    The step model applies it only where the device's profile holds that fit (the engine's
    tables timed the kernel there: Blackwell SM100)."""
    if engine == "sglang" and precision in SGLANG_FLASHINFER_TRTLLM_MOE.get(architecture, ()):
        return "_flashinfer_trtllm"
    return ""

HEAD_DIM_REF = 128
"""Head dimension at which :attr:`OperatorFit.head_dim_exp` scales nothing."""

COLLECTOR_ROTARY_DIM = 128
"""The rotary dimension AIConfigurator's collector gives every TensorRT-LLM attention layout
it times (ai-dynamo/aiconfigurator collector/trtllm/collect_attn.py, ``RopeParams(dim=128)``,
whatever the head dimension): a measured shape of a smaller head dimension runs a separate
RoPE kernel before Hopper's XQA (:attr:`OperatorFit.rope_kernel_us`)."""

WHOLE_CONTEXT = 1 << 30
"""Decode attention's ``tile_m`` (its split-KV partition, context tokens) for a kernel that
does not split the context: one thread block reads a sequence's whole KV, so a partition
longer than any context (:attr:`OperatorFit.head_tile`)."""


KEY_TILES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "fa3_sm90_bf16": ((64, 192, 128), (96, 192, 128), (128, 128, 128), (192, 128, 96),
                      (256, 128, 80)),
    "fa3_sm90_fp8": ((64, 192, 160), (96, 192, 128), (128, 128, 160), (192, 128, 160),
                     (256, 128, 128)),
    "fmha_v2_sm90_bf16": ((64, 64, 256), (128, 64, 128), (256, 64, 64)),
    "fmha_v2_sm90_fp8": ((128, 64, 256), (256, 64, 128)),
}
"""``(largest head dimension, kBlockM, kBlockN)`` of a prefill-attention kernel's tiles
(:attr:`OperatorFit.key_tiles`): FlashAttention-3 on SM90, causal, over a paged KV cache
whose pages TMA cannot load (vLLM's 16-token blocks, SGLang's 1-token pages), for a 16-bit and
an FP8 query and KV cache (vllm-project/flash-attention hopper/tile_size.h,
``tile_size_fwd_sm90``: 16-bit, head dim 128: 128 x 128 when causal; FP8: 128 x 160 with
``paged_kv_non_TMA``); TensorRT-LLM's warp-specialised SM90 context kernels over a paged KV
cache, 16-bit and E4M3, their query rows and keys per tile as the kernel names give them
(NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/contextFusedMultiHeadAttention/cubin/
fmha_cubin.h, ``fmha_v2_flash_attention_{bf16,e4m3}_<rows>_<keys>_S_q_paged_kv_<head
dim>_tma_ws_sm90``: 16-bit 64 x 256 up to head dim 64, 64 x 128 up to 128, 64 x 64 above;
E4M3 64 x 256 up to 128, 64 x 128 above)."""


PACKED_KEY_TILES = frozenset({"fa3_sm90_bf16", "fa3_sm90_fp8"})
"""The :data:`KEY_TILES` whose kernel packs the query heads of a KV head into one block's rows
(:func:`key_tile_extra`'s ``group``): FlashAttention-3 always packs GQA over a paged KV cache
TMA cannot load and for variable-length batches, as the engines run it
(vllm-project/flash-attention hopper/flash_api.cpp ``get_pack_gqa``, hopper/heuristics.h
``should_pack_gqa``). TensorRT-LLM's context kernels run one head per block."""


EXPOSED_FAMILIES = ("gemm", "moe", "attention_prefill")
"""Prefixes of the operator families that may carry :attr:`OperatorFit.exposed`."""


def takes_key_tiles(family: str) -> bool:
    """Whether the operator family ``family`` may carry :attr:`OperatorFit.key_tiles`: prefill
    attention, not MLA (whose prefill kernels the tables do not describe)."""
    return family.startswith("attention_prefill") and "mla" not in family


def key_tile_extra(table: str, head_dim: float, group: float = 1.0) -> float:
    """Keys per query row a causal prefill kernel with :data:`KEY_TILES` ``table`` computes
    beyond the row's own causal keys, on average over its query blocks: a block of ``M``
    rows computes whole blocks of ``N`` keys up to its last row, ``(M - 1) / 2`` keys past
    the diagonal per row and on average ``(N - gcd(M, N)) / 2`` more for the last key block
    rounded up. Exact for every prompt of whole query blocks whose count is a multiple of
    ``N / gcd(M, N)``; a prompt shorter than its last key block is charged up to that
    block's rounding above what its kernel computes.

    ``group``: query heads per KV head. A kernel that packs GQA (:data:`PACKED_KEY_TILES`)
    places them in the rows of one block, one token's heads after the other, so a block of
    ``M`` rows spans ``M / group`` tokens (:func:`packed_key_extra`); the others ignore it."""
    rows = KEY_TILES[table]
    _, tile_m, tile_n = next((r for r in rows if head_dim <= r[0]), rows[-1])
    heads = max(1, round(group)) if table in PACKED_KEY_TILES else 1
    if heads == 1:
        return ((tile_m - 1) + (tile_n - math.gcd(tile_m, tile_n))) / 2.0
    return packed_key_extra(tile_m, tile_n, heads)


def packed_key_extra(tile_m: int, tile_n: int, group: int) -> float:
    """:func:`key_tile_extra` of a kernel whose ``tile_m`` query rows are packed
    ``(token, query head of the KV head)`` pairs (FlashAttention-3 PackGQA: row ``r`` is
    token ``r // group``): each block computes whole ``tile_n``-key blocks up to the last
    token it holds, so a row of token ``t`` in block ``b`` computes ``ceil((T_b + 1) / N) N``
    keys, ``T_b = ((b + 1) M - 1) // group``, where ``t + 1`` are causal. The average over
    one period of ``lcm(M, group N)`` rows, where both the blocks and the key rounding
    repeat, is exact for prompts of whole periods, as the closed form of one head is."""
    m, n, g = tile_m, tile_n, group
    period = math.lcm(m, g * n)

    def tokens_before(rows: int) -> int:  # sum of r // g over rows 0 .. rows - 1
        q, rest = divmod(rows, g)
        return g * q * (q - 1) // 2 + q * rest

    extra = 0
    for b in range(period // m):
        last = ((b + 1) * m - 1) // g
        keys = -(-(last + 1) // n) * n  # whole key blocks up to the block's last token
        extra += m * (keys - 1) - (tokens_before((b + 1) * m) - tokens_before(b * m))
    return extra / period


class OperatorFit(Frozen):
    """Roofline of one operator family on one device, fitted on measured kernels.

    With ``F`` FLOPs, ``B`` bytes, ``U`` parallel work units (GEMM rows; attention
    sequences x heads) and ``R`` rows of per-row work (activation elements a low-precision
    GEMM quantises; attention query rows)::

        fill = U / (U + half_units)              # too few units leave SMs idle
        t = max((F * q + F * (1 / fill - 1) + half_flops) / (peak * compute),
                (B / fill + half_bytes) / (bw * memory)) + floor + R * per_row_ps

    A GEMM family adds ``U * per_unit_ns`` to the per-row work (one input row of one
    GEMM: a per-token quantisation kernel's thread block).

    ``q`` is the tile/wave multiplier of the FLOPs (``tile_m``; 1 without it): waves x SMs
    over the exact tile count, computed by :func:`simulator.cost.roofline.quantisation`
    from the operator's shape and the device's ``sm_count``.

    Zero work costs nothing. With work growing with the units it spreads over (F, B
    proportional to U) the time never decreases, so the step stays monotone in its batch.
    """

    compute: float = Field(gt=0, le=1, description="Large-operator fraction of peak FLOP/s.")
    half_flops: float = Field(ge=0, description="FLOPs at which compute efficiency is half.")
    memory: float = Field(gt=0, le=1, description="Large-operator fraction of peak bandwidth.")
    half_bytes: float = Field(ge=0, description="Bytes at which memory efficiency is half.")
    half_units: float = Field(0.0, ge=0, description=(
        "Parallel work units (GEMM rows, sequences x heads) at which efficiency is half."))
    floor_us: float = Field(ge=0, description="Fixed latency of one kernel, microseconds.")
    per_row_ps: float = Field(0.0, ge=0, description=(
        "Time per row of per-row work (quantised activation element, query row), picoseconds."))
    per_unit_ns: float = Field(0.0, ge=0, description=(
        "GEMM families: time per input row (token) of each GEMM, nanoseconds, beside the "
        "per-element term: the activation-quantisation kernel an engine launches before an "
        "FP8 GEMM with one thread block per token (vLLM csrc/quantization/w8a8/fp8/common.cu, "
        "`static_scaled_fp8_quant` and `dynamic_per_token_scaled_fp8_quant`: grid = "
        "num_tokens, 256 threads), whose blocks cost about the same for any row width up to "
        "a few thousand elements. 0 where the kernels have no such term (the fit decides)."))
    per_k_ps: float = Field(0.0, ge=0, description=(
        "GEMM families: time per unit of each GEMM's depth k, picoseconds, paid once per "
        "GEMM however many thread blocks run: a block walks its k in a serial main loop, "
        "one k-slice after another, and the kernel waits for its blocks' loops. 0 where the "
        "tables show no such term (the fit decides)."))
    per_group_ns: float = Field(0.0, ge=0, description=(
        "MoE families: time per expert hit on the rank, nanoseconds, beside the per-element "
        "terms: a grouped GEMM walks its experts' problems one after another (each group's "
        "tile schedule, its input rows gathered through the permutation, its scales), so "
        "256 experts of a few tokens each take longer than 8 experts of the same tokens and "
        "weights. 0 where the tables show no such term (the fit decides)."))
    expanded_block_ns: float = Field(0.0, ge=0, description=(
        "MoE families on FlashInfer's TensorRT-LLM-gen fused MoE with block-scaled FP8 "
        "experts: time per thread-block iteration of its separate SwiGLU + FP8 "
        "re-quantisation kernel, nanoseconds (0: off). That kernel grids over the expanded "
        "slots of the whole batch, tokens x top-k x 128-column scale blocks of the rank's "
        "intermediate columns (:func:`expanded_activation_blocks`), and each block looks "
        "its slot up and runs a block-wide reduction whether or not the slot's expert is on "
        "the rank (flashinfer csrc/trtllm_fused_moe_dev_kernel.cu, "
        "`activationDeepSeekKernel`), so under expert parallelism its time follows the "
        "batch, not the rank's rows (:meth:`expanded_seconds`)."))
    row_unit: Literal["query_head", "kv_head"] = Field("query_head", description=(
        "Decode attention only: what one row of per-row work is, a (sequence, query head) "
        "pair, or a (sequence, KV head) pair (grouped-query decode kernels that process the "
        "query heads of one KV head together, e.g. FlashInfer's batch decode with one "
        "thread block per sequence and KV head). "
        "The fit picks the one that fits its training shapes better."))
    tile_m: int = Field(0, ge=0, description=(
        "Tile and wave quantisation (0 = off): the largest tile along the batch axis (GEMM "
        "and grouped-MoE rows, prefill query rows; decode attention: the split-KV partition "
        "in context tokens). With it the FLOPs are multiplied by waves x SMs / tiles "
        "(simulator.cost.roofline.wave_factor; needs the device's `sm_count`)."))
    tile_n: int = Field(0, ge=0, description=(
        "GEMM and grouped-MoE tile along the output columns n (0: columns are not tiled)."))
    split_k: bool = Field(False, description=(
        "GEMM and grouped MoE: a kernel of fewer tiles than SMs splits k over the idle SMs "
        "(cuBLAS split-K, CUTLASS stream-K) instead of leaving them idle."))
    tile_k0: int = Field(0, ge=0, description=(
        "GEMM and grouped MoE: fixed work of each tile (or k-slice) in units of k, its "
        "mainloop pipeline fill and epilogue: a tile of depth k costs as k + tile_k0."))
    tile_dispatch: Literal["", "cutlass_sm90_fp8", "sgl_kernel_sm90_fp8",
                           "flashinfer_cutlass_sm100_nvfp4", "cublas_fastest"] = Field(
        "", description=(
            "GEMM: the tile shape follows the kernel library's dispatch by batch size "
            "(simulator.cost.roofline.TILE_DISPATCH: vLLM's and SGLang's CUTLASS FP8 scaled-MM "
            "configs for Hopper; FlashInfer's CUTLASS NVFP4 GEMM for Blackwell, whose tiles "
            "are 128 rows tall at every batch size) instead of one `tile_m` x `tile_n` (which "
            "then only switch tiling on). `cublas_fastest`: cuBLAS's heuristic picks a kernel "
            "per GEMM shape among several thread-block tiles; the FLOPs multiplier is the "
            "least over the candidates of simulator.cost.roofline.TILE_CANDIDATES, each "
            "with its operand-load factor (`tile_load_rows`)."))
    tile_load_rows: float = Field(0.0, ge=0, description=(
        "GEMM with a candidate tile set (`tile_dispatch` `cublas_fastest`; 0: off): a "
        "tile of tile_m x tile_n reads (tile_m + tile_n) x k operand elements for "
        "2 x tile_m x tile_n x k FLOPs, and below tile_m x tile_n / (tile_m + tile_n) = "
        "this many rows its loads, not its tensor cores, bound it: its FLOPs count "
        "max(1, tile_load_rows x (1 / tile_m + 1 / tile_n)) times "
        "(simulator.cost.roofline.candidate_factor). Fitted."))
    moe_kernel: Literal["", "flashinfer_cutlass_sm90"] = Field("", description=(
        "Grouped MoE GEMM: how the expert GEMMs are tiled. '' (default): the gate+up GEMM "
        "(2 x intermediate columns over the hidden size) stands for both, with the tile along "
        "the tokens following their next power of two (simulator.cost.roofline.tile_m_for). "
        "`flashinfer_cutlass_sm90`: FlashInfer's CUTLASS fused MoE on Hopper (vLLM's "
        "FlashInferExperts, which the FP8 per-tensor experts run there): every expert's tiles "
        "keep their full `tile_m` token rows however few tokens it holds (its grouped SM90 "
        "tiles are 128x16 ... 128x256 and 256x128; flashinfer csrc/nv_internal/tensorrt_llm/"
        "kernels/cutlass_kernels/cutlass_heuristic.cpp `get_candidate_tiles_sm90`), and the "
        "gate+up and down GEMMs are tiled each, their multipliers weighted by FLOPs (2/3, 1/3)."))
    pack_gqa: bool = Field(False, description=(
        "Prefill attention: the query heads sharing a KV head are packed into one block's "
        "rows (FlashAttention-3 PackGQA; simulator.cost.roofline.prefill_tiles)."))
    causal_tail: float = Field(0.0, ge=0, le=2, description=(
        "Prefill attention (0: off): the causal tiles of a persistent scheduler. A query "
        "block of a causal prompt reads the keys up to its own rows, so the last block of a "
        "sequence does the most work and the tiles are unequal: the kernel takes at least "
        "its longest tile on one SM, and the tiles left when the others run out idle SMs "
        "for about `causal_tail` of that tile's time. With r the longest tile's work times "
        "the SMs over the operator's work, the FLOPs are multiplied by max(q, r, 1 + "
        "causal_tail x r) (simulator.cost.roofline.causal_quantisation). FlashInfer's "
        "TensorRT-LLM-gen context kernels, which vLLM runs on Blackwell, launch a "
        "persistent tile scheduler with a causal mask (flashinfer "
        "csrc/trtllm_fmha_kernel_launcher.cu: TileScheduler::Persistent, Causal)."))
    key_tiles: Literal["", "fa3_sm90_bf16", "fa3_sm90_fp8", "fmha_v2_sm90_bf16",
                       "fmha_v2_sm90_fp8"] = Field("", description=(
        "Prefill attention (not MLA; '' off): the kernel's tile table by head dimension "
        "(simulator.hardware.operator_fits.KEY_TILES). A causal query block computes whole "
        "key blocks up to its last row, so each query row is charged the keys of "
        "key_tile_extra beyond its causal pairs: at head dim 128, 63.5 (16-bit: "
        "FlashAttention-3's 128 x 128 tiles, TensorRT-LLM's 64 x 128) or 127.5 (FP8: 128 x 160, "
        "64 x 256), which is 12 % / 25 % more work at a 1,024-token prompt and under 2 % / 4 % "
        "at 8,192."))
    head_dim_exp: float = Field(0.0, ge=-2, le=2, description=(
        "Attention: FLOPs and bytes are scaled by (head_dim / 128) ** head_dim_exp. The "
        "kernels pick their tiles by head dimension (FlashAttention-3 hopper/tile_size.h: "
        "fewer key columns per tile as head_dim grows, for registers and shared memory), so "
        "large head dims run further from peak. Decode attention reads each KV head's rows "
        "in chunks of head_dim elements: narrow rows (64) stream further from peak "
        "bandwidth than wide ones (256), a negative exponent."))
    kv_reread_share: float = Field(1.0, ge=0, le=1, description=(
        "Prefill attention: the share of the K/V re-read of each query block "
        "(simulator.cost.roofline.kv_reread_bytes) that reaches memory; the rest hits L2. "
        "A persistent causal scheduler walks the query blocks of one head in turn, so the "
        "keys and values those blocks share can stay in L2 (one head's K and V at 16k "
        "tokens and head dim 128 in BF16 take 8 MB). Fitted with causal_tail."))
    softmax_dim: float = Field(0.0, ge=0, le=1024, description=(
        "Prefill attention (0: off): the head dimension below which a query-key pair costs "
        "no less, FLOPs x max(1, softmax_dim / head_dim). Each pair also takes an "
        "exponential and the row max and sum of the online softmax, work that does not "
        "shrink with the head dimension while the two matrix products do. On B200 an "
        "SM's tensor cores do 8,192 BF16 FLOPs per clock and its exponential unit 16 "
        "exponentials (FlashAttention-4, Zadouri et al. 2026, arXiv 2603.05451): the "
        "4 x head_dim FLOPs of a pair take as long as its exponential at head_dim 128, "
        "so smaller head dimensions run at the exponential's rate."))
    group_limit: int = Field(0, ge=0, description=(
        "Decode attention: the most query heads per KV head the grouped-query kernel takes "
        "(0: one kernel for every layout). Head groups above it, and plain multi-head "
        "attention (one query head per KV head), run a kernel with one thread block per "
        "(sequence, query head) that re-reads a KV head for each of its query heads "
        "(TensorRT-LLM: XQA takes groups of 2 to 32 at beam 1, masked multi-head attention "
        "the rest; decoderXQAImplJIT/kernelUtils.cpp `supportConfigCommon`, "
        "`supportConfigHMMA`). The per-row work is then counted per (sequence, KV head) for "
        "the grouped kernel and per (sequence, query head) for the other."))
    group_reread: float = Field(0.0, ge=0, le=1, description=(
        "Decode attention outside the grouped kernel (`group_limit`): the share of each "
        "further query head's KV re-read that reaches memory (the rest hits L2): KV bytes x "
        "(1 + (group - 1) x group_reread)."))
    group_row_share: float = Field(1.0, ge=0, le=1, description=(
        "Decode attention outside the grouped kernel (`group_limit`): the per-row time of "
        "one (sequence, query head) block relative to one grouped (sequence, KV head) block."))
    row_overlap: float = Field(0.0, ge=0, le=1, description=(
        "Decode attention with `group_limit`: the share of the per-row work that runs under "
        "the KV stream of other resident blocks rather than after it: the time is "
        "max(compute, memory) + floor + P - row_overlap x min(max(compute, memory), P), "
        "P the per-row work (rows x per_row_ps). TensorRT-LLM's XQA launches a block per "
        "(sequence, KV head) and split-KV slice (decoderXQAImplJIT.cpp `runImpl`), so at "
        "large batches one block's query load, softmax and output write run while others "
        "stream their keys and values."))
    group_memory: float = Field(1.0, ge=0.5, le=2.0, description=(
        "Decode attention outside the grouped kernel (`group_limit`): its KV bytes relative "
        "to the grouped kernel's at the same bandwidth share (the two kernels reach "
        "different shares of peak): KV bytes x group_memory x (1 + (group - 1) x "
        "group_reread)."))
    group_q_rows: float = Field(0.0, ge=0, le=1, description=(
        "Decode attention in the grouped kernel (`group_limit`): the per-row work of one "
        "(sequence, KV head) block grows with its query heads as 1 + (group - 1) x "
        "group_q_rows (the block's query rows, softmax and output)."))
    group_row_step: float = Field(0.0, ge=0, le=4, description=(
        "Decode attention in the grouped kernel (`group_limit`): its per-row work grows by "
        "`group_row_step` for every 8 query heads per KV head past the first 8, rows x (1 + "
        "(group - 1) x group_q_rows + group_row_step x (ceil(group / 8) - 1)), as its KV time "
        "does (`group_step`): the query heads of one KV head are padded to a multiple of 8. "
        "In the 1.3.0rc20 H100 tables (FP8 KV, head dim 128, 256-2,048 sequences of at most 32 "
        "tokens, where the per-block work dominates) a block takes 12.4-15.1 ns for 2-8 query "
        "heads per KV head, 19.6 / 22.2 ns for 12 / 16 and 41.8 ns for 32."))
    group_step: float = Field(0.0, ge=0, le=2, description=(
        "Decode attention in the grouped kernel (`group_limit`): its KV time grows by "
        "`group_step` for every 8 query heads per KV head past the first 8, KV bytes x (1 + "
        "group_step x (ceil(group / 8) - 1)). TensorRT-LLM's SM90 XQA kernel (the FP8-KV "
        "QGMMA kernel, cpp/kernels/xqa/mha_sm90.cu) runs its matrix products with the query "
        "heads of one KV head as the GMMA N dimension padded to a multiple of 8 "
        "(`ctaNbQHeads = roundUp(headGrpSize * beamWidth, 8)`, swap-AB), over 64-token KV "
        "tiles; in the 1.3.0rc20 H100 tables (FP8 KV, head dim 128, 8 sequences over one KV "
        "head) 12-16 query heads per KV head take 1.2-1.3x and 32 take 1.6-1.9x the time "
        "of 2-8 at every context from 2 to 32k tokens."))
    group_row_head_dim_exp: float = Field(0.0, ge=-2, le=2, description=(
        "Decode attention in the grouped kernel (`group_limit`): its per-row work (one "
        "(sequence, KV head) block's query load, QK and PV products over the head "
        "dimension, softmax and output write) is scaled by (head_dim / 128) ** "
        "`group_row_head_dim_exp` (0: off; the KV bytes take `head_dim_exp`). In "
        "TensorRT-LLM 1.3.0rc20's H100 tables (aiconfigurator-core 0.12.0, FP8 KV, 32 query "
        "over 8 KV heads, 2,048 sequences of 2 tokens, where the blocks' own work "
        "dominates) head dimensions 64 / 128 / 256 take 135 / 183 / 301 us: the block's "
        "work grows with the width of its rows, which a per-block constant priced the same."))
    rope_kernel_us: float = Field(0.0, ge=0, description=(
        "Decode attention in the grouped kernel (`group_limit`), fit only: microseconds of "
        "the separate RoPE kernel the measured shapes run before the grouped kernel where "
        "it cannot rotate the new token's query and key itself (0: off). TensorRT-LLM's "
        "Hopper XQA kernel (QGMMA, FP8 KV) applies RoPE in-kernel only where the rotary "
        "dimension is at most the head dimension, else a preprocessing kernel runs first "
        "(NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/"
        "decoderXQAImplJIT/kernelUtils.cpp `appliesRoPEInXqaKernel`, decoderXQAImplJIT.cpp "
        "`applyRoPEInXqaKernel`), and AIConfigurator's collector builds every layout with a "
        "rotary dimension of 128 (ai-dynamo/aiconfigurator collector/trtllm/collect_attn.py: "
        "`RopeParams(dim=128)`), so its head-dimension-64 shapes time two kernels "
        "(:data:`COLLECTOR_ROTARY_DIM`; in the 1.3.0rc20 H100 FP8-KV tables one sequence of "
        "2 tokens over 8 KV heads and 32 query heads takes 8.0 us at head dimension 64 and "
        "5.7 us at 128; over a BF16 KV cache, whose XQA kernel never rotates in-kernel, "
        "7.9 and 8.5 us). A condition of the measurement: a model's rotary dimension does "
        "not exceed its head dimension, so the step model never prices it, as with "
        "`l2_speedup`."))
    kv_write_ps: float = Field(0.0, ge=0, description=(
        "Prefill attention (not MLA): picoseconds per element of the new tokens' K and V "
        "written into the paged KV cache (`2 x KV heads x head dim` per token), paid beside "
        "the attention kernel (0: off). vLLM's attention layer stores the step's keys and "
        "values before it runs the prefill kernel, in the same forward "
        "(vllm-project/vllm vllm/v1/attention/backends/flashinfer.py `FlashInferImpl.forward`: "
        "`reshape_and_cache_flash`, then `trtllm_batch_context_with_kv_cache`), and "
        "AIConfigurator's collector times that forward (ai-dynamo/aiconfigurator "
        "collector/vllm/collect_attn.py `impl.forward`). The store is a kernel of its own, one "
        "thread block per token and, in FlashInfer's HND cache layout, one warp per KV head "
        "(csrc/cache_kernels.cu `reshape_and_cache_flash_kernel`); into an FP8 cache it "
        "converts every element with the layer's scale (`fp8::scaled_convert`). Its time "
        "grows with the KV heads at a fixed count of query heads: in vLLM 0.24.0's B200 "
        "tables (aiconfigurator-core 0.12.0; 64 prompts of 128 tokens, 64 query heads of "
        "dimension 128) the FP8-KV forward takes 133 us over 1 KV head and 385 us over 64 "
        "(BF16 KV: 136 and 243 us). The fit decides where it is taken."))
    q_copy_us: float = Field(0.0, ge=0, description=(
        "Decode attention in the grouped kernel (`group_limit`): microseconds of the copy "
        "kernel that lays the queries out for it, paid with more than one sequence and more "
        "than one KV head on the device (0: off). FlashAttention-2's varlen entry point "
        "(vllm-project/flash-attention csrc/flash_attn/flash_api.cpp `mha_varlen_fwd`, "
        "vLLM's FA2 path on Ampere and Ada) runs one query row per (sequence, query head of "
        "a KV head) by reshaping q from (sequences, KV heads, group, head_dim) to "
        "(sequences * group, KV heads, head_dim) through a transpose "
        "(`seqlenq_ngroups_swapped`); that view merges only where one sequence or one KV "
        "head leaves the transposed dimensions adjacent, else PyTorch copies q first. In "
        "vLLM 0.24.0's L40S tables (aiconfigurator-core 0.12.0, `vllm_flash_attn_fa2`, "
        "2-token contexts) 2 to 64 sequences over 1 KV head and 8 query heads take "
        "8.7-9.5 us, over 2 KV heads 12.1-13.7 us, and one sequence over 2 KV heads 9.0 us. "
        "The step model prices it in decode-only steps of more than one sequence on layouts "
        "of more than one KV head per device (:meth:`for_decode_layout`; FA2 swaps the "
        "query layout only where every query is one token, `max_seqlen_q == 1`)."))
    group_floor_us: float | None = Field(None, ge=0, description=(
        "Decode attention outside the grouped kernel (`group_limit`): its fixed latency, "
        "microseconds (None: `floor_us`). The two are different kernels: in TensorRT-LLM "
        "1.3.0rc20's H100 tables (aiconfigurator-core 0.12.0 systems/data/h100_sxm/attention/"
        "trtllm/1.3.0rc20/generation_attention_perf.parquet, FP8 KV cache) one sequence of 2 "
        "tokens over 8 KV heads of dimension 128 takes 9.0 us with one query head per KV head "
        "(masked multi-head attention) and 6.0 us with two (XQA)."))
    remote_slots: bool = Field(False, description=(
        "Routed experts (MoE): the kernel writes the intermediate rows of every routed "
        "token slot, its own experts' or not. Under expert parallelism without a token "
        "exchange every rank holds every token, and the Triton fused-MoE kernel of vLLM and "
        "SGLang gives each slot routed to an expert of another rank a block that writes "
        "zeros to both GEMM outputs (vllm/model_executor/layers/fused_moe/fused_moe.py and "
        "sglang python/sglang/srt/layers/moe/fused_moe_triton/, `write_zeros_to_output` "
        "for expert id -1): (gate+up columns + hidden) elements per such slot, counted as "
        "per-row work at `per_row_ps` (:meth:`remote_rows`): a block that only writes zeros "
        "runs at the rate blocks are scheduled, not at HBM bandwidth. (SGLang's kernel "
        "tables time those slots as GEMM rows instead: their collector sets them to local "
        "expert 0, which the fit can price as they were timed, "
        "`kernel_fit.CLAMPED_MOE_ROUTINGS`.)"))
    slot_kernels: bool = Field(False, description=(
        "Routed experts (MoE): the per-row work also counts, per token slot routed to the "
        "rank, the elements the fused MoE moves in kernels of its own outside the two grouped "
        "GEMMs (:meth:`slot_rows`): TensorRT-LLM's CUTLASS MoE copies each slot's token row "
        "into the expert-sorted input (`expandInputRowsKernel`: hidden read and written), "
        "runs the gated activation on the first GEMM's output (`doActivationKernel`: "
        "gate+up columns read, half as many written) and sums each token's slots "
        "(`finalizeMoeRoutingKernel`: hidden read per slot; the token's row written is the "
        "per-row work without the term), cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/"
        "moe_kernels.cu. These run between and after the GEMMs, not under them, so they add "
        "to the time at `per_row_ps` instead of overlapping the GEMMs' memory term."))
    exposed: float = Field(0.0, ge=0, le=1, description=(
        "GEMM-like families (GEMM, MoE) and prefill attention (:data:`EXPOSED_FAMILIES`): "
        "the share of the shorter of compute and memory time that the kernel does not "
        "hide under the longer: the busy time is max(compute, memory) + exposed x "
        "min(compute, memory) (0: perfect overlap, the plain roofline; 1: none). A tile "
        "streams its weights from memory while its tensor cores work on the tile before, "
        "as far as the pipeline stages and the resident tiles allow; near the ridge point "
        "(a grouped MoE GEMM of about 100 tokens per expert in FP8) neither limit is "
        "reached. A prefill-attention block loads each key block of its KV head while it "
        "computes on the one before; with more KV heads the K/V re-read grows at the same "
        "FLOPs (eight KV heads of 128 dimensions against one, 8 query heads, 16 prompts "
        "of 2,048 tokens: 648 against 357 us in vLLM 0.24.0's H100 FP8-KV table)."))
    sustained_us: float = Field(0.0, ge=0, description=(
        "GEMM families: the compute time, microseconds, of one kernel at which it runs "
        "halfway between the rate of `compute` and `sustained_rate` of it: a kernel of "
        "compute time c runs at 1 / (1 + (1 / sustained_rate - 1) x c / (c + sustained_us)) "
        "of that rate, the whole rate for short kernels and `sustained_rate` of it for long "
        "ones (0: off). A dense GEMM at full tensor-core load draws the card's power limit, "
        "and its clock falls once that load lasts: AIConfigurator's collector times each "
        "shape over a few graph replays (collector/helper.py `benchmark_with_power`: 3 "
        "warm-ups, 6 runs), a window of milliseconds for a short GEMM and of seconds for a long one. "
        "The tables show it where kernels run long: TensorRT-LLM 1.3.0rc20's B200 BF16 "
        "GEMMs reach 1,460 TFLOP/s at 1-4 ms and 1,215-1,340 at 16-128 ms; SGLang 0.5.14's "
        "L40S FP8 GEMMs 275 TFLOP/s at 2 ms and 160 beyond 100 ms. The step model prices each "
        "GEMM by its own length as the fit does; a long run of prefill steps would hold the "
        "clock down for shorter GEMMs too, which this does not model."))
    sustained_rate: float = Field(1.0, gt=0, le=1, description=(
        "GEMM families: the share of the `compute` rate a long kernel keeps "
        "(`sustained_us`; 1: the term is off)."))
    l2_speedup: float = Field(1.0, ge=1, le=20, description=(
        "How many times faster than its memory term an operator runs whose working set "
        "stays in the L2 cache between back-to-back calls (1: no such term). A condition of "
        "the measurement, not of serving: AIConfigurator's collector replays one CUDA graph "
        "of the same kernel on the same buffers with no cache flush in between "
        "(ai-dynamo/aiconfigurator collector/helper.py `benchmark_with_power`; the attention "
        "collectors build one KV cache per shape), so a KV cache smaller than the L2 is read "
        "from L2 after the first replay. The step model runs every layer between two calls "
        "of one layer's attention, whose traffic evicts that layer's KV, and prices it from "
        "memory: only the fit uses the term (:meth:`parts`, ``warm``), so that the warm "
        "shapes do not pull the memory efficiency of the cold ones. Fitted on devices whose "
        "profile gives `l2_cache_mb`."))
    head_tile: int = Field(0, ge=0, description=(
        "MLA decode attention (0: off): the kernel runs the query heads of a sequence as the "
        "query rows of tiles of `head_tile` rows over the one latent head, padded to whole "
        "tiles, one thread block per (sequence, tile) reading the whole context (its "
        "`tile_m` is then WHOLE_CONTEXT: no split-KV). The FLOPs count ceil(heads / "
        "head_tile) x head_tile rows and the blocks are sequences x ceil(heads / "
        "head_tile) (:meth:`head_blocks`). TensorRT-LLM runs MLA generation on its "
        "context FMHA kernel (fmha_v2) where none of its generation kernels applies "
        "(trtllm-gen on SM100, FlashMLA, XQA's MLA kernels), as on SM80 and SM89, with "
        "the heads as the query sequence (cpp/tensorrt_llm/common/attentionOp.cpp, "
        "`mlaGeneration`, the FMHA fallback: `qSeqLen = head_num * q_len`, one KV head). "
        "In TensorRT-LLM 1.0.0's A100 tables "
        "(aiconfigurator-core 0.12.0 systems/data/a100_sxm/mla/trtllm/1.0.0/"
        "generation_mla_perf.parquet) one sequence of 131,071 tokens takes 15.5-15.9 ms "
        "with 1, 16 or 128 heads and 16 sequences 15.7-16.1 ms, while 1,024 sequences of "
        "16,383 tokens take 26 ms with 1 or 16 heads and 50 ms with 128: a block per 64 "
        "heads, each streaming its sequence's latent alone."))
    resident_blocks: float = Field(0.0, ge=0, description=(
        "Decode attention with `head_tile` or `block_gbs`: the thread blocks the kernel runs "
        "at once (0: one per SM; a fit with `block_gbs` gives the device's SMs). With "
        "`head_tile`, the kernel takes at least its longest block and at least its work "
        "spread over this many blocks (simulator.cost.roofline.whole_context_quantisation). "
        "Fitted: in the A100 and L40S tables (16 heads, 16,384-token contexts) the time "
        "grows linearly past about 74 and 46 sequences, on 108 and 142 SMs."))
    block_gbs: float = Field(0.0, ge=0, description=(
        "Decode attention with a whole-context partition (`tile_m` WHOLE_CONTEXT, no "
        "`head_tile`; 0: off): GB/s one thread block streams its (sequence, KV head) at. "
        "Each block walks its sequence's whole KV cache alone, `resident_blocks` at once, so "
        "the memory time is at least ceil(units / resident_blocks) x (bytes / units) / "
        "block rate (:meth:`parts`). TensorRT-LLM turns XQA's multi-block mode off for an "
        "FP8 KV cache below SM90 (cpp/tensorrt_llm/common/attentionOp.cpp, the XQA "
        "parameters: `multi_block_mode = false` for E4M3 where SM < 90), and in its 1.3.0rc20 "
        "L40S FP8-KV tables (aiconfigurator-core 0.12.0) 1 to 16 sequences of 131,072 tokens "
        "over 8 KV heads of dimension 128 take 2.11 ms alike (8 to 128 blocks on 142 SMs), "
        "32 take 3.02 ms."))
    head_block: int = Field(0, ge=0, description=(
        "MLA decode attention (0: off): a split-KV kernel that runs a sequence's query heads "
        "in thread blocks of `head_block` heads over the one latent head, with a grid of "
        "(sequences, ceil(heads / head_block), the engine's largest split count) blocks of "
        "which only the splits its heuristic chooses do work and the others return at once. "
        "Each (sequence, head block) pair adds `head_block_rows` rows of per-row work "
        "(:meth:`block_rows`) to the per-query-head rows: its share of the launched grid, its "
        "query load and its partial outputs. SGLang 0.5.14 runs MLA decode on Ada (SM89) on its "
        "Triton backend (sgl-project/sglang python/sglang/srt/server_args.py "
        "`_get_default_attn_backend`, the MLA branch falling through to `triton`; "
        "ai-dynamo/aiconfigurator collector/sglang/collect_mla.py "
        "`_select_default_mla_backend`), whose grouped decode kernel takes 16 query heads "
        "per block (python/sglang/srt/layers/attention/triton_ops/decode_attention.py, "
        "`_decode_grouped_att_m_fwd`: `BLOCK_H = 16`, grid (batch, ceil(heads / 16), "
        "MAX_KV_SPLITS)); the MLA split cap is the next power of two of the SMs, 256 on 142 "
        "SMs (triton_backend.py `_mla_decode_kv_splits_cap`). In the engine's L40S table "
        "(aiconfigurator-core 0.12.0 systems/data/l40s/mla/sglang/0.5.14/"
        "generation_mla_perf.parquet) 256 sequences of 2 tokens take 152-194 us with 2 to 16 "
        "heads and 375 us with 32: the time steps with the head blocks, not with the heads."))
    head_block_rows: float = Field(0.0, ge=0, description=(
        "MLA decode attention with `head_block`: the per-row work of one (sequence, head "
        "block) pair, in rows of `per_row_ps` (0 with `head_block` off)."))
    head_block_reread: float = Field(0.0, ge=0, le=1, description=(
        "MLA decode attention with `head_block`: the share of each further head block's read "
        "of the latent that reaches memory (the rest hits L2): latent bytes x (1 + "
        "(ceil(heads / head_block) - 1) x head_block_reread) (:meth:`block_kv_scale`). Each "
        "block reads its split of the sequence's latent for its own heads, so 128 heads read "
        "it 8 times: in the L40S table 32 sequences of 131,072 tokens take 6.57 / 7.93 / "
        "12.0 / 22.6 ms over 16 / 32 / 64 / 128 heads."))
    expert_block_gbs: float = Field(0.0, ge=0, description=(
        "Routed experts (MoE) on a Triton fused-MoE kernel (0: off): GB/s one thread block "
        "streams its share of the expert weights at. The kernel's grid has a block per "
        "(`expert_block_m` rows of one expert's sorted token slots, `expert_block_n` output "
        "columns), and each block walks the whole depth of its weight columns alone, "
        "`expert_blocks_per_sm` per SM at once; the two GEMMs (gate+up, then down) run as two "
        "kernels, so each GEMM's memory time is at least ceil(blocks / resident) x (weight "
        "bytes / blocks) / block rate (:meth:`expert_stream_seconds`, the floor of the "
        "memory side in :meth:`parts`). Few experts hit with few tokens each make too few "
        "blocks to fill the device: SGLang 0.5.14 runs BF16 experts without a tuned "
        "configuration at BLOCK_SIZE_M x BLOCK_SIZE_N = 64 x 64 (BLOCK_SIZE_K 32) once the "
        "kernel's tokens exceed its experts (sgl-project/sglang python/sglang/srt/layers/moe/"
        "moe_runner/triton_utils/fused_moe_triton_config.py, `get_default_config`), and in its "
        "B200 table (aiconfigurator-core 0.12.0 systems/data/b200_sxm/moe/sglang/0.5.14/"
        "moe_perf.parquet) one Llama-4 Maverick expert (hidden 5,120, intermediate 8,192) "
        "takes 200 us at 2 to 32 tokens for 252 MB of weights, 1.3 TB/s: its down GEMM "
        "is 80 blocks of 64 columns on 148 SMs."))
    expert_block_m: int = Field(0, ge=0, description=(
        "MoE with `expert_block_gbs`: the token slots (rows) of one thread block, "
        "BLOCK_SIZE_M of the Triton kernel's configuration (each expert's slots are padded "
        "to whole blocks, `moe_align_block_size`)."))
    expert_block_n: int = Field(0, ge=0, description=(
        "MoE with `expert_block_gbs`: the output columns of one thread block, BLOCK_SIZE_N "
        "of the Triton kernel's configuration."))
    expert_blocks_per_sm: float = Field(0.0, ge=0, description=(
        "MoE with `expert_block_gbs`: the thread blocks one SM runs at once (chosen on the "
        "training shapes among kernel_fit.EXPERT_BLOCKS_PER_SM)."))
    rows: int = Field(0, ge=0, description="Measured shapes the constants were fitted on.")

    @model_validator(mode="after")
    def _grouped_terms_need_a_limit(self) -> OperatorFit:
        if self.block_gbs and (self.tile_m != WHOLE_CONTEXT or self.head_tile
                               or self.resident_blocks <= 0):
            raise ValueError(f"block_gbs {self.block_gbs} prices a decode kernel that does not "
                             f"split the context: it needs tile_m {WHOLE_CONTEXT} (whole "
                             "context), no head_tile and resident_blocks > 0 (the blocks it "
                             "runs at once)")
        for name in ("group_row_head_dim_exp", "rope_kernel_us", "q_copy_us"):
            if getattr(self, name) and not self.group_limit:
                raise ValueError(f"{name} {getattr(self, name)} prices the grouped decode kernel "
                                 "and needs group_limit > 0 (the most query heads per KV head "
                                 "that kernel takes)")
        return self

    @model_validator(mode="after")
    def _expert_blocks_need_their_shape(self) -> OperatorFit:
        if self.expert_block_gbs and not (self.expert_block_m and self.expert_block_n
                                          and self.expert_blocks_per_sm):
            raise ValueError(f"expert_block_gbs {self.expert_block_gbs} prices the thread "
                             "blocks of a Triton fused-MoE kernel and needs expert_block_m, "
                             "expert_block_n and expert_blocks_per_sm > 0 (the block's rows "
                             "and columns, the blocks an SM runs at once)")
        return self

    @model_validator(mode="after")
    def _head_blocks_of_a_split_kernel(self) -> OperatorFit:
        if self.head_block_rows and not self.head_block:
            raise ValueError(f"head_block_rows {self.head_block_rows} prices the head blocks of "
                             "an MLA decode kernel and needs head_block > 0 (the query heads "
                             "one thread block takes)")
        if self.head_block_reread and not self.head_block:
            raise ValueError(f"head_block_reread {self.head_block_reread} prices the head "
                             "blocks of an MLA decode kernel and needs head_block > 0 (the "
                             "query heads one thread block takes)")
        if self.head_block and self.head_tile:
            raise ValueError(f"head_block {self.head_block} (a split-KV kernel's head blocks) "
                             f"and head_tile {self.head_tile} (a kernel that does not split "
                             "the context) describe two kernels; give one")
        return self

    @model_validator(mode="after")
    def _load_rows_need_candidates(self) -> OperatorFit:
        if self.tile_load_rows and self.tile_dispatch != "cublas_fastest":
            raise ValueError(f"tile_load_rows {self.tile_load_rows} weighs the tiles of a "
                             "candidate set: it needs tile_dispatch 'cublas_fastest'")
        return self

    @model_validator(mode="after")
    def _sustained_needs_its_length(self) -> OperatorFit:
        if self.sustained_rate != 1.0 and self.sustained_us <= 0:
            raise ValueError(f"sustained_rate {self.sustained_rate} needs sustained_us > 0 "
                             "(the compute time, microseconds, at which a kernel runs halfway "
                             "to that rate); give both or neither")
        return self

    def head_blocks(self, heads: Any) -> tuple[Any, Any]:
        """``(blocks per sequence, FLOPs multiplier)`` of MLA decode attention with
        ``heads`` query rows per sequence on one device: ``(ceil(heads / head_tile),
        ceil(heads / head_tile) * head_tile / heads)`` with :attr:`head_tile`, else one
        block per sequence (the latent head) and the FLOPs as counted."""
        if not self.head_tile:
            return 1.0, 1.0
        if isinstance(heads, np.ndarray):
            tiles = np.ceil(heads / self.head_tile)
            return tiles, tiles * self.head_tile / np.maximum(heads, 1e-9)
        tiles_f = float(math.ceil(heads / self.head_tile))
        return tiles_f, tiles_f * self.head_tile / max(float(heads), 1e-9)

    def block_rows(self, heads: Any) -> Any:
        """Rows of per-row work per sequence that ``heads`` query heads on one device add in
        head blocks (:attr:`head_block`): ``head_block_rows * ceil(heads / head_block)``,
        0 without the term."""
        if not (self.head_block and self.head_block_rows):
            return 0.0
        if isinstance(heads, np.ndarray):
            return self.head_block_rows * np.ceil(heads / self.head_block)
        return self.head_block_rows * float(math.ceil(heads / self.head_block))

    def block_kv_scale(self, heads: Any) -> Any:
        """Multiplier of the latent bytes of ``heads`` query heads on one device read in head
        blocks (:attr:`head_block`): ``1 + (ceil(heads / head_block) - 1) *
        head_block_reread``, 1 without the term."""
        if not (self.head_block and self.head_block_reread):
            return 1.0
        if isinstance(heads, np.ndarray):
            return 1.0 + (np.ceil(heads / self.head_block) - 1.0) * self.head_block_reread
        return 1.0 + (float(math.ceil(heads / self.head_block)) - 1.0) * self.head_block_reread

    def grouped(self, group: Any) -> Any:
        """Whether decode attention of ``group`` query heads per KV head runs the grouped
        kernel (``1 < group <= group_limit``; a boolean array for an array of groups)."""
        g = np.asarray(group, dtype=float)
        return (g > 1.0) & (g <= self.group_limit)

    def decode_floor(self, group: Any) -> Any:
        """``floor_us`` of decode attention of ``group`` query heads per KV head: the other
        kernel's (``group_floor_us``) outside the grouped kernel (:meth:`decode_group`)."""
        if not self.group_limit or self.group_floor_us is None:
            return np.full_like(group, self.floor_us, dtype=float) if isinstance(
                group, np.ndarray) else self.floor_us
        out = np.where(self.grouped(group), self.floor_us, self.group_floor_us)
        return out if isinstance(group, np.ndarray) else float(out)

    def rope_floor(self, group: Any, head_dim: Any) -> Any:
        """Microseconds of the measured shapes' separate RoPE kernel (:attr:`rope_kernel_us`):
        in the grouped kernel (``1 < group <= group_limit``) at a head dimension below
        :data:`COLLECTOR_ROTARY_DIM`, else 0. Only the fit prices it
        (:func:`simulator.validation.kernel_fit_predict.extra_floor`)."""
        if not (self.group_limit and self.rope_kernel_us):
            return 0.0
        out = np.where(self.grouped(group)
                       & (np.asarray(head_dim, dtype=float) < COLLECTOR_ROTARY_DIM),
                       self.rope_kernel_us, 0.0)
        return out if isinstance(group, np.ndarray) else float(out)

    def q_copy_floor(self, group: Any, batch: Any, kv_heads: Any) -> Any:
        """Microseconds of the grouped kernel's query copy (:attr:`q_copy_us`): paid in the
        grouped kernel (``1 < group <= group_limit``) with more than one sequence
        (``batch``) and more than one KV head on the device (``kv_heads``), else 0."""
        if not (self.group_limit and self.q_copy_us):
            return 0.0
        paid = (self.grouped(group) & (np.asarray(batch, dtype=float) > 1.0)
                & (np.asarray(kv_heads, dtype=float) > 1.0))
        out = np.where(paid, self.q_copy_us, 0.0)
        return out if out.ndim else float(out)

    def for_decode_layout(self, group: float, kv_heads: float = 1.0,
                          batch: float = 1.0) -> OperatorFit:
        """The fit a decode-attention layout of ``group`` query heads per KV head and
        ``kv_heads`` KV heads per device is priced with, in a decode-only step of ``batch``
        sequences: the floor of the kernel the engine dispatches for it
        (:meth:`decode_floor`), plus its query copy (:meth:`q_copy_floor`)."""
        floor = self.decode_floor(float(group)) + self.q_copy_floor(float(group), float(batch),
                                                                    float(kv_heads))
        if floor == self.floor_us:
            return self
        return self.model_copy(update={"floor_us": floor})

    def decode_group(self, group: Any, head_dim: Any = HEAD_DIM_REF) -> tuple[Any, Any, Any]:
        """``(unit heads, KV bytes, rows)`` multipliers of decode attention for ``group`` query
        heads per KV head on one device (``rows``: of the per-(sequence, KV head) rows):
        ``(1, 1 + group_step * (ceil(group / 8) - 1), (1 + (group - 1) * group_q_rows +
        group_row_step * (ceil(group / 8) - 1)) * (head_dim / 128) ** group_row_head_dim_exp)``
        for the grouped-query kernel, else the
        per-query-head kernel's ``(group, group_memory * (1 + (group - 1) * group_reread),
        group * group_row_share)``."""
        if not self.group_limit:
            return 1.0, 1.0, 1.0
        g = np.asarray(group, dtype=float)
        other = ~self.grouped(g)
        width = (np.asarray(head_dim, dtype=float) / HEAD_DIM_REF) ** self.group_row_head_dim_exp
        out = (np.where(other, g, 1.0),
               np.where(other, self.group_memory * (1.0 + (g - 1.0) * self.group_reread),
                        1.0 + self.group_step * (np.ceil(g / 8.0) - 1.0)),
               np.where(other, g * self.group_row_share,
                        (1.0 + (g - 1.0) * self.group_q_rows
                         + self.group_row_step * (np.ceil(g / 8.0) - 1.0)) * width))
        if isinstance(group, np.ndarray):
            return out
        return float(out[0]), float(out[1]), float(out[2])

    def work_scale(self, head_dim: Any) -> Any:
        """Multiplier of an attention operator's FLOPs and bytes for its head dimension."""
        if not self.head_dim_exp:
            return 1.0
        if isinstance(head_dim, np.ndarray):
            return (head_dim / HEAD_DIM_REF) ** self.head_dim_exp
        return float(head_dim / HEAD_DIM_REF) ** self.head_dim_exp

    def flops_scale(self, head_dim: Any) -> Any:
        """Multiplier of prefill attention's FLOPs for its head dimension: the work scale
        and the softmax floor (``softmax_dim``)."""
        scale = self.work_scale(head_dim)
        if not self.softmax_dim:
            return scale
        if isinstance(head_dim, np.ndarray):
            return scale * np.maximum(1.0, self.softmax_dim / head_dim)
        return scale * max(1.0, self.softmax_dim / float(head_dim))

    def parts(self, peak_flops: float, bandwidth: float, flops: Any, nbytes: Any,
              units: Any = 1.0, quant: Any = 1.0, warm: Any = 0.0,
              kernels: float = 1.0, streamed: Any = 0.0) -> tuple[Any, Any]:
        """Compute and memory seconds (floats or numpy arrays).

        ``quant`` is the tile/wave multiplier of the FLOPs (1 without ``tile_m``); the fill
        term adds ``F * (half_units / U)``, which stays constant while F grows with U.
        ``warm`` is the share of the bytes read from a warm L2 (:attr:`l2_speedup`): 0, the
        default, wherever the step model prices an operator. ``kernels``: the work is that
        many kernels' (a group of GEMMs priced as one operator), each paying the half-work
        terms (``half_flops``, ``half_bytes``) as the single kernels the fit was made on do.
        ``streamed``: the least memory seconds of a kernel whose blocks stream their share
        alone (:meth:`expert_stream_seconds`; 0, the default, none).
        """
        if self.l2_speedup != 1.0:
            nbytes = nbytes * (1.0 - warm * (1.0 - 1.0 / self.l2_speedup))
        fewest = np.maximum(units, 1e-9) if isinstance(units, np.ndarray) else max(units, 1e-9)
        under = (units + self.half_units) / fewest if self.half_units else 1.0
        if self.tile_m:
            flops_eff = flops * quant + (flops * (under - 1.0) if self.half_units else 0.0)
        else:
            flops_eff = flops * under
        half_flops, half_bytes = self.half_flops * kernels, self.half_bytes * kernels
        compute = (flops_eff + half_flops) / (peak_flops * self.compute) * (flops > 0)
        if self.sustained_rate != 1.0:  # a long kernel runs at a lower clock
            longer = compute / (kernels * self.sustained_us * 1e-6)
            compute = compute * (1.0 + (1.0 / self.sustained_rate - 1.0)
                                 * longer / (1.0 + longer))
        memory = (nbytes * under + half_bytes) / (bandwidth * self.memory) * (nbytes > 0)
        if self.block_gbs:  # waves of blocks, each streaming its share at one block's rate
            blocks = np.maximum(units, 1.0) if isinstance(units, np.ndarray) else max(units, 1.0)
            alone = np.ceil(blocks / self.resident_blocks) * nbytes / (blocks * self.block_gbs
                                                                        * 1e9)
            memory = np.maximum(memory, alone)
        if self.expert_block_gbs:
            memory = np.maximum(memory, streamed)
        return compute, memory

    def remote_rows(self, slots: Any, gate_up: Any, hidden: Any) -> Any:
        """Per-row elements (priced at ``per_row_ps``) of ``slots`` routed token slots whose
        expert is on another rank, with ``gate_up`` columns in the first GEMM's output and
        ``hidden`` in the second's (:attr:`remote_slots`; 0 without the term)."""
        if not self.remote_slots:
            return 0.0
        return slots * (gate_up + hidden)

    def slot_rows(self, slots: Any, gate_up: Any, hidden: Any) -> Any:
        """Per-row elements (priced at ``per_row_ps``) the routing kernels move for ``slots``
        token slots routed to the rank, ``gate_up`` columns in the first GEMM's output and
        ``hidden`` in the second's (:attr:`slot_kernels`; 0 without the term): the
        permutation reads and writes ``hidden`` per slot, the gated activation reads
        ``gate_up`` and writes half of it, the un-permutation reads ``hidden``."""
        if not self.slot_kernels:
            return 0.0
        return slots * (3.0 * hidden + 1.5 * gate_up)

    def fixed(self, rows: Any = 0.0, busy: Any = 0.0, units: Any = 0.0,
              depth: Any = 0.0, written: Any = 0.0) -> Any:
        """Seconds added to the larger of compute and memory (``busy``): the floor and the
        per-row work (``rows`` per-row elements, and for a GEMM family ``units`` input rows
        at ``per_unit_ns`` and ``depth``, the sum of its GEMMs' k, at ``per_k_ps``; for
        prefill attention ``written`` K/V elements stored into the cache at
        ``kv_write_ps``), less the share of that work hidden under ``busy``
        (``row_overlap``). The sum ``busy + fixed`` never decreases in ``busy``, ``rows``,
        ``units``, ``depth`` or ``written``."""
        per_row = rows * self.per_row_ps * 1e-12
        if self.kv_write_ps:
            per_row = per_row + written * self.kv_write_ps * 1e-12
        if self.per_unit_ns:
            per_row = per_row + units * self.per_unit_ns * 1e-9
        if self.per_k_ps:
            per_row = per_row + depth * self.per_k_ps * 1e-12
        if not self.row_overlap:
            return self.floor_us * 1e-6 + per_row
        arrays = isinstance(busy, np.ndarray) or isinstance(per_row, np.ndarray)
        hidden = np.minimum(busy, per_row) if arrays else min(busy, per_row)
        return self.floor_us * 1e-6 + per_row - self.row_overlap * hidden

    def seconds(self, peak_flops: float, bandwidth: float, flops: Any, nbytes: Any,
                units: Any = 1.0, rows: Any = 0.0, quant: Any = 1.0, warm: Any = 0.0,
                depth: Any = 0.0, written: Any = 0.0, streamed: Any = 0.0) -> Any:
        compute, memory = self.parts(peak_flops, bandwidth, flops, nbytes, units, quant, warm,
                                     streamed=streamed)
        busy = self.busy(compute, memory)
        return busy + self.fixed(rows, busy, units, depth, written)

    def expert_stream_seconds(self, experts: Any, slots: Any, gate_up: Any, hidden: Any,
                              element_bytes: float, sms: int | None) -> Any:
        """The least memory seconds of a Triton fused MoE (:attr:`expert_block_gbs`; 0 without
        the term): ``experts`` hit on the rank with ``slots`` token slots each, ``gate_up``
        columns in the first GEMM's output over ``hidden``, the down GEMM ``hidden`` columns
        over ``gate_up / 2``, weights of ``element_bytes``. Each GEMM is a kernel whose
        blocks (``expert_block_m`` slots of one expert x ``expert_block_n`` columns, every
        expert's slots padded to whole blocks) each stream their weight columns alone, at most
        ``expert_blocks_per_sm`` x ``sms`` at once: ceil(blocks / resident) x bytes / (blocks x
        rate), summed over the two."""
        if not self.expert_block_gbs or not sms:
            return 0.0
        resident = self.expert_blocks_per_sm * sms
        row_blocks = experts * np.ceil(np.maximum(slots, 1.0) / self.expert_block_m)
        out: Any = 0.0
        for columns, depth in ((gate_up, hidden), (hidden, gate_up / 2.0)):
            blocks = np.maximum(row_blocks * np.ceil(columns / self.expert_block_n), 1.0)
            weights = experts * columns * depth * element_bytes
            out = out + (np.ceil(blocks / resident) * weights
                         / (blocks * self.expert_block_gbs * 1e9))
        return out

    def group_seconds(self, groups: Any) -> Any:
        """Seconds of ``groups`` experts hit on the rank (:attr:`per_group_ns`)."""
        return groups * self.per_group_ns * 1e-9 if self.per_group_ns else 0.0

    def expanded_seconds(self, blocks: Any) -> Any:
        """Seconds of ``blocks`` thread-block iterations of the expanded-space activation
        kernel (:attr:`expanded_block_ns`, :func:`expanded_activation_blocks`)."""
        return blocks * self.expanded_block_ns * 1e-9 if self.expanded_block_ns else 0.0

    def busy(self, compute: Any, memory: Any) -> Any:
        """The larger of ``compute`` and ``memory`` plus the exposed share of the smaller
        (:attr:`exposed`); never decreases in either."""
        arrays = isinstance(compute, np.ndarray) or isinstance(memory, np.ndarray)
        if arrays:
            longer = np.maximum(compute, memory)
            return longer + self.exposed * np.minimum(compute, memory) if self.exposed else longer
        if self.exposed:
            return max(compute, memory) + self.exposed * min(compute, memory)
        return max(compute, memory)


class CollectiveCurve(Frozen):
    """Measured time of the engine's all-reduce over ``ranks`` devices of one scale-up domain.

    Knots ``[elements, microseconds]`` as the engine runs it (custom one-/two-shot kernels for
    small messages, NCCL above); outside the knots the link's alpha-beta model applies. The
    size is the message's element count of a 16-bit tensor, as AIConfigurator's collector
    measures it (ai-dynamo/aiconfigurator ``collector/collect_all_reduce.py``: ``message_size``
    elements of bf16) and as the step model prices the TP all-reduce
    (:data:`simulator.cost.operators.RESIDUAL_BYTES`).

    Between knots the time is interpolated linearly in the size, on the curve's lower
    envelope (:meth:`knots`). Within one algorithm and protocol an all-reduce takes a latency
    plus a time per byte (NCCL's own tuning model, ``src/graph/tuning.cc``: a base latency and
    a bandwidth per algorithm and protocol), which is a straight line in the size: a straight
    line between knots is exact there, where a straight line in log-log lies above it (the
    log of ``a + b * size`` is convex in the log of the size). A larger message never takes
    less time than a smaller one, and a timing's noise only adds to it, so a knot above a
    later, larger one is read as that later time (the largest non-decreasing curve under the
    knots). Both were decided on the knots alone: dropping each interior knot in turn and
    predicting it from its neighbours, the median error over every engine's and device's
    curve (51 curves) is 7.5 % in log-log and 4.2 % with this rule (mean 8.5 and 4.9 %;
    :func:`simulator.validation.kernel_fit_comm.knot_errors`).
    """

    ranks: int = Field(ge=2, description="Devices in the all-reduce group.")
    points: list[tuple[float, float]] = Field(min_length=2, description=(
        "Message size (16-bit elements) and measured microseconds, increasing in size."))

    @model_validator(mode="after")
    def _increasing(self) -> CollectiveCurve:
        sizes = [b for b, _ in self.points]
        if any(b <= 0 for b in sizes) or any(t <= 0 for _, t in self.points):
            raise ValueError("points must be positive")
        if any(b2 <= b1 for b1, b2 in itertools.pairwise(sizes)):
            raise ValueError("points must increase in size")
        return self

    def knots(self) -> tuple[np.ndarray, np.ndarray]:
        """Sizes and microseconds of the knots as :meth:`seconds` interpolates them: each time
        the least of its own and every larger message's (a caller pricing many messages
        computes them once and passes them in)."""
        return (np.array([b for b, _ in self.points]),
                lower_envelope(np.array([t for _, t in self.points])))

    def seconds(self, elements: float,
                knots: tuple[np.ndarray, np.ndarray] | None = None) -> float | None:
        sizes, times = knots if knots is not None else self.knots()
        if not sizes[0] <= elements <= sizes[-1]:
            return None
        return float(np.interp(elements, sizes, times)) * 1e-6


def lower_envelope(times: np.ndarray) -> np.ndarray:
    """The largest non-decreasing sequence not above ``times`` (each entry the least of itself
    and every later one): the time of a message no larger than the next ones."""
    return np.minimum.accumulate(np.asarray(times, float)[::-1])[::-1]


class OperatorFits(Frozen):
    """Per-operator roofline constants of a device for one serving engine's kernels."""

    source: str = Field(description="Package, version and tables the fits come from.")
    fits: dict[OperatorClass, OperatorFit] = Field(description="Constants per operator family.")
    allreduce: list[CollectiveCurve] = Field(default_factory=list, description=(
        "The engine's all-reduce inside one scale-up domain, per group size."))

    @model_validator(mode="after")
    def _terms_of_their_families(self) -> OperatorFits:
        """``exposed`` belongs to GEMM, MoE and prefill-attention fits, ``per_group_ns`` to
        MoE fits, ``key_tiles`` and the K/V store (``kv_write_ps``) to prefill-attention
        fits (not MLA), the slower rate of a long
        kernel (``sustained_rate``) to GEMM fits and the grouped decode kernel's width and
        RoPE terms (``group_row_head_dim_exp``, ``rope_kernel_us``) to decode-attention fits,
        the head blocks of a split-KV MLA kernel (``head_block``) to MLA decode fits: the fits
        are made there only."""
        for family, fit in self.fits.items():
            if fit.exposed and not family.startswith(EXPOSED_FAMILIES):
                raise ValueError(f"fits.{family}.exposed: only GEMM, MoE and prefill-attention "
                                 f"families (gemm*, moe*, attention_prefill*) take it; got "
                                 f"{fit.exposed}")
            if fit.slot_kernels and not family.startswith("moe"):
                raise ValueError(f"fits.{family}.slot_kernels: only MoE families (moe*) "
                                 f"take it")
            if fit.expert_block_gbs and not family.startswith("moe"):
                raise ValueError(f"fits.{family}.expert_block_gbs: only MoE families (moe*) "
                                 f"take it; got {fit.expert_block_gbs}")
            if fit.per_group_ns and not family.startswith("moe"):
                raise ValueError(f"fits.{family}.per_group_ns: only MoE families (moe*) "
                                 f"take it; got {fit.per_group_ns}")
            if fit.expanded_block_ns and not family.startswith("moe"):
                raise ValueError(f"fits.{family}.expanded_block_ns: only MoE families (moe*) "
                                 f"take it; got {fit.expanded_block_ns}")
            if fit.per_k_ps and not family.startswith("gemm"):
                raise ValueError(f"fits.{family}.per_k_ps: only GEMM families (gemm*) "
                                 f"take it; got {fit.per_k_ps}")
            if fit.sustained_rate != 1.0 and not family.startswith("gemm"):
                raise ValueError(f"fits.{family}.sustained_rate: only GEMM families (gemm*) "
                                 f"take it; got {fit.sustained_rate}")
            for name in ("group_row_head_dim_exp", "rope_kernel_us", "q_copy_us"):
                if getattr(fit, name) and not family.startswith("attention_decode"):
                    raise ValueError(f"fits.{family}.{name}: only decode-attention families "
                                     f"(attention_decode*) take it; got {getattr(fit, name)}")
            if fit.head_block and not family.startswith("attention_decode_mla"):
                raise ValueError(f"fits.{family}.head_block: only MLA decode families "
                                 f"(attention_decode_mla*) take it; got {fit.head_block}")
            if fit.kv_write_ps and not takes_key_tiles(family):
                raise ValueError(f"fits.{family}.kv_write_ps: only prefill-attention families "
                                 f"(attention_prefill*, not MLA) take it; got "
                                 f"{fit.kv_write_ps}")
            if fit.key_tiles and not takes_key_tiles(family):
                raise ValueError(f"fits.{family}.key_tiles: only prefill-attention families "
                                 f"(attention_prefill*, not MLA) take it; got "
                                 f"{fit.key_tiles!r}")
        return self


DeepEPPhase = Literal["dispatch", "combine"]


class DeepEPCost(Frozen):
    """Measured time of one DeepEP dispatch or combine inside one NVLink domain.

    For ``T`` tokens on every rank, each sent as ``c`` remote copies of ``w`` bytes
    (:func:`simulator.cost.moe_comm.alltoall_seconds` counts them), a model with ``E``
    routed experts and hidden size ``H``, on a kernel spread over ``S`` SMs::

        t = floor + E * expert_ns + H * channel_ns                      # latency
            + T * c * w * (1 / copy_bw + 1 / (S * sm_bw))               # copies sent
            + T * w / token_bw                                          # each token once

    A rate of 0 switches its term off.
    """

    floor_us: float = Field(ge=0, description="Fixed latency of the kernel, microseconds.")
    expert_ns: float = Field(0.0, ge=0, description=(
        "Latency per routed expert of the model, nanoseconds (the low-latency kernels "
        "signal a token count to, and wait on one from, every expert)."))
    channel_ns: float = Field(0.0, ge=0, description=(
        "Latency per hidden channel, nanoseconds (one token's trip through the kernel)."))
    copy_gb_per_s: float = Field(0.0, ge=0, description=(
        "Rate of the remote copies' bytes, GB/s (0: off)."))
    sm_gb_per_s: float = Field(0.0, ge=0, description=(
        "Rate of the remote copies' bytes per SM the kernel runs on, GB/s (0: off; the "
        "low-latency kernels launch one block per expert group, see "
        ":func:`simulator.cost.moe_comm.low_latency_sms`)."))
    token_gb_per_s: float = Field(0.0, ge=0, description=(
        "Rate of each token's bytes read once on its own rank, GB/s (0: off)."))
    rows: int = Field(0, ge=0, description="Measured points the constants were fitted on.")

    def seconds(self, tokens: Any, width: Any, copies: Any, hidden: Any, experts: Any,
                sms: Any = 1.0, hottest: Any = 1.0) -> Any:
        """Seconds for ``tokens`` per rank (floats or numpy arrays); ``hottest`` stretches the
        copies the busiest rank receives."""
        fixed = (self.floor_us + (self.expert_ns * experts + self.channel_ns * hidden) * 1e-3)
        sent = tokens * copies * width * hottest
        per_byte = (1.0 / (self.copy_gb_per_s * 1e9) if self.copy_gb_per_s else 0.0)
        out = fixed * 1e-6 + sent * per_byte
        if self.sm_gb_per_s:
            out = out + sent / (sms * self.sm_gb_per_s * 1e9)
        if self.token_gb_per_s:
            out = out + tokens * width / (self.token_gb_per_s * 1e9)
        return out


class DeepEPFits(Frozen):
    """DeepEP's dispatch and combine on one device, measured inside one NVLink domain."""

    source: str = Field(description="Package, version and tables the constants come from.")
    ranks: int = Field(ge=2, description="EP ranks of the measured group.")
    normal_sms: int = Field(ge=2, description=(
        "SMs of the measured normal kernels: DeepEP's default (deep_ep/buffer.py "
        "`Buffer.num_sms = 20`), which SGLang keeps without --deepep-config."))
    low_latency: dict[DeepEPPhase, DeepEPCost] = Field(description="Low-latency kernels.")
    normal: dict[DeepEPPhase, DeepEPCost] = Field(description="Normal (high-throughput) kernels.")
