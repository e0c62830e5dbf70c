"""Fit per-operator roofline constants on NVIDIA AIConfigurator's measured kernel tables.

    pip install 'disagg-sim[kernels]'         # or: --data DIR (an unpacked systems/data)
    python -m simulator.validation.kernel_fit --markdown            # errors only
    python -m simulator.validation.kernel_fit --write               # and update profiles

For every device profile that names its ``kernel_tables`` system, and one engine's tables
(``--engine``, vLLM by default, each table at its newest version), each operator family
(BF16/FP8/FP4 GEMM, prefill and decode attention, MoE) gets the seven constants of
:class:`simulator.hardware.operator_fits.OperatorFit`, fitted on log(predicted / measured)
(relative errors, so a 5 us kernel counts as much as a 50 ms one): least squares from four
starts, then least absolute error by reweighting. The engine's all-reduce becomes a
:class:`~simulator.hardware.operator_fits.CollectiveCurve` with every other measured size as a
knot. Shapes are split before fitting: a quarter of the distinct weight shapes (GEMM
``n x k``; attention head layouts; MoE model layouts), and the all-reduce sizes between
knots, are held out and never seen by the fit; the reported errors are on those, with
today's device-wide constants and link model ("before") and the fit ("after"). A fit is
written only where it beats the device-wide constants on its own training shapes.

Only the per-operator tables are read (``gemm_perf``, ``context_attention_perf``,
``generation_attention_perf``, ``moe_perf``, ``custom_allreduce_perf``); nothing else in the
package is opened.
"""

from __future__ import annotations

import argparse
import fnmatch
import functools
import itertools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.cost.roofline import TILE_CANDIDATES, causal_quantisation
from simulator.hardware.operator_fits import (
    EXPOSED_FAMILIES,
    PACKED_KEY_TILES,
    SGLANG_TUNED_MOE_CONFIGS,
    WHOLE_CONTEXT,
    CollectiveCurve,
    OperatorFit,
    takes_key_tiles,
)
from simulator.hardware.profiles import DeviceProfile
from simulator.hardware.registry import load_device
from simulator.runner.kernel_tables import (
    _pick_version,
    _version_key,
    devices_with_tables,
    package_version,
    tables_root,
)
from simulator.validation.calibrate import levenberg_marquardt
from simulator.validation.kernel_fit_comm import allreduce_curves
from simulator.validation.kernel_fit_predict import (
    _bytes_rows,
    _work,
    both_kv_row,
    causal_shares,
    evaluate,
    expert_streamed,
    extra_floor,
    flops,
    gemm_depth,
    kv_written,
    predict,
    training_ape,
    training_time_score,
    warm_share,
)
from simulator.validation.kernel_fit_profile import write_profile
from simulator.validation.kernel_fit_report import interpolation_errors
from simulator.validation.kernel_fit_samples import (
    HOLDOUT_SHARE,
    Samples,
    attention_samples,
    gemm_samples,
    mixed_routing,
    mla_samples,
    moe_samples,
)

__all__ = ["Samples", "attention_samples", "evaluate", "fit", "fit_family", "gemm_samples",
           "keeps_long_rate", "main", "moe_samples", "training_ape"]

MAX_FIT_ROWS = 6000
ROBUST_ROUNDS = 4
_SIZES = (64, 128, 256)
_GEMM_TILES = tuple((m, n, split) for split in (False, True) for m in _SIZES for n in _SIZES)
TILE_CHOICES: dict[str, tuple[tuple[int, int, bool], ...]] = {
    "gemm": ((0, 0, False), *_GEMM_TILES),
    "attention_prefill": ((0, 0, False), *((m, 0, False) for m in _SIZES)),
    "attention_decode": ((0, 0, False), *((s, 0, False) for s in (128, 256, 512, 1024))),
}
"""Tile sizes each family may choose from (``(0, 0, False)``: no quantisation), on its
training shapes only. GEMM-like families (BF16/FP8/FP4 GEMM, MoE) tile ``m`` and ``n``, with
or without split-K; prefill attention tiles the query rows of each (sequence, head); decode
attention's tile is its split-KV partition in context tokens."""
DISPATCH_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm", "gemm_fp8"): ("cutlass_sm90_fp8",), ("sglang", "gemm_fp8"): ("sgl_kernel_sm90_fp8",),
    ("sglang", "gemm_fp4"): ("flashinfer_cutlass_sm100_nvfp4",),
    ("vllm", "gemm"): ("cublas_fastest",), ("sglang", "gemm"): ("cublas_fastest",),
    ("trtllm", "gemm"): ("cublas_fastest",)}
"""Tile dispatch tables (:data:`simulator.cost.roofline.TILE_DISPATCH`) an engine's family may
choose instead of one tile size, with or without split-K, on its training shapes only: the
engine's own kernel dispatch, offered only on the tables of the architecture it was built for
(:data:`DISPATCH_TABLES`)."""
HOPPER_TABLES = ("h100_sxm", "h200_sxm")
BLACKWELL_TABLES = ("b200_sxm", "gb200")
ADA_TABLES = ("l40s",)
DISPATCH_TABLES: dict[str, tuple[str, ...]] = {
    "cutlass_sm90_fp8": HOPPER_TABLES, "sgl_kernel_sm90_fp8": HOPPER_TABLES,
    "flashinfer_cutlass_sm100_nvfp4": BLACKWELL_TABLES, "cublas_fastest": ADA_TABLES}
"""The kernel tables (AIConfigurator systems) each dispatch of :data:`DISPATCH_CHOICES` is
offered on: SM90 kernels on Hopper, FlashInfer's SM100 NVFP4 GEMM on B200 and GB200, cuBLAS's
choice among its tiles on the L40S (Ada), where the single-tile BF16 fits priced small
GEMMs over many rows up to twice too slow (vLLM 0.24.0: weights of at most 128 x 128 at
65-4,096 rows, +45 … +101 % median per row count; +20 … +30 % with the candidates)."""
GEMM_DEPTH_TABLES: dict[str, tuple[str, ...]] = {
    "vllm": ADA_TABLES, "trtllm": ADA_TABLES, "sglang": (*ADA_TABLES, "b200_sxm")}
"""Tables (per engine) whose GEMM families are offered a time per unit of each GEMM's depth
(``OperatorFit.per_k_ps``), on their chosen terms and on their training shapes only: the
L40S, where every GEMM family of the three engines priced GEMMs of a few microseconds with
one floor (vLLM 0.24.0 BF16 at 2-16 rows: 512 x 512 3.7 us, 1,024 x 1,024 5.5 us, 128 x 128
2.1 us, where the weights' bytes make under 1.5 us of the difference), and SGLang's B200
tables (its FP8 GEMM at 10.4 % held out)."""
LOAD_ROW_CHOICES = (48.0, 56.0, 64.0)
"""``OperatorFit.tile_load_rows`` a candidate tile set (:data:`simulator.cost.roofline.
TILE_CANDIDATES`) may choose, on its training shapes only: a 128 x 128 tile is load-bound
above 64, a 64 x 64 tile above 32."""
FMHA_MLA_DECODE_TABLES: dict[str, tuple[str, ...]] = {"trtllm": ("a100_sxm", "l40s")}
"""Tables (per engine) whose MLA decode runs on a context FMHA kernel with the heads as
query rows and no split of the context (``OperatorFit.head_tile``): TensorRT-LLM on SM80 and
SM89, where none of its MLA generation kernels applies (cpp/tensorrt_llm/common/
attentionOp.cpp, ``mlaGeneration``). The MLA decode families there may also choose
:data:`HEAD_TILE_CHOICES` query rows per block, on their training shapes only."""
NO_SPLIT_DECODE_TABLES: dict[str, tuple[str, ...]] = {"trtllm": ("l40s",)}
"""Tables (per engine) whose decode attention may run without splitting the context: their
decode families may also choose a whole-context partition (``tile_m`` =
:data:`WHOLE_CONTEXT`, one block per sequence and KV head), on their training shapes only.
TensorRT-LLM's L40S FP8-KV tables stream in proportion to the sequences at long contexts
(1.3.0rc20, 32 query over 4 KV heads of dimension 128, 64k tokens: 64 / 127 / 254 / 507
GB/s for 1 / 2 / 4 / 8 sequences; with a BF16 KV cache one sequence streams 623 GB/s)."""
ROW_WIDTH_ENGINES = ("trtllm",)
Q_COPY_ENGINES = ("vllm",)

KV_WRITE_TABLES: dict[str, tuple[str, ...]] = {"vllm": (*BLACKWELL_TABLES, "l40s")}
"""Tables (per engine) whose prefill-attention fits (not MLA) are offered the time of storing
the prompt's K and V into the paged cache (``OperatorFit.kv_write_ps``), with every prefill
choice and on their training shapes only: vLLM's FlashInfer backend on B200 and GB200, whose
forward runs ``reshape_and_cache_flash`` before TensorRT-LLM's prefill kernel, and on the
L40S, where the same forward runs FlashInfer's FA2 prefill after the store
(vllm-project/vllm vllm/v1/attention/backends/flashinfer.py ``FlashInferImpl.forward``), and
AIConfigurator's collector times that forward (ai-dynamo/aiconfigurator
collector/vllm/collect_attn.py ``impl.forward``). In vLLM 0.24.0's B200 FP8-KV table the fit
without it priced prompts of 128-1,024 tokens with 16 or more query heads per KV head
26-101 % too slow and MHA layouts 7-17 % too fast (median per prompt length and group)."""
"""Engines whose grouped decode fits are offered the query copy of FlashAttention-2's
varlen decode path (``OperatorFit.q_copy_us``), on the chosen terms and on their training
shapes only: vLLM, which runs FA2 (``vllm_flash_attn_fa2``) on Ampere and Ada."""
"""Engines whose grouped decode fits are offered the per-row work's exponent in the head
dimension and the measured shapes' separate RoPE kernel (``OperatorFit.group_row_head_dim_exp``,
``rope_kernel_us``), on the chosen terms and on their training shapes only: TensorRT-LLM,
whose tables were timed with a rotary dimension of 128 at every head dimension
(:data:`simulator.hardware.operator_fits.COLLECTOR_ROTARY_DIM`) and whose XQA blocks' own
work grows with the head dimension (1.3.0rc20 H100, FP8 KV, 32 query over 8 KV heads,
2,048 sequences of 2 tokens: 135 / 183 / 301 us at head dimensions 64 / 128 / 256)."""
ROW_WIDTH_TABLES: dict[str, tuple[str, ...]] = {"sglang": BLACKWELL_TABLES}
"""Tables (per engine) whose grouped decode fits are offered the per-row work's exponent in
the head dimension only (not the RoPE kernel of :data:`ROW_WIDTH_ENGINES`): SGLang on B200 and
GB200, whose default decode runs TensorRT-LLM's kernels (``trtllm_mha``,
:data:`simulator.runner.kernel_tables.DEFAULT_ATTENTION_KERNELS`), a block per sequence and
KV head whose own work grows with the head dimension (SGLang 0.5.14 B200, BF16 KV, contexts
of 2–64 tokens: head dimension 64 priced +18 % too slow and 256 −19 % too fast by one width)."""
HEAD_BLOCK_TABLES: dict[str, dict[str, tuple[int, ...]]] = {"sglang": {"l40s": (16,)}}
"""Tables (per engine) whose MLA decode runs a split-KV kernel with a sequence's query heads in
blocks of a fixed count, and the counts its MLA decode families may choose
(``OperatorFit.head_block``), on their training shapes only: SGLang 0.5.14 on L40S, whose
default MLA backend on SM89 is Triton (the tables' ``kernel_source`` ``triton``), its grouped
decode kernel taking 16 query heads per block (sgl-project/sglang
python/sglang/srt/layers/attention/triton_ops/decode_attention.py,
``_decode_grouped_att_m_fwd``, ``BLOCK_H = 16``)."""
HEAD_TILE_CHOICES = (64,)
"""Query rows per block of :data:`FMHA_MLA_DECODE_TABLES`: 64, as the tables show. One
sequence takes the same time with 1 to 128 heads, and 128 heads take up to twice the time
of 64 or fewer once the blocks fill the GPU (A100, FP8 KV: 1,024 sequences of 16,383 tokens
50.5 ms with 128 heads, 26.0-26.2 ms with 1 to 64). 128 rows per block, offered too, won
the A100 FP8-KV training shapes by a hair and prices 128 heads as one block, which the
measurements rule out, so it is not offered."""
MOE_KERNEL_CHOICES: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm", "moe_fp8"): ("flashinfer_cutlass_sm90",)}
"""Grouped MoE kernels (``OperatorFit.moe_kernel``) an engine's MoE family may choose instead
of the power-of-two tiles of one gate+up GEMM, on Hopper tables only and on its training
shapes only. vLLM 0.24.0 runs its FP8 per-tensor experts on Hopper with FlashInfer's CUTLASS
fused MoE (the tables' ``kernel_source`` ``vllm_modeloptfp8moe_flashinfer_cutlass_
flashinferexperts``; its BF16 experts run the Triton fused-MoE kernel)."""
MOE_KERNEL_TILES: dict[str, tuple[tuple[int, int], ...]] = {
    "flashinfer_cutlass_sm90": ((128, 64), (128, 128), (128, 256), (256, 128))}
"""``tile_m x tile_n`` each grouped MoE kernel may choose: FlashInfer's grouped SM90 candidates
(flashinfer csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/cutlass_heuristic.cpp
``get_candidate_tiles_sm90``: 128 x {16, 32, 64, 128, 256} and 256 x 128) with ``tile_n`` at
least 64 (128 x 16 and 128 x 32 were offered on H100 and not chosen). No split-K: the grouped
kernel has none."""
MOE_ROUTINGS = ("expected", "rank0")
"""The load of the timed EP rank a MoE family's samples are priced with
(:func:`simulator.validation.kernel_fit_samples.moe_samples`), chosen per family on its
training shapes only: the step model's expected load under random routing, or the load the
collector's balanced routing puts on the rank it times (at least one whole expert hit and
one token slot on it, every hit expert distinct:
:func:`~simulator.validation.kernel_fit_samples.balanced_rank0_load`), and for the engines of
:data:`CLAMPED_MOE_ROUTINGS` that rank with every slot of its tokens computed there. Only the
samples change: the fitted function is the one the step model prices its own (expected) load
with."""
CLAMPED_MOE_ROUTINGS: dict[str, tuple[str, ...]] = {"sglang": ("rank0_clamped",)}
"""Engines whose collector times rank 0 with every slot of its tokens computed there, offered
that load as a further routing, chosen like the others on the training shapes only
(:func:`~simulator.validation.kernel_fit_samples.balanced_rank0_clamped_load`):
AIConfigurator's SGLang collector sets the slots routed to another rank's expert to local
expert 0 before the Triton fused MoE runs (collector/sglang/collect_moe.py,
``topk_ids.clamp(min=0)``). On A100 the 128-expert, top-8 layout of hidden size 2,048 at
8,192 tokens takes 0.94-0.97 of its EP 1 time at EP 2-8, where the rank's own slots are
1/2-1/8 of EP 1's."""
PER_LAYOUT_ROUTING_ENGINES = ("sglang",)
"""Engines whose MoE families may also price each model layout with its own load of the timed
rank (:func:`per_layout_fit`), chosen on the layout's training shapes only: SGLang's tables
were collected model by model (ai-dynamo/aiconfigurator ``collector/cases/models/*_cases.yaml``,
one collection plan per architecture) with collector versions that time EP > 1 differently.
One hands the kernel the whole batch with the other ranks' slots as expert -1 (written as
zeros); ``collector/sglang/collect_moe.py`` as of the clamp hands it only the tokens with an
expert on rank 0 and computes their other slots on local expert 0
(``topk_ids.clamp(min=0)``, :func:`~simulator.validation.kernel_fit_samples.
balanced_rank0_clamped_load`). The tables show both within one device's table: SGLang 0.5.14
on B200, at the largest batch, the Triton MoE of Mixtral-8x7B / 8x22B and Gemma-4 26B (top-8
of 128) takes 0.95-1.0 of its EP 1 time at EP 2 at every TP (every token keeps all its slots
on the rank), where Llama-4's, the 256-expert top-8 layout's and the 128-expert top-4 layout's
take 0.53-0.60; the FP8 block-scaled rows of DeepSeek-V3 (7,168 / 2,048, top-8 of 256) take
1.00 on both kernels where the other FP8 layouts take 0.54-0.72 (on FlashInfer's TensorRT-LLM
MoE the model's group-limited router puts every slot on the first 128 experts:
:func:`~simulator.validation.kernel_fit_samples.balanced_rank0_grouped_load`)."""
COLLECTOR_LOADS = ("rank0", "rank0_clamped")
"""The loads of the timed rank a layout may take in :func:`per_layout_fit`: the two ways the
collector has timed EP > 1 (the expected load under random routing is the step model's, not a
collector's, so a layout does not choose it)."""
PER_LAYOUT_ROUNDS = 2
"""Rounds of :func:`per_layout_fit`: choose each layout's load, refit on the mixed samples,
choose again with that fit."""
MOE_KERNEL_FAMILIES: dict[str, dict[str, str]] = {
    "sglang": {"sglang_flashinfer_trtllm_moe": "_flashinfer_trtllm"}}
"""MoE rows an engine's tables time on a second kernel (the table's ``kernel_source``), fitted
as a family of their own (``moe`` + suffix, here ``moe_flashinfer_trtllm``) where a table holds
them; the other rows stay the ``moe`` family. SGLang's Blackwell tables (b200_sxm, gb200, 0.5.14)
time the Qwen3 and Qwen3.5 MoE layouts on FlashInfer's TensorRT-LLM MoE and the others on the
Triton fused MoE, which one curve missed by about +27 % and -32 % (B200 median); the step
model picks the family by SGLang's own rule
(:func:`simulator.hardware.operator_fits.moe_kernel_family`)."""
TUNED_MOE_CONFIGS: dict[str, dict[str, frozenset[tuple[int, int]]]] = {
    "sglang": SGLANG_TUNED_MOE_CONFIGS}
"""Per engine, the MoE layouts its Triton fused MoE runs with a tuned configuration, per system
of the tables; their BF16 rows are fitted as the ``moe_tuned`` family, the other layouts'
batches of at most as many tokens as the rank has experts as ``moe_few_tokens`` and the rest
stay ``moe`` (:func:`simulator.hardware.operator_fits.moe_fit_labels` picks for the step
model)."""
MOE_FP8_DTYPES: dict[str, str] = {"sglang": "fp8_block"}
"""The ``moe_dtype`` of the FP8 expert rows an engine's ``moe_fp8`` family is fitted on, where
not per-tensor ``fp8``: SGLang's tables (0.5.x) time FP8 experts only block-scaled
(``fp8_block``, 128 x 128 weight blocks and per-token-group activation scales, the
quantisation of DeepSeek-V3's and Qwen3's FP8 checkpoints), on its Triton fused MoE and, on
Blackwell, on FlashInfer's TensorRT-LLM MoE."""
REMOTE_SLOT_ENGINES = ("vllm", "sglang")
"""Engines whose MoE fits are offered the other ranks' token slots (``OperatorFit.remote_slots``),
on their training shapes only: both run the Triton fused-MoE kernel, which writes zeros for
every slot routed to another rank's expert (vllm/model_executor/layers/fused_moe/fused_moe.py,
sglang .../fused_moe_triton/, ``write_zeros_to_output``). TensorRT-LLM's CUTLASS MoE
gathers only its own rank's slots and writes nothing for the others
(cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/, ``expandInputRowsKernel`` and
``finalizeMoeRoutingKernel`` skip experts outside the rank), so its fits are not."""
EXPERT_BLOCK_CHOICES: dict[tuple[str, str], tuple[int, int]] = {("sglang", "moe"): (64, 64)}
"""MoE families (engine, family) offered the rate one thread block of the Triton fused MoE
streams its weights at (``OperatorFit.expert_block_gbs``), with the block's rows and columns
(BLOCK_SIZE_M, BLOCK_SIZE_N), on the chosen terms and on the training shapes only: SGLang's
``moe`` family is its BF16 experts without a tuned configuration at more tokens than the
rank's experts, which SGLang 0.5.14 runs at 64 x 64 (BLOCK_SIZE_K 32, Triton's default
warps and stages; sgl-project/sglang python/sglang/srt/layers/moe/moe_runner/triton_utils/
fused_moe_triton_config.py, ``get_default_config``)."""
WARM_L2_MOE_FAMILIES = (("sglang", "moe"),)
"""MoE families (engine, family) whose shapes are offered the warm-L2 speed
(``OperatorFit.l2_speedup``, on a device with an L2 figure, where the hit experts' weights and
the activations fit it: :attr:`~simulator.validation.kernel_fit_samples.Samples.footprint`),
on the training shapes only; the others' samples carry no footprint. AIConfigurator's SGLang
collector allocates one set of expert weights and replays the fused MoE on it back to back,
changing only the routing between calls (ai-dynamo/aiconfigurator
collector/sglang/collect_moe.py, ``run_op``), so weights the L2 holds stay there. In SGLang
0.5.14's L40S table (96 MB of L2, 864 GB/s of GDDR6) Mixtral-8x7B's experts at TP 32 (eight
of 4,096 x 448 x 3, 88 MB) take 48 us at 16 tokens, 1.8 TB/s."""
EXPERT_BLOCK_GBS_STARTS = (5.0, 10.0, 20.0)
"""Block rates (GB/s) the fit of ``OperatorFit.expert_block_gbs`` also starts from, with the
chosen fit's other constants."""
EXPERT_BLOCKS_PER_SM = (2.0, 4.0, 8.0)
"""The resident thread blocks per SM (``OperatorFit.expert_blocks_per_sm``) a family of
:data:`EXPERT_BLOCK_CHOICES` may take, each fitted with its block rate: a 64 x 64 x 32 block
of 16-bit operands over Triton's default three stages holds 24 KiB of shared memory."""
SLOT_KERNEL_ENGINES = ("trtllm",)
"""Engines whose MoE fits are offered the work of the routing kernels outside the grouped
GEMMs per routed token slot (``OperatorFit.slot_kernels``), with every tile choice and on
their training shapes only: TensorRT-LLM, whose CUTLASS fused MoE runs the permutation, the
gated activation and the un-permutation as kernels of their own between and after its two
grouped GEMMs (cpp/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/moe_kernels.cu:
``expandInputRowsKernel``, ``doActivationKernel``, ``finalizeMoeRoutingKernel``), each
moving elements per slot on the rank. On TensorRT-LLM 1.3.0rc20's tables every MoE fit
took it but L40S FP8 (H200 BF16 training shapes 8.7 -> 5.4 %, median APE of the thinned
training set); vLLM's and SGLang's Triton kernel gathers its rows inside the GEMM and is not
offered it."""
EXPANDED_ACTIVATION_FAMILIES: dict[str, tuple[str, ...]] = {
    "sglang": ("moe_fp8_flashinfer_trtllm",)}
"""MoE families (per engine) offered a time per thread-block iteration of the
expanded-space activation kernel (``OperatorFit.expanded_block_ns``), on their chosen terms
and on their training shapes only: block-scaled FP8 experts on FlashInfer's TensorRT-LLM-gen
fused MoE, SGLang's on Blackwell, whose SwiGLU + FP8 re-quantisation between the two grouped
GEMMs is a kernel of its own gridded over the whole batch's tokens x top-k slots x
128-column scale blocks (flashinfer csrc/trtllm_fused_moe_dev_kernel.cu,
``activationDeepSeekKernel``; :func:`simulator.hardware.operator_fits.
expanded_activation_blocks`). The collector hands the kernel the whole batch at every EP
size (ai-dynamo/aiconfigurator collector/sglang/collect_moe.py, the FusedMoE path of the
``flashinfer_trtllm`` backend: every token's router logits over all experts, rank 0's
experts local), and SGLang 0.5.14's B200 tables show the time following the batch where the
rank's rows shrink: hidden 6,144, top-8 of 256, intermediate 2,048, TP 1, EP 256 (one expert
on the rank, 512 of the 131,072 slots) takes 1,030 us at 16,384 tokens and 519 us at 8,192,
and per further token at the largest EP of each TP 62, 41, 31 and 26 ns at TP 1, 2, 4 and 8
(16, 8, 4 and 2 scale blocks per slot). The fit without the term priced EP 256 a median
30 % too fast."""
KEY_TILE_ENGINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "vllm": ("fa3_sm90", HOPPER_TABLES), "sglang": ("fa3_sm90", HOPPER_TABLES),
    "trtllm": ("fmha_v2_sm90", HOPPER_TABLES)}
"""Engines, their prefill kernel's tile tables (``OperatorFit.key_tiles``,
:data:`simulator.hardware.operator_fits.KEY_TILES`) and the kernel tables they are offered on,
on the training shapes only: FlashAttention-3 for vLLM's FlashAttention backend and SGLang's
default ``fa3`` backend on Hopper, TensorRT-LLM's own SM90 context kernels. The 16-bit family
is offered the 16-bit table and the FP8-KV family the FP8 one."""


def key_tile_choice(engine: str, device: DeviceProfile, op: str) -> str:
    """The key-tile table (``OperatorFit.key_tiles``) the prefill-attention family ``op``
    (not MLA) of ``engine`` on ``device`` is offered, or ''."""
    kernel, tables = KEY_TILE_ENGINES.get(engine, ("", ()))
    if device.kernel_tables not in tables or not takes_key_tiles(op):
        return ""
    return kernel + ("_fp8" if op.endswith("_kv_fp8") else "_bf16")


CAUSAL_ENGINES = ("vllm", "trtllm", "sglang")
"""Engines whose prefill-attention fits are offered the causal tail, the K/V re-read share
and the softmax floor (``OperatorFit.causal_tail``, ``kv_reread_share``, ``softmax_dim``),
on their training shapes only: all three (on Blackwell each runs the persistent
TensorRT-LLM-gen prefill kernel, vLLM and SGLang through FlashInfer; elsewhere the training
shapes decide whether the terms help; docs/VALIDATION.md)."""
PACKS_EVERY_GROUP = 128
"""The group limit of a decode kernel that runs the query heads of one KV head as the rows of
one block at any group size, and plain multi-head attention (one query head per KV head) a
block per head. The default decode kernels of the vLLM and SGLang tables all do:
FlashAttention-2 (A100, L40S; Dao-AILab/flash-attention ``csrc/flash_attn/flash_api.cpp``:
``seqlenq_ngroups_swapped`` when one query token meets more query heads than KV heads, the
query reshaped to ``(batch, ngroups, num_heads_k, head_size)``), FlashAttention-3 (H100,
H200; ``hopper/flash_api.cpp``, ``pack_gqa``), and FlashInfer's decode and its TensorRT-LLM-gen
kernels (L40S, B200, GB200), which take the GQA group as one block's rows. 128 query heads
per KV head stand for "no limit": the kernel tables time at most 64, the catalog's layouts
have at most 16."""
GROUP_LIMIT_CHOICES: dict[str, tuple[int, ...]] = {
    "trtllm": (8, 16, 32, 64), "vllm": (PACKS_EVERY_GROUP,), "sglang": (PACKS_EVERY_GROUP,)}
"""Group limits (``OperatorFit.group_limit``) an engine's decode-attention fit may choose,
on its training shapes only, against none: TensorRT-LLM's XQA kernels take up to 32 query
heads per KV head and the engine runs masked multi-head attention above
(cpp/tensorrt_llm/kernels/decoderMaskedMultiheadAttention/decoderXQAImplJIT/kernelUtils.cpp,
``supportConfigHMMA`` / ``supportConfigQGMMA``: ``head_grp_size * beam_width > 32`` is not
supported). vLLM's and SGLang's decode kernels fold every group into one block per
(sequence, KV head) (:data:`PACKS_EVERY_GROUP`)."""
_GROUP_START = [-1.0, -1.0, 0.0, math.log(0.375 / 1.125), -2.0]
"""Starts of the group terms (logits): ``group_reread`` and ``group_row_share`` 0.27,
``row_overlap`` 0.5, ``group_memory`` 0.875, ``group_q_rows`` 0.12."""
_KERNEL_START = [math.log(5.0), math.log(0.1 / 1.9), math.log(0.125 / 0.875)]
"""Starts of ``log(group_floor_us)`` (5 us) and of the ``group_step`` (0.1) and
``group_row_step`` (0.5) logits."""
K0_CHOICES = (0, 128, 256, 512, 1024, 2048)
"""Per-tile fixed work (``OperatorFit.tile_k0``) a tiled GEMM-like fit may choose, once its
tiles are chosen."""


def tile_choices(op: str) -> tuple[tuple[int, int, bool], ...]:
    return TILE_CHOICES.get(op.removesuffix("_kv_fp8").removesuffix("_mla"), TILE_CHOICES["gemm"])


def _sig(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(min(v, 40.0), -40.0)))


def _exp(v: float) -> float:
    return math.exp(min(v, 40.0))


def _capped_exp(cap: float) -> Callable[[float], float]:
    return lambda v: min(_exp(v), cap)


def _exponent(v: float) -> float:
    """A fitted exponent, within [-2, 2]."""
    return float(np.clip(v, -2, 2))


def _pop(x: np.ndarray, on: bool, value: Callable[[float], float],
         off: float = 0.0) -> tuple[float, np.ndarray]:
    """Where a term is fitted (``on``), its value from the last fitted element of ``x`` and
    ``x`` without that element; else ``off`` and ``x`` as it is."""
    return (value(x[-1]), x[:-1]) if on else (off, x)


# Only decode attention is fitted with the parallel-units fill term
# ``bytes * (units + half_units) / units`` (``half_units`` is 0 in every other fit).
# Elsewhere a batch can add a unit with little work (a GEMM row streams no new weights, a
# token routed to an expert already hit, a short prompt), so the term would fall and price
# the larger batch faster; tile/wave quantisation describes their under-filled SMs instead.
# A decode step is never priced below its longest sequence alone
# (OperatorPricing._decode_attention_op in cost/operators.py), which keeps the fill term
# there monotone.


def _to_fit(x: np.ndarray, rows: int, tile_m: int = 0, tile_n: int = 0,
            split_k: bool = False, fill: bool = True, tile_k0: int = 0,
            pack_gqa: bool = False, dispatch: str = "", group_limit: int = 0,
            moe_kernel: str = "", causal: bool = False, softmax: bool = False,
            head_dim: bool = True, reread: bool = True, per_unit: bool = False,
            l2: bool = False, remote: bool = False, head_tile: int = 0,
            exposed: bool = False, per_group: bool = False, key_tiles: str = "",
            decode_hd: bool = False, sustained: bool = False, width: bool = False,
            rope: bool = False, block_sms: float = 0.0, qcopy: bool = False,
            slots: bool = False, head_block: int = 0, load_rows: float = 0.0,
            depth: bool = False, kv_write: bool = False, expanded: bool = False,
            expert_block: tuple[int, int, float] = (0, 0, 0.0)) -> OperatorFit:
    # ``slots`` (MoE) is a choice, not a fitted element (OperatorFit.slot_kernels).
    # With ``expert_block`` (MoE: block rows, block columns, blocks per SM) the very last
    # element is log(expert_block_gbs), stripped before all others; with ``expanded`` (MoE)
    # the last element left is log(expanded_block_ns), stripped next
    # (OperatorFit.expanded_block_ns); with ``kv_write`` (prefill attention) the last left
    # after those is log(kv_write_ps), stripped next (OperatorFit.kv_write_ps).
    block_m, block_n, per_sm = expert_block
    expert_gbs, x = _pop(x, bool(block_m), _capped_exp(1e4))
    expanded_ns, x = _pop(x, expanded, _capped_exp(1e4))
    write_ps, x = _pop(x, kv_write, _capped_exp(1e4))
    # With ``depth`` (GEMM families) the last element left is log(per_k_ps), stripped next
    # (OperatorFit.per_k_ps).
    per_k, x = _pop(x, depth, _capped_exp(1e5))
    # With ``head_block`` (MLA decode in a split-KV kernel's head blocks) the last two
    # elements left are log(head_block_rows) and the logit of head_block_reread, stripped
    # next (OperatorFit.head_block).
    block_rows = min(_exp(x[-2]), 1e6) if head_block else 0.0
    block_reread = _sig(x[-1]) if head_block else 0.0
    if head_block:
        x = x[:-2]
    # With ``qcopy`` (decode attention with a group limit) the very last element is
    # log(q_copy_us), stripped before all others (OperatorFit.q_copy_us).
    q_copy, x = _pop(x, bool(qcopy and group_limit), _capped_exp(100.0))
    # With ``block_sms`` (a whole-context decode kernel; the device's SMs) the very last
    # element is log(block_gbs), stripped before all others (OperatorFit.block_gbs).
    # With ``width`` (decode attention with a group limit) the last element is the grouped
    # kernel's per-row exponent in the head dimension (OperatorFit.group_row_head_dim_exp),
    # and with ``rope`` also, after it, log(rope_kernel_us); both are stripped first.
    # ``key_tiles`` is a choice, not a fitted element (OperatorFit.key_tiles). With
    # ``sustained`` (GEMM families) the last two elements are log(sustained_us) and the logit
    # of sustained_rate (OperatorFit.sustained_us, sustained_rate); before them, with ``l2``,
    # the last element is log(l2_speedup - 1) (OperatorFit.l2_speedup); with ``decode_hd``
    # (decode attention), the one before (or the last without ``l2``) is the head-dimension
    # exponent (OperatorFit.head_dim_exp); with ``exposed``, the one before that is the
    # logit of OperatorFit.exposed; with ``per_group``, the one before that is
    # log(per_group_ns); the others keep their places below.
    block_gbs, x = _pop(x, bool(block_sms), _capped_exp(1e4))
    rope_us, x = _pop(x, rope, _capped_exp(100.0))
    row_exp, x = _pop(x, width, _exponent)
    after_us, rate = ((100.0 + min(_exp(x[-2]), 1e6), 0.2 + 0.8 * _sig(x[-1])) if sustained
                      else (0.0, 1.0))
    if sustained:
        x = x[:-2]
    speedup, x = _pop(x, l2, lambda v: min(1.0 + _exp(v), 20.0), off=1.0)
    decode_exp, x = _pop(x, decode_hd, _exponent)
    share, x = _pop(x, exposed, _sig)
    group_ns, x = _pop(x, per_group, _exp)
    # With ``head_tile`` (MLA decode without split-KV, which has none of the terms below),
    # x[7] is log(resident_blocks).
    resident = _exp(x[7]) if head_tile and len(x) > 7 else 0.0
    # With ``causal`` (prefill attention), after the head-dimension exponent (``head_dim``:
    # the family has one, x[7]): the logits of causal_tail (0.05 to 2) and kv_reread_share;
    # the last, with ``softmax``: log(softmax_dim / 64). A family without re-read bytes
    # (``reread`` false: MLA, whose latent is read once) keeps kv_reread_share 1. With
    # ``per_unit`` (GEMM families, which have none of those terms) the last is
    # log(per_unit_ns).
    c = 8 if head_dim else 7
    # x[9:12], where present: row_overlap, group_memory, group_q_rows (decode, with a limit);
    # x[12:15], where present: log(group_floor_us) and the logits of group_step / 2 and
    # group_row_step / 4.
    # x[7], where present, is the head-dimension exponent (prefill attention) or, with a
    # group limit, the logit of the per-query-head kernel's KV re-read share (decode).
    extra: dict[str, Any] = {
        "group_limit": group_limit, "group_reread": _sig(x[7]), "group_row_share": _sig(x[8]),
        "row_overlap": _sig(x[9]) if len(x) > 9 else 0.0,
        "group_memory": 0.5 + 1.5 * _sig(x[10]) if len(x) > 9 else 1.0,
        "group_q_rows": _sig(x[11]) if len(x) > 9 else 0.0,
        "group_floor_us": _exp(x[12]) if len(x) > 12 else None,
        "group_step": 2.0 * _sig(x[13]) if len(x) > 13 else 0.0,
        "group_row_step": 4.0 * _sig(x[14]) if len(x) > 14 else 0.0,
        "group_row_head_dim_exp": row_exp, "rope_kernel_us": rope_us, "q_copy_us": q_copy,
        "head_dim_exp": decode_exp, "row_unit": "kv_head"} if group_limit else {
        "head_dim_exp": (float(np.clip(x[7], -2, 2)) if head_dim and len(x) > 7
                         else decode_exp),
        "causal_tail": 0.05 + 1.95 * _sig(x[c]) if causal and tile_m else 0.0,
        "kv_reread_share": _sig(x[c + 1]) if causal and tile_m and reread else 1.0,
        "softmax_dim": min(64.0 * _exp(x[-1]), 1024.0) if softmax else 0.0}
    return OperatorFit(**extra, compute=_sig(x[0]), half_flops=_exp(x[1]), memory=_sig(x[2]),
                       half_bytes=_exp(x[3]), floor_us=_exp(x[4]),
                       half_units=_exp(x[5]) if fill else 0.0,
                       per_row_ps=_exp(x[6]), per_unit_ns=_exp(x[-1]) if per_unit else 0.0,
                       rows=rows, tile_m=tile_m, tile_n=tile_n,
                       split_k=split_k, tile_k0=tile_k0 if tile_m else 0,
                       pack_gqa=pack_gqa and bool(tile_m),
                       tile_dispatch=dispatch if tile_n else "",
                       tile_load_rows=load_rows if tile_n and dispatch in TILE_CANDIDATES else 0.0,
                       per_k_ps=per_k, kv_write_ps=write_ps,
                       moe_kernel=moe_kernel if tile_n else "", l2_speedup=speedup,
                       remote_slots=remote, slot_kernels=slots, head_tile=head_tile,
                       resident_blocks=block_sms or resident,
                       exposed=share, per_group_ns=group_ns, expanded_block_ns=expanded_ns,
                       sustained_us=after_us,
                       sustained_rate=rate, key_tiles=key_tiles,  # type: ignore[arg-type]
                       block_gbs=block_gbs, head_block=head_block, head_block_rows=block_rows,
                       head_block_reread=block_reread, expert_block_gbs=expert_gbs,
                       expert_block_m=block_m, expert_block_n=block_n,
                       expert_blocks_per_sm=per_sm if block_m else 0.0)


def _rounded(f: OperatorFit) -> OperatorFit:
    def sig4(v: float) -> float:
        return float(f"{v:.4g}") if v > 1e-6 else 0.0  # a term the fit switched off
    return OperatorFit(compute=round(f.compute, 4), half_flops=sig4(f.half_flops),
                       memory=round(f.memory, 4), half_bytes=sig4(f.half_bytes),
                       half_units=sig4(f.half_units), floor_us=round(f.floor_us, 3),
                       per_row_ps=sig4(f.per_row_ps), per_unit_ns=sig4(f.per_unit_ns),
                       row_unit=f.row_unit, rows=f.rows,
                       tile_m=f.tile_m, tile_n=f.tile_n, split_k=f.split_k, tile_k0=f.tile_k0,
                       head_dim_exp=round(f.head_dim_exp, 3), pack_gqa=f.pack_gqa,
                       causal_tail=round(f.causal_tail, 3), softmax_dim=round(f.softmax_dim, 1),
                       kv_reread_share=round(f.kv_reread_share, 4),
                       tile_dispatch=f.tile_dispatch, moe_kernel=f.moe_kernel,
                       tile_load_rows=f.tile_load_rows, per_k_ps=sig4(f.per_k_ps),
                       kv_write_ps=sig4(f.kv_write_ps),
                       group_limit=f.group_limit,
                       group_reread=round(f.group_reread, 4) if f.group_limit else 0.0,
                       group_row_share=round(f.group_row_share, 4) if f.group_limit else 1.0,
                       row_overlap=round(f.row_overlap, 4) if f.group_limit else 0.0,
                       group_memory=round(f.group_memory, 4) if f.group_limit else 1.0,
                       group_q_rows=round(f.group_q_rows, 4) if f.group_limit else 0.0,
                       group_floor_us=(round(f.group_floor_us, 3) if f.group_limit
                                       and f.group_floor_us is not None else None),
                       group_step=round(f.group_step, 4) if f.group_limit else 0.0,
                       group_row_step=round(f.group_row_step, 4) if f.group_limit else 0.0,
                       group_row_head_dim_exp=(round(f.group_row_head_dim_exp, 3)
                                               if f.group_limit else 0.0),
                       rope_kernel_us=(round(f.rope_kernel_us, 3)
                                       if f.group_limit and f.rope_kernel_us > 1e-3 else 0.0),
                       l2_speedup=round(f.l2_speedup, 3), remote_slots=f.remote_slots,
                       slot_kernels=f.slot_kernels,
                       head_tile=f.head_tile, resident_blocks=sig4(f.resident_blocks),
                       exposed=round(f.exposed, 4), per_group_ns=sig4(f.per_group_ns),
                       expanded_block_ns=sig4(f.expanded_block_ns),
                       sustained_us=sig4(f.sustained_us) if f.sustained_rate < 1 else 0.0,
                       sustained_rate=round(f.sustained_rate, 4) if f.sustained_us else 1.0,
                       key_tiles=f.key_tiles, block_gbs=sig4(f.block_gbs),
                       q_copy_us=(round(f.q_copy_us, 3)
                                  if f.group_limit and f.q_copy_us > 1e-3 else 0.0),
                       head_block=f.head_block,
                       head_block_rows=sig4(f.head_block_rows) if f.head_block else 0.0,
                       head_block_reread=round(f.head_block_reread, 4) if f.head_block else 0.0,
                       expert_block_gbs=sig4(f.expert_block_gbs),
                       expert_block_m=f.expert_block_m, expert_block_n=f.expert_block_n,
                       expert_blocks_per_sm=f.expert_blocks_per_sm)


def fit(samples: Samples, device: DeviceProfile, tile_m: int = 0, tile_n: int = 0,
        split_k: bool = False, tile_k0: int = 0, pack_gqa: bool = False,
        dispatch: str = "", group_limit: int = 0, overlap: bool = True,
        moe_kernel: str = "", causal: bool = False, softmax: bool = False,
        floors: bool = False, l2: bool = False, remote: bool = False,
        head_tile: int = 0, exposed: bool = False, per_group: bool = False,
        key_tiles: str = "", decode_hd: bool = False, sustained: bool = False,
        width: bool = False, rope: bool = False, block: bool = False,
        qcopy: bool = False, slots: bool = False, head_block: int = 0,
        load_rows: float = 0.0, depth: bool = False, kv_write: bool = False,
        expanded: bool = False, expert_block: tuple[int, int, float] = (0, 0, 0.0),
        start_from: OperatorFit | None = None) -> OperatorFit:
    """Least squares on log(predicted / measured) over the shapes not held out, with the
    given tile sizes (0: no tile/wave quantisation) and, for prefill attention, with or
    without GQA packing, with or without the causal tail and the K/V re-read share
    (``causal``: ``OperatorFit.causal_tail``, ``kv_reread_share``, fitted) and the softmax
    floor (``softmax``, ``OperatorFit.softmax_dim``, fitted); decode attention with a group
    limit with or without ``overlap`` (``row_overlap``, ``group_memory``, ``group_q_rows``;
    without: 0, 1, 0), and with ``floors`` also ``group_floor_us`` and ``group_step``
    (each kernel's own terms); a MoE family with a grouped kernel (``moe_kernel``,
    :data:`MOE_KERNEL_CHOICES`); with ``l2``, the speed of a working set held in a warm L2
    (``OperatorFit.l2_speedup``, on the shapes :func:`warm_share` marks); a MoE family with
    ``remote``, the per-row work of the token slots routed to other ranks
    (``OperatorFit.remote_slots``); MLA decode attention with ``head_tile``, its heads as
    padded query-row tiles of a kernel that does not split the context (``tile_m``
    :data:`WHOLE_CONTEXT`, ``OperatorFit.head_tile``); a GEMM-like or prefill-attention
    family with ``exposed``, the share of the shorter of compute and memory its kernel
    leaves exposed
    (``OperatorFit.exposed``); a MoE family with ``per_group``, its time per expert hit
    (``OperatorFit.per_group_ns``); prefill attention with ``key_tiles``, the whole key
    blocks of a kernel's tile table (``OperatorFit.key_tiles``); decode attention with
    ``decode_hd``, the exponent its work takes in the head dimension
    (``OperatorFit.head_dim_exp``); a GEMM family with ``sustained``, a rate that falls
    with the kernel's compute time (``OperatorFit.sustained_us`` from 100 us to 1 s,
    ``sustained_rate`` from 0.2 to 1); decode attention with a group limit with ``width``,
    the grouped kernel's per-row work by head dimension
    (``OperatorFit.group_row_head_dim_exp``), and with ``rope`` the separate RoPE kernel of
    the measured shapes below the collector's rotary dimension
    (``OperatorFit.rope_kernel_us``); a whole-context decode fit with ``block``, the rate
    one block streams its sequence at, the device's SMs resident
    (``OperatorFit.block_gbs``); decode attention with a group limit with ``qcopy``, the
    query copy of FlashAttention-2's varlen decode path (``OperatorFit.q_copy_us``); a MoE
    family with ``slots``, the elements the routing kernels outside the grouped GEMMs move
    per routed slot as per-row work (``OperatorFit.slot_kernels``); MLA decode attention
    with ``head_block``, the per-row work of each (sequence, block of ``head_block`` query
    heads) of a split-KV kernel and the share of each further block's latent read that
    reaches memory (``OperatorFit.head_block_rows``, ``head_block_reread``); a candidate
    tile set (``dispatch`` in :data:`simulator.cost.roofline.TILE_CANDIDATES`) with
    ``load_rows``, its tiles' operand-load rows (``OperatorFit.tile_load_rows``); a GEMM
    family with ``depth``, a time per unit of each GEMM's depth k (``OperatorFit.per_k_ps``,
    fitted); prefill attention (not MLA) with ``kv_write``, a time per K/V element the
    timed forward stores into the cache (``OperatorFit.kv_write_ps``, fitted); a MoE family
    with ``expanded``, a time per thread-block iteration of the expanded-space activation
    kernel (``OperatorFit.expanded_block_ns``, fitted; the samples need their ``batch`` and
    the device its ``sm_count``); a MoE family with ``expert_block`` (block rows, block
    columns, resident blocks per SM), the rate one Triton block streams its weights at
    (``OperatorFit.expert_block_gbs``, fitted), also started from ``start_from``'s constants
    (a MoE fit with at most ``per_group``, ``exposed`` and ``l2`` of the terms fitted here)."""
    if not (samples.op.startswith("moe") and samples.tiles is not None and device.sm_count):
        expert_block = (0, 0, 0.0)
    head_block = head_block if samples.decode and samples.heads is not None else 0
    qcopy = qcopy and bool(group_limit) and samples.decode and samples.tiles is not None
    peak, bw = device.peak_flops(samples.precision), device.memory_bandwidth
    idx = np.flatnonzero(~samples.held_out)
    if len(idx) > MAX_FIT_ROWS:  # deterministic thinning of very large tables
        idx = idx[np.linspace(0, len(idx) - 1, MAX_FIT_ROWS).astype(int)]
    # Prefill attention's head-dimension exponent is x[7]; decode attention's (decode_hd)
    # is near the end, after its group terms.
    has_hd = samples.head_dim is not None and samples.prefill
    has_reread = samples.kv_bytes is not None
    decode_hd = decode_hd and samples.decode and samples.head_dim is not None
    per_unit = samples.op.startswith("gemm")  # OperatorFit.per_unit_ns
    depth = depth and per_unit and samples.tiles is not None  # OperatorFit.per_k_ps
    kv_write = kv_write and samples.prefill and samples.kv_written is not None
    expanded = (expanded and samples.op.startswith("moe") and samples.batch is not None
                and bool(device.sm_count))  # OperatorFit.expanded_block_ns
    width = width and bool(group_limit) and samples.decode and samples.head_dim is not None
    rope = rope and width
    block_sms = float(device.sm_count or 0) if (
        block and samples.decode and tile_m == WHOLE_CONTEXT and not head_tile) else 0.0
    start = _to_fit(np.zeros(12), 0, tile_m, tile_n, split_k, True, tile_k0, pack_gqa,
                    dispatch, group_limit, moe_kernel, causal, softmax, has_hd, has_reread,
                    remote=remote, head_tile=head_tile, key_tiles=key_tiles, slots=slots,
                    load_rows=load_rows)
    f = flops(samples, start, idx)
    warm = warm_share(samples, device, idx) if l2 else 0.0
    u, q = _work(samples, start.model_copy(update={"causal_tail": 0.0}), device, idx)
    share = causal_shares(samples, start, device, idx)
    log_t = np.log(samples.seconds[idx])
    dep = gemm_depth(samples, idx)
    wrote = kv_written(samples, idx)
    fill = samples.decode  # see the note above _to_fit
    hd = samples.head_dim[idx] if samples.head_dim is not None else None

    def residual(x: np.ndarray) -> np.ndarray:
        model = _to_fit(x, 0, tile_m, tile_n, split_k, fill, tile_k0, pack_gqa, dispatch,
                        group_limit, moe_kernel, causal, softmax, has_hd, has_reread, per_unit,
                        l2, remote, head_tile, exposed, per_group, key_tiles, decode_hd,
                        sustained, width, rope, block_sms, qcopy, slots, head_block, load_rows,
                        depth, kv_write, expanded, expert_block)
        s = model.work_scale(hd) if hd is not None else 1.0
        fs = model.flops_scale(hd) if hd is not None else 1.0
        b, r = _bytes_rows(samples, model, idx)
        qx = q if share is None else causal_quantisation(q, share, model.causal_tail)
        if head_tile:  # the resident blocks are fitted: the multiplier follows them
            qx = _work(samples, model, device, idx)[1]
        return np.log(model.seconds(peak, bw, f * fs, b * s, u, r, qx, warm, dep, wrote,
                                    expert_streamed(samples, model, device, idx))
                      + extra_floor(samples, model, idx, device)) - log_t

    best: tuple[np.ndarray, float] | None = None
    group_start = (_GROUP_START + _KERNEL_START * floors) if overlap else _GROUP_START[:2]
    starts: tuple[tuple[float, ...], ...] = (
        (0.7, 1e9, 1e6, 5.0, 1.0, 1.0), (0.5, 1e10, 1e7, 10.0, 30.0, 100.0),
        (0.8, 1e8, 1e5, 2.0, 0.01, 1e-3), (0.6, 1e7, 1e6, 4.0, 300.0, 10.0))
    if group_limit:  # blocks of tens of ns each (the two kernels' per-block work)
        starts += ((0.6, 1e7, 1e7, 5.0, 100.0, 3e4),)
    for i, (c0, fh0, bh0, fl0, uh0, rp0) in enumerate(starts):
        x0 = np.array([math.log(c0 / (1 - c0)), math.log(fh0), math.log(4.0), math.log(bh0),
                       math.log(fl0), math.log(uh0), math.log(rp0),
                       *([0.0] if has_hd else group_start if group_limit
                         else []), *([0.0, 3.0 - 6.0 * (i % 2)] if share is not None else []),
                       *([math.log(device.sm_count or 100)] if head_tile else []),
                       *([math.log(1.5)] if softmax else []),
                       *([math.log(1.0)] if per_unit else []),
                       *([math.log(100.0)] if per_group else []),
                       *([math.log(0.3 / 0.7)] if exposed else []),
                       *([0.0] if decode_hd else []), *([0.0] if l2 else []),
                       *([math.log(1000.0), 1.0] if sustained else []),
                       *([0.5] if width else []), *([math.log(2.0)] if rope else []),
                       *([math.log(16.0)] if block_sms else []),
                       *([math.log(2.0)] if qcopy else []),
                       *([math.log(16.0), -1.0] if head_block else []),
                       *([math.log(300.0)] if depth else []),
                       *([math.log(2.0)] if kv_write else []),
                       *([math.log(1.0)] if expanded else []),
                       *([math.log(10.0)] if expert_block[0] else [])])
        x, cost = levenberg_marquardt(residual, x0, iterations=150)
        if best is None or cost < best[1]:
            best = (x, cost)
    assert best is not None

    def robust(x: np.ndarray) -> np.ndarray:
        # Least absolute log error by iterative reweighting: the median of |error| is what
        # is reported, and a few cliff shapes (tile/wave quantisation) should not pull the
        # curve.
        for _ in range(ROBUST_ROUNDS):
            weight = 1.0 / np.sqrt(np.maximum(np.abs(residual(x)), 0.01))

            def weighted(z: np.ndarray, w: np.ndarray = weight) -> np.ndarray:
                return residual(z) * w

            x, _ = levenberg_marquardt(weighted, x, iterations=60)
        return x

    x = robust(best[0])
    if expert_block[0] and start_from is not None:
        # The block rate on a fit's chosen terms: also from that fit's constants, at a few
        # block rates (the generic starts alone can land the shared terms elsewhere); the
        # start whose robust fit has the least median error on these shapes is kept.
        for gbs in EXPERT_BLOCK_GBS_STARTS:
            x0 = _moe_start(start_from, per_group, exposed, l2, gbs)
            for other in (robust(x0), robust(levenberg_marquardt(residual, x0,
                                                                 iterations=150)[0])):
                if np.median(np.abs(residual(other))) < np.median(np.abs(residual(x))):
                    x = other
    return _rounded(_to_fit(x, int((~samples.held_out).sum()), tile_m, tile_n, split_k, fill,
                            tile_k0, pack_gqa, dispatch, group_limit, moe_kernel, causal,
                            softmax, has_hd, has_reread, per_unit, l2, remote, head_tile,
                            exposed, per_group, key_tiles, decode_hd, sustained, width,
                            rope, block_sms, qcopy, slots, head_block, load_rows, depth,
                            kv_write, expanded, expert_block))


def _moe_start(f: OperatorFit, per_group: bool, exposed: bool, l2: bool,
               gbs: float) -> np.ndarray:
    """The fitted elements of :func:`fit` for a MoE fit with ``f``'s constants, the terms
    ``per_group``, ``exposed`` and ``l2`` as given and the block rate ``gbs`` (the last
    element, ``expert_block``)."""
    def logit(v: float) -> float:
        v = min(max(v, 1e-4), 1.0 - 1e-4)
        return math.log(v / (1.0 - v))
    return np.array([logit(f.compute), math.log(max(f.half_flops, 1.0)), logit(f.memory),
                     math.log(max(f.half_bytes, 1.0)), math.log(max(f.floor_us, 1e-3)),
                     math.log(max(f.half_units, 1e-3)), math.log(max(f.per_row_ps, 1e-6)),
                     *([math.log(max(f.per_group_ns, 1e-3))] if per_group else []),
                     *([logit(f.exposed)] if exposed else []),
                     *([math.log(max(f.l2_speedup - 1.0, 1e-3))] if l2 else []),
                     math.log(gbs)])


def _decode_terms(kept: OperatorFit) -> tuple[bool, bool]:
    """Whether a decode fit took the overlap terms (``row_overlap``, ``group_memory``,
    ``group_q_rows``) and each kernel's own terms (``group_floor_us`` and the steps): the
    ``overlap`` and ``floors`` of :func:`fit` that refit it with the same terms."""
    terms = kept.row_overlap > 0 or kept.group_memory != 1 or kept.group_q_rows > 0
    return terms, kept.group_floor_us is not None


def keeps_long_rate(device: DeviceProfile, kept: tuple[Samples, OperatorFit],
                    longer: tuple[Samples, OperatorFit]) -> bool:
    """Whether a GEMM fit with the lower rate of a long kernel (``longer``,
    :attr:`OperatorFit.sustained_us`) replaces the chosen one (``kept``), each with the
    samples it is scored on: where it lowers the training median, as every term, or the
    score that weighs the training shapes' time too (:func:`training_time_score`). The term
    acts on long kernels only, which the plain median hardly sees: on GB200 vLLM's BF16
    GEMMs the fit without it had the better median by 0.6 points and priced the GEMMs over
    0.5 ms 35 % fast."""
    return (training_ape(longer[0], device, longer[1]) < training_ape(kept[0], device, kept[1])
            or training_time_score(longer[0], device, longer[1])
            < training_time_score(kept[0], device, kept[1]))


def fit_family(family: Samples, device: DeviceProfile, dispatches: tuple[str, ...] = (),
               group_limits: tuple[int, ...] = (), moe_kernels: tuple[str, ...] = (),
               causal: bool = True, remote: bool = True,
               head_tiles: tuple[int, ...] = (), exposed: bool = True, key_tiles: str = "",
               whole_context: bool = False, row_width: bool = False,
               rope_kernel: bool = True, q_copy: bool = False,
               slot_kernels: bool = False,
               head_blocks: tuple[int, ...] = (),
               gemm_depth_offered: bool = False,
               kv_write: bool = False, expanded_offered: bool = False,
               expert_block: tuple[int, int] = (0, 0)) -> tuple[Samples, OperatorFit]:
    """The fit of one operator family, with the samples it was scored on.

    Every tile choice of the family (:data:`TILE_CHOICES`; none without the device's
    ``sm_count``) is fitted, and decode attention is fitted with its per-row work counted
    per query head and per KV head; the fit with the lowest error on the training shapes is
    kept (held-out shapes never choose). ``dispatches`` are the tile dispatch tables it may
    also choose (:data:`DISPATCH_CHOICES`); ``group_limits`` the decode-attention group
    limits (:data:`GROUP_LIMIT_CHOICES`), each fitted with the chosen tiles and then every
    tile choice refitted with the best limit; ``moe_kernels`` the grouped MoE kernels
    (:data:`MOE_KERNEL_CHOICES`), each with its own tiles (:data:`MOE_KERNEL_TILES`), which
    compete like a dispatch table; with ``causal``, prefill attention is also fitted with
    the causal tail and re-read share, and with the softmax floor (:data:`CAUSAL_ENGINES`);
    with ``remote``, a MoE family with and without the other ranks' token slots
    (``OperatorFit.remote_slots``, :data:`REMOTE_SLOT_ENGINES`; a grouped kernel of
    :data:`MOE_KERNEL_CHOICES` without: it gathers its own tokens); ``head_tiles``, the
    query rows per block an MLA decode kernel without split-KV may take
    (:data:`HEAD_TILE_CHOICES`, ``OperatorFit.head_tile``); ``key_tiles``, a prefill kernel's
    tile table (:data:`KEY_TILE_ENGINES`, ``OperatorFit.key_tiles``): every prefill choice
    is also fitted with its whole key blocks, FlashAttention-3's with its GQA packing
    (:data:`PACKED_KEY_TILES`); with ``whole_context`` a decode family is also fitted with
    a whole-context partition whose blocks stream at a rate of their own
    (``OperatorFit.block_gbs``, on the chosen terms); with ``row_width``, a grouped decode
    fit is refitted on its chosen terms with the grouped kernel's per-row work by head
    dimension, without and (with ``rope_kernel``) with the measured shapes' separate RoPE
    kernel (:data:`ROW_WIDTH_ENGINES`, :data:`ROW_WIDTH_TABLES`); with ``q_copy``, a grouped
    decode fit is refitted on its chosen terms with FlashAttention-2's query copy
    (:data:`Q_COPY_ENGINES`); with ``slot_kernels``, a MoE family with and without the
    routing kernels' work per routed slot (``OperatorFit.slot_kernels``,
    :data:`SLOT_KERNEL_ENGINES`), every tile choice; ``head_blocks``, the query heads per
    block an MLA decode kernel with split-KV may take (:data:`HEAD_BLOCK_TABLES`,
    ``OperatorFit.head_block``), each refitted on the chosen tiles with and without the
    warm L2; with ``gemm_depth_offered``, a GEMM family is refitted on its chosen terms,
    with and without the exposed share, with a time per unit of each GEMM's depth
    (:data:`GEMM_DEPTH_TABLES`, ``OperatorFit.per_k_ps``); with ``kv_write``, every prefill
    choice (not MLA) is also fitted with the time of storing the prompt's K/V into the cache
    (:data:`KV_WRITE_TABLES`, ``OperatorFit.kv_write_ps``); with ``expanded_offered``, a MoE
    family is refitted on its chosen terms, with its chosen and with both the exposed share
    and the time per expert, with a time per thread-block iteration of the expanded-space
    activation kernel (:data:`EXPANDED_ACTIVATION_FAMILIES`, ``OperatorFit.expanded_block_ns``);
    with ``expert_block`` (a Triton block's rows and columns, :data:`EXPERT_BLOCK_CHOICES`), a
    MoE family is refitted on its chosen terms with the rate each block streams its weights
    at, for each of :data:`EXPERT_BLOCKS_PER_SM` (``OperatorFit.expert_block_gbs``).
    Attention on a device with an L2 figure, where some training shapes fit in it
    (:func:`warm_share`), is fitted with and without the warm-L2 speed
    (``OperatorFit.l2_speedup``).
    """
    train = np.flatnonzero(~family.held_out)
    warm = bool(np.any(warm_share(family, device, train)))
    # Attention fits every choice with and without the term; the GEMM-like families (whose
    # tile choices are many) only their chosen tiles, below.
    l2s = (False, True) if warm and family.op.startswith("attention") else (False,)
    variants = [(family, "query_head")]
    if family.kv_rows is not None:
        variants.append((replace(family, rows=family.kv_rows, kv_rows=None), "kv_head"))
    tiles = (tile_choices(family.op) if device.sm_count and family.tiles is not None
             else ((0, 0, False),))
    if whole_context and family.decode and family.heads is None and device.sm_count:
        tiles = (*tiles, (WHOLE_CONTEXT, 0, False))  # a kernel that does not split the context
    best: tuple[float, Samples, OperatorFit] | None = None

    def consider(samples: Samples, unit: str, fitted: OperatorFit) -> None:
        nonlocal best
        if unit != "query_head":
            fitted = fitted.model_copy(update={"row_unit": unit})
        score = training_ape(samples, device, fitted)
        if best is None or score < best[0]:
            best = (score, samples, fitted)

    packs = (False, True) if family.prefill else (False,)
    # MoE: with and without the other ranks' token slots (OperatorFit.remote_slots).
    remotes = (False, True) if remote and family.remote is not None else (False,)
    # MoE: with and without the routing kernels' work per slot (OperatorFit.slot_kernels).
    slot_offers = ((False, True) if slot_kernels and family.op.startswith("moe")
                   and family.tiles is not None else (False,))
    # Prefill attention: without and with a kernel's whole key blocks (OperatorFit.key_tiles).
    keys = ("", key_tiles) if key_tiles and family.prefill else ("",)
    # Prefill attention: without and with the K/V store into the cache (OperatorFit.kv_write_ps).
    writes = (False, True) if kv_write and family.kv_written is not None else (False,)
    for (samples, unit), l2, others, key, slots, write in itertools.product(
            variants, l2s, remotes, keys, slot_offers, writes):
        # FlashAttention-3's tiles come with its GQA packing (PACKED_KEY_TILES): the
        # causal fits too, which otherwise count one head per block.
        packed = key in PACKED_KEY_TILES
        for tile_m, tile_n, split_k in tiles:
            for pack in ((True,) if packed else packs) if tile_m else (False,):
                consider(samples, unit, fit(samples, device, tile_m, tile_n, split_k, 0, pack,
                                            l2=l2, remote=others, key_tiles=key, slots=slots,
                                            kv_write=write))
            if causal and family.prefill and tile_m:  # OperatorFit.causal_tail
                consider(samples, unit, fit(samples, device, tile_m, pack_gqa=packed,
                                            causal=True, l2=l2, key_tiles=key, kv_write=write))
                if family.head_dim is not None:  # the floor scales with the head dimension
                    consider(samples, unit, fit(samples, device, tile_m, pack_gqa=packed,
                                                causal=True, softmax=True, l2=l2,
                                                key_tiles=key, kv_write=write))
        if family.heads is not None and device.sm_count:  # OperatorFit.head_tile
            for rows in head_tiles:
                consider(samples, unit, fit(samples, device, WHOLE_CONTEXT, l2=l2,
                                            head_tile=rows))
    assert best is not None
    if family.decode and family.group is not None and group_limits and len(variants) > 1:
        # Rows per KV head: the grouped kernel's blocks (decode_group scales the others').
        per_kv, plain = variants[1][0], best[2]
        # With and without the overlap terms (OperatorFit.row_overlap): the training
        # shapes choose.
        # and with each kernel's own terms (OperatorFit.group_floor_us, group_step).
        for limit, (overlap, floors), l2 in itertools.product(
                group_limits, ((False, False), (True, False), (True, True)), l2s):
            consider(per_kv, "kv_head", fit(per_kv, device, plain.tile_m,
                                            group_limit=limit, overlap=overlap,
                                            floors=floors, l2=l2))
        if best[2].group_limit:
            limit, kept = best[2].group_limit, best[2]
            terms, floors = _decode_terms(kept)
            for tile_m, tile_n, split_k in tiles:
                if tile_m != kept.tile_m:
                    consider(per_kv, "kv_head", fit(per_kv, device, tile_m, tile_n, split_k,
                                                    group_limit=limit, overlap=terms or floors,
                                                    floors=floors,
                                                    l2=kept.l2_speedup != 1.0))
    if warm and len(l2s) == 1:
        kept = best[2]
        consider(best[1], kept.row_unit, fit(
            best[1], device, kept.tile_m, kept.tile_n, kept.split_k, 0, kept.pack_gqa, l2=True,
            remote=kept.remote_slots, head_tile=kept.head_tile, slots=kept.slot_kernels))
    # GEMM-like families: the per-tile fixed work, given the chosen tiles; a tile dispatch
    # table competes with the chosen tile size after both have their fixed work.
    candidates = [best[2]]
    if device.sm_count and family.tiles is not None:
        for dispatch in dispatches:
            table = [fit(family, device, 128, 128, split_k, 0, dispatch=dispatch, l2=l2,
                         load_rows=rows)
                     for split_k in (False, True)  # tile_m/n only switch tiling on
                     for l2 in (False, True)[:1 + warm]
                     for rows in (LOAD_ROW_CHOICES if dispatch in TILE_CANDIDATES else (0.0,))]
            candidates.append(min(table, key=lambda f: training_ape(family, device, f)))
        for kernel in moe_kernels:
            table = [fit(family, device, tile_m, tile_n, moe_kernel=kernel, l2=l2)
                     for tile_m, tile_n in MOE_KERNEL_TILES[kernel]
                     for l2 in (False, True)[:1 + warm]]
            candidates.append(min(table, key=lambda f: training_ape(family, device, f)))
    for chosen in candidates:
        if chosen is not best[2]:
            consider(family, chosen.row_unit, chosen)
        if chosen.tile_n:
            for k0 in K0_CHOICES[1:]:
                samples = family if chosen.tile_dispatch or chosen.moe_kernel else best[1]
                consider(samples, chosen.row_unit, fit(
                    samples, device, chosen.tile_m, chosen.tile_n, chosen.split_k, k0,
                    chosen.pack_gqa, chosen.tile_dispatch, moe_kernel=chosen.moe_kernel,
                    l2=chosen.l2_speedup != 1.0, remote=chosen.remote_slots,
                    slots=chosen.slot_kernels, load_rows=chosen.tile_load_rows))
    if exposed and family.op.startswith(EXPOSED_FAMILIES) and family.tiles is not None:
        kept = best[2]  # the chosen tiles and fixed work, with the new terms fitted
        # (exposed, per_group): GEMMs and prefill attention (with its causal terms and key
        # blocks) the exposed share; MoE also a time per expert, and both.
        offers = (((True, False), (False, True), (True, True)) if family.op.startswith("moe")
                  else ((True, False),))
        for share, groups in offers:
            consider(best[1], kept.row_unit, fit(
                best[1], device, kept.tile_m, kept.tile_n, kept.split_k, kept.tile_k0,
                kept.pack_gqa, kept.tile_dispatch, moe_kernel=kept.moe_kernel,
                causal=bool(kept.causal_tail), softmax=bool(kept.softmax_dim),
                l2=kept.l2_speedup != 1.0, remote=kept.remote_slots,
                slots=kept.slot_kernels, exposed=share,
                per_group=groups, key_tiles=kept.key_tiles, load_rows=kept.tile_load_rows,
                kv_write=bool(kept.kv_write_ps)))
    if (expanded_offered and family.op.startswith("moe") and family.tiles is not None
            and family.batch is not None and device.sm_count):
        # The chosen terms with the expanded-space activation kernel's blocks
        # (OperatorFit.expanded_block_ns), with the chosen and with both per-kernel terms.
        kept = best[2]
        for share, groups in sorted({(bool(kept.exposed), bool(kept.per_group_ns)),
                                     (True, True)}):
            consider(best[1], kept.row_unit, fit(
                best[1], device, kept.tile_m, kept.tile_n, kept.split_k, kept.tile_k0,
                moe_kernel=kept.moe_kernel, l2=kept.l2_speedup != 1.0,
                remote=kept.remote_slots, slots=kept.slot_kernels, exposed=share,
                per_group=groups, expanded=True))
    if expert_block[0] and family.op.startswith("moe") and family.tiles is not None:
        # The Triton blocks' own streaming rate (OperatorFit.expert_block_gbs), on the
        # chosen terms, for each resident count.
        kept = best[2]
        for per_sm in EXPERT_BLOCKS_PER_SM:
            consider(best[1], kept.row_unit, fit(
                best[1], device, kept.tile_m, kept.tile_n, kept.split_k, kept.tile_k0,
                moe_kernel=kept.moe_kernel, l2=kept.l2_speedup != 1.0,
                remote=kept.remote_slots, slots=kept.slot_kernels, exposed=bool(kept.exposed),
                per_group=bool(kept.per_group_ns), expert_block=(*expert_block, per_sm),
                start_from=kept))
    if family.op.startswith("gemm") and family.tiles is not None:
        # The chosen terms with the lower rate of a long kernel (OperatorFit.sustained_us),
        # kept where it lowers the training median, as every term, or the score that
        # weighs the training shapes' time too: the term acts on long kernels only, which
        # the plain median hardly sees.
        kept = best[2]
        samples = family if kept.tile_dispatch else best[1]
        longer = fit(samples, device, kept.tile_m, kept.tile_n, kept.split_k, kept.tile_k0,
                     kept.pack_gqa, kept.tile_dispatch, l2=kept.l2_speedup != 1.0,
                     exposed=bool(kept.exposed), sustained=True, load_rows=kept.tile_load_rows)
        if kept.row_unit != "query_head":
            longer = longer.model_copy(update={"row_unit": kept.row_unit})
        if keeps_long_rate(device, (best[1], kept), (samples, longer)):
            best = (training_ape(samples, device, longer), samples, longer)
        if gemm_depth_offered:
            # The chosen terms with a time per unit of each GEMM's depth (OperatorFit.per_k_ps),
            # with and without the exposed share (which the depth term can make worth it).
            kept = best[2]
            samples = family if kept.tile_dispatch else best[1]
            for share in sorted({bool(kept.exposed), True}):
                consider(samples, kept.row_unit, fit(
                    samples, device, kept.tile_m, kept.tile_n, kept.split_k, kept.tile_k0,
                    kept.pack_gqa, kept.tile_dispatch, l2=kept.l2_speedup != 1.0,
                    exposed=share, sustained=bool(kept.sustained_us),
                    load_rows=kept.tile_load_rows, depth=True))
    if family.decode and family.head_dim is not None and len(np.unique(family.head_dim)) > 1:
        # The chosen kernel terms with the work's exponent in the head dimension fitted.
        kept = best[2]
        terms, floors = _decode_terms(kept)
        consider(best[1], kept.row_unit, fit(
            best[1], device, kept.tile_m, kept.tile_n, kept.split_k,
            group_limit=kept.group_limit, overlap=terms or floors, floors=floors,
            l2=kept.l2_speedup != 1.0, head_tile=kept.head_tile, decode_hd=True))
        if row_width and best[2].group_limit:
            # The grouped kernel's per-row work by head dimension, and the measured shapes'
            # separate RoPE kernel (OperatorFit.group_row_head_dim_exp, rope_kernel_us), on
            # the chosen terms (with the KV exponent where it was kept).
            kept = best[2]
            terms, floors = _decode_terms(kept)
            for rope in (False, True)[:1 + rope_kernel]:
                consider(best[1], kept.row_unit, fit(
                    best[1], device, kept.tile_m, kept.tile_n, kept.split_k,
                    group_limit=kept.group_limit, overlap=terms or floors, floors=floors,
                    l2=kept.l2_speedup != 1.0, decode_hd=bool(kept.head_dim_exp),
                    width=True, rope=rope))
    if (whole_context and family.decode and family.heads is None and not best[2].head_tile
            and device.sm_count):
        # A kernel that does not split the context: each block streams at its own rate
        # (OperatorFit.block_gbs), on the chosen terms with a whole-context partition.
        kept = best[2]
        terms, floors = _decode_terms(kept)
        consider(best[1], kept.row_unit, fit(
            best[1], device, WHOLE_CONTEXT, group_limit=kept.group_limit,
            overlap=terms or floors, floors=floors, l2=kept.l2_speedup != 1.0,
            decode_hd=bool(kept.head_dim_exp), width=bool(kept.group_row_head_dim_exp),
            rope=bool(kept.rope_kernel_us), block=True))
    if q_copy and family.decode and best[2].group_limit:
        # FlashAttention-2's query copy (OperatorFit.q_copy_us), on the chosen terms.
        kept = best[2]
        terms, floors = _decode_terms(kept)
        consider(best[1], kept.row_unit, fit(
            best[1], device, kept.tile_m, kept.tile_n, kept.split_k,
            group_limit=kept.group_limit, overlap=terms or floors, floors=floors,
            l2=kept.l2_speedup != 1.0, decode_hd=bool(kept.head_dim_exp),
            width=bool(kept.group_row_head_dim_exp), rope=bool(kept.rope_kernel_us),
            qcopy=True))
    if head_blocks and family.decode and family.heads is not None and not best[2].head_tile:
        # A split-KV kernel's (sequence, head block) pairs (OperatorFit.head_block), on the
        # chosen tiles, with and without the warm L2 (the blocks' rows move the memory share).
        kept = best[2]
        for rows, l2 in itertools.product(head_blocks, l2s):
            consider(best[1], kept.row_unit, fit(best[1], device, kept.tile_m, kept.tile_n,
                                                 kept.split_k, l2=l2, head_block=rows))
    return best[1], best[2]


def layout_loads(fitted: dict[str, tuple[Samples, OperatorFit]], device: DeviceProfile,
                 min_rows: int = 5) -> dict[str, str]:
    """Per model layout (:attr:`Samples.layout`), the load of the timed rank whose samples and
    fit (``fitted``: routing -> (samples, fit), the same rows under each load) price the
    layout's training shapes with the lowest median APE, among the collector's loads
    (:data:`COLLECTOR_LOADS`). Held-out shapes never choose; a layout with fewer than
    ``min_rows`` training shapes is left out (it takes the family's load)."""
    first = next(iter(fitted.values()))[0]
    candidates = {r: v for r, v in fitted.items() if r in COLLECTOR_LOADS}
    if first.layout is None or len(candidates) < 2:
        return {}
    train = ~first.held_out
    errors = {r: np.abs(predict(s, device, f, np.arange(len(s.seconds))) / s.seconds - 1)
              for r, (s, f) in candidates.items()}
    choice = {}
    for layout in np.unique(first.layout):
        rows = train & (first.layout == layout)
        if rows.sum() >= min_rows:
            choice[str(layout)] = min(errors, key=lambda r: float(np.median(errors[r][rows])))
    return choice


def _refit(samples: Samples, device: DeviceProfile, dispatches: tuple[str, ...],
           moe_kernels: tuple[str, ...], remote: bool, expanded: bool = False,
           expert_block: tuple[int, int] = (0, 0)) -> OperatorFit:
    """A MoE family's fit on ``samples``, as :func:`fit_device` fits each load."""
    return fit_family(samples, device, dispatches, (), moe_kernels, remote=remote,
                      expanded_offered=expanded, expert_block=expert_block)[1]


def per_layout_fit(fitted: dict[str, tuple[Samples, OperatorFit]], best: tuple[Samples, OperatorFit],
                   device: DeviceProfile, refit: Any
                   ) -> tuple[Samples, OperatorFit, dict[str, str]]:
    """A MoE family fitted with each model layout priced with its own load of the timed rank
    (:data:`PER_LAYOUT_ROUTING_ENGINES`): each layout takes the load whose own fit prices its
    training shapes best (:func:`layout_loads`), the family is refitted on those mixed samples
    (:func:`~simulator.validation.kernel_fit_samples.mixed_routing`, ``refit``: samples ->
    fit), and the layouts choose again with that fit, :data:`PER_LAYOUT_ROUNDS` times. Kept
    only where it scores better on the training shapes than ``best``, the family's single
    load; returned with each layout's load (empty where ``best`` is kept). Only the samples
    change: the step model prices the engine's own load as before."""
    loads = {r: s for r, (s, _) in fitted.items()}
    default = best[0].routing
    choice = layout_loads(fitted, device)
    kept: tuple[Samples, OperatorFit, dict[str, str]] = (*best, {})
    score = training_ape(best[0], device, best[1])
    for _ in range(PER_LAYOUT_ROUNDS):
        if set(choice.values()) <= {default}:
            break
        mixed = mixed_routing(loads, choice, default)
        fit_mixed = refit(mixed)
        if (new := training_ape(mixed, device, fit_mixed)) < score:
            kept, score = (mixed, fit_mixed, choice), new
        choice = layout_loads({r: (s, fit_mixed) for r, s in loads.items()}, device)
    return kept


def _moe_version(folder: Path, version: str | None, kernels: dict[str, str] | None = None,
                 tuned: frozenset[tuple[int, int]] | None = None, fp8_dtype: str = "fp8"
                 ) -> tuple[Path | None, list[Samples]]:
    """The MoE samples of ``version``, else of the newest version holding gated-expert rows
    (TensorRT-LLM 1.3.0rc23's H100/H200 tables time only non-gated Nemotron layouts, so its
    gated layouts come from rc20)."""
    if not folder.is_dir():
        return None, []
    if version is not None and (folder / version / "moe_perf.parquet").is_file():
        return folder / version, moe_samples(folder / version, kernels=kernels, tuned=tuned,
                                             fp8_dtype=fp8_dtype)
    versions = sorted((p for p in folder.iterdir() if (p / "moe_perf.parquet").is_file()),
                      key=lambda p: _version_key(p.name), reverse=True)
    for path in versions:
        if found := moe_samples(path, kernels=kernels, tuned=tuned, fp8_dtype=fp8_dtype):
            return path, found
    return None, []


def _warm_l2_offer(engine: str, samples: Samples) -> Samples:
    """A MoE family's samples as they are fitted: without a footprint (never warm) outside
    :data:`WARM_L2_MOE_FAMILIES`."""
    if (engine, samples.op) in WARM_L2_MOE_FAMILIES:
        return samples
    return replace(samples, footprint=None)


def selected(op: str, ops: Sequence[str] | None) -> bool:
    """Whether the family ``op`` is among ``ops`` (shell patterns such as ``moe*``; None: all).
    The all-reduce curves are the family ``allreduce``. Attention over a BF16 and an FP8 KV
    cache is scored together (the ``_all_kv`` rows), so a pattern that picks one picks both."""
    if ops is None:
        return True
    names = {op}
    if op.startswith("attention"):
        base = op.removesuffix("_all_kv").removesuffix("_kv_fp8")
        names = {base, base + "_kv_fp8"}
    return any(fnmatch.fnmatchcase(name, pattern) for name in names for pattern in ops)


def fit_device(root: Path, device: DeviceProfile, engine: str, version: str | None,
               ops: Sequence[str] | None = None
               ) -> tuple[dict[str, OperatorFit], list[CollectiveCurve], list[dict[str, Any]], str]:
    """Fit every operator family of ``device`` on ``engine``'s tables (``ops``: only the
    families :func:`selected` picks; the all-reduce curves only where it picks
    ``allreduce``)."""
    assert device.kernel_tables is not None
    base = root / device.kernel_tables
    samples: list[Samples] = []
    prefill_only: dict[str, Samples] = {}
    used = []
    for op, needs, reader in (("gemm", "gemm_perf.parquet", gemm_samples),
                              ("attention", "context_attention_perf.parquet", attention_samples)):
        folder = _pick_version(base / op / engine, version, needs)
        if folder is None:
            continue
        used.append(f"{op}/{engine}/{folder.name}")
        samples += reader(folder)
        if op == "attention":  # the prefill families without their decode-path rows
            full = {s.op: len(s.seconds) for s in samples}
            prefill_only = {s.op: s for s in attention_samples(folder, decode_path=False)
                            if s.prefill and len(s.seconds) < full.get(s.op, 0)}
    folder = _pick_version(base / "mla" / engine, version, "generation_mla_perf.parquet")
    if folder is not None:
        used.append(f"mla/{engine}/{folder.name}")
        samples += mla_samples(folder)
    kernels = MOE_KERNEL_FAMILIES.get(engine)
    configs = TUNED_MOE_CONFIGS.get(engine)
    tuned = None if configs is None else configs.get(device.kernel_tables or "", frozenset())
    fp8 = MOE_FP8_DTYPES.get(engine, "fp8")
    folder, moe = _moe_version(base / "moe" / engine, version, kernels, tuned, fp8)
    loads: dict[str, list[Samples]] = {}
    if folder is not None:
        used.append(f"moe/{engine}/{folder.name}")
        samples += [_warm_l2_offer(engine, s) for s in moe]
        for routing in MOE_ROUTINGS[1:] + CLAMPED_MOE_ROUTINGS.get(engine, ()):
            for s in moe_samples(folder, routing, kernels, tuned, fp8):
                loads.setdefault(s.op, []).append(_warm_l2_offer(engine, s))
    fits: dict[str, OperatorFit] = {}
    rows: list[dict[str, Any]] = []
    curves: list[CollectiveCurve] = []
    comm = _pick_version(base / "comm" / engine, version, "custom_allreduce_perf.parquet")
    if comm is not None:
        used.append(f"comm/{engine}/{comm.name}")
        if selected("allreduce", ops):
            curves, rows = allreduce_curves(comm, device, engine)
    scored: dict[str, Samples] = {}
    for family in samples:
        if (~family.held_out).sum() < 20 or family.held_out.sum() < 5:
            continue
        if not selected(family.op, ops):
            continue
        dispatches = tuple(d for d in DISPATCH_CHOICES.get((engine, family.op), ())
                           if device.kernel_tables in DISPATCH_TABLES[d])
        limits = GROUP_LIMIT_CHOICES.get(engine, ()) if family.decode else ()
        moe_kernels = (MOE_KERNEL_CHOICES.get((engine, family.op), ())
                       if device.kernel_tables in HOPPER_TABLES else ())
        remote = engine in REMOTE_SLOT_ENGINES
        expanded = family.op in EXPANDED_ACTIVATION_FAMILIES.get(engine, ())
        blocks = EXPERT_BLOCK_CHOICES.get((engine, family.op), (0, 0))
        head_tiles = (HEAD_TILE_CHOICES if device.kernel_tables in FMHA_MLA_DECODE_TABLES.get(
            engine, ()) else ())
        s, fitted = fit_family(family, device, dispatches, limits, moe_kernels,
                               engine in CAUSAL_ENGINES, remote, head_tiles,
                               key_tiles=key_tile_choice(engine, device, family.op),
                               whole_context=device.kernel_tables in NO_SPLIT_DECODE_TABLES.get(
                                   engine, ()),
                               row_width=(engine in ROW_WIDTH_ENGINES or device.kernel_tables
                                          in ROW_WIDTH_TABLES.get(engine, ())),
                               rope_kernel=engine in ROW_WIDTH_ENGINES,
                               q_copy=engine in Q_COPY_ENGINES,
                               slot_kernels=engine in SLOT_KERNEL_ENGINES,
                               head_blocks=HEAD_BLOCK_TABLES.get(engine, {}).get(
                                   device.kernel_tables or "", ()),
                               gemm_depth_offered=device.kernel_tables in GEMM_DEPTH_TABLES.get(
                                   engine, ()),
                               kv_write=device.kernel_tables in KV_WRITE_TABLES.get(engine, ()),
                               expanded_offered=expanded, expert_block=blocks)
        if family.op in prefill_only:
            # Without the rows the engine runs on its decode kernel (kernel_fit_samples.
            # DECODE_PATH_KERNELS): kept where it prices the prefill kernel's own training
            # rows better.
            other = prefill_only[family.op]
            s0, f0 = fit_family(other, device, dispatches, limits, moe_kernels,
                                engine in CAUSAL_ENGINES, remote, head_tiles,
                                key_tiles=key_tile_choice(engine, device, family.op),
                                kv_write=device.kernel_tables in KV_WRITE_TABLES.get(engine, ()))
            if training_ape(other, device, f0) < training_ape(other, device, fitted):
                s, fitted = s0, f0
        each = {family.routing: (s, fitted)}
        for other in loads.get(family.op, ()):  # the timed rank's load: see MOE_ROUTINGS
            s0, f0 = fit_family(other, device, dispatches, limits, moe_kernels, remote=remote,
                                slot_kernels=engine in SLOT_KERNEL_ENGINES,
                                expanded_offered=expanded, expert_block=blocks)
            each[other.routing] = (s0, f0)
            if training_ape(s0, device, f0) < training_ape(s, device, fitted):
                s, fitted = s0, f0
        chosen: dict[str, str] = {}
        if engine in PER_LAYOUT_ROUTING_ENGINES and len(each) > 1:
            s, fitted, chosen = per_layout_fit(each, (s, fitted), device, functools.partial(
                _refit, device=device, dispatches=dispatches, moe_kernels=moe_kernels,
                remote=remote, expanded=expanded, expert_block=blocks))
        scored[s.op] = s
        row = {"device": device.name, "engine": engine, **evaluate(s, device, fitted)}
        if s.op in loads:
            row["moe_load"] = s.routing
            if chosen:
                row["moe_layout_loads"] = chosen
        # Keep a fit only where it beats the device-wide constants on the shapes it was
        # fitted on (the held-out shapes are never used to choose).
        row["kept"] = training_ape(s, device, fitted) < training_ape(s, device, None)
        if row["kept"]:
            fits[s.op] = fitted
        rows.append(row)
    rows += [r for base in ("attention_prefill", "attention_decode", "attention_prefill_mla",
                            "attention_decode_mla")
             if selected(base, ops) and (r := both_kv_row(scored, fits, base, device, engine))]
    source = (f"aiconfigurator-core {package_version(root)} systems/data/{device.kernel_tables}/"
              f"{{{', '.join(used)}}} (fitted by simulator/validation/kernel_fit.py, "
              f"{int(HOLDOUT_SHARE * 100)} % of shapes held out)")
    return fits, curves, rows, source


def _with_committed(device: DeviceProfile, engine: str, fits: dict[str, OperatorFit],
                    curves: list[CollectiveCurve], ops: Sequence[str]
                    ) -> tuple[dict[str, OperatorFit], list[CollectiveCurve]]:
    """``fits`` and ``curves`` of the families ``ops`` picks, with the committed constants of
    every other family of ``engine`` on ``device`` (a picked family that is no longer kept
    loses its committed fit)."""
    committed = (load_device(device.name).operators or {}).get(engine)
    if committed is None:
        return fits, curves
    merged = {str(op): f for op, f in committed.fits.items() if not selected(str(op), ops)}
    merged.update(fits)
    return merged, curves if selected("allreduce", ops) else list(committed.allreduce)


def _merge_rows(old: list[dict[str, Any]], new: list[dict[str, Any]], devices: list[str],
                ops: Sequence[str]) -> list[dict[str, Any]]:
    """The error rows of one engine after fitting the families ``ops`` picks on ``devices``:
    those families' old rows on those devices replaced by ``new``, in the old order (new
    families at the end)."""
    fresh = {(r["device"], r["op"]): r for r in new}
    out = []
    for r in old:
        key = (r["device"], r["op"])
        if key in fresh:
            out.append(fresh.pop(key))
        elif not (r["device"] in devices and selected(_family_of(r["op"]), ops)):
            out.append(r)
    return out + list(fresh.values())


def _family_of(op: str) -> str:
    """The family a row of the error table scores (``allreduce_8`` -> ``allreduce``)."""
    return "allreduce" if op.startswith("allreduce_") else op


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, help="systems/data folder (default: installed package)")
    parser.add_argument("--engine", default="vllm", help="Engine whose tables to fit (vllm).")
    parser.add_argument("--version", help="Engine version of the tables (default: newest).")
    parser.add_argument("--device", action="append", help="Device profile(s) (default: all).")
    parser.add_argument("--write", action="store_true", help="Write the fits into the profiles.")
    parser.add_argument("--json", type=Path, help=(
        "Write the error table into this JSON file, under the engine's name (other engines "
        "already in the file are kept; docs/kernel_fit_errors.json holds all three)."))
    parser.add_argument("--ops", action="append", help=(
        "Fit only these operator families (shell patterns, e.g. 'moe*', 'allreduce'; "
        "repeatable). --write keeps every other family's committed constants and --json "
        "every other family's rows."))
    parser.add_argument("--markdown", action="store_true", help="Print the error table.")
    parser.add_argument("--interpolation", action="store_true", help=(
        "Also print the tables predictor's interpolation error on dropped grid points."))
    args = parser.parse_args(argv)
    root = args.data or tables_root()
    if root is None:
        sys.exit("kernel_fit needs the tables: pip install 'disagg-sim[kernels]' or --data DIR")
    table: list[dict[str, Any]] = []
    fitted: list[str] = []
    for device in devices_with_tables(root, args.device):
        fits, curves, rows, source = fit_device(root, device, args.engine, args.version, args.ops)
        table += rows
        fitted.append(device.name)
        if args.ops is not None:
            fits, curves = _with_committed(device, args.engine, fits, curves, args.ops)
        if args.write and (fits or curves):
            path = write_profile(device, fits, curves, args.engine, source)
            print(f"wrote {path}", file=sys.stderr)
    if args.interpolation:
        for device in devices_with_tables(root, args.device):
            for row in interpolation_errors(root, device, args.engine, args.version):
                print(row)
    if args.json:  # one list per engine; a file holding other engines keeps them
        old = json.loads(args.json.read_text()) if args.json.is_file() else {}
        merged = old if isinstance(old, dict) else {}
        if args.ops is not None:  # the other families' rows, and other devices', stay
            table = _merge_rows(merged.get(args.engine, []), table, fitted, args.ops)
        merged[args.engine] = table
        args.json.write_text(json.dumps(merged, indent=1) + "\n")
    if args.markdown or not args.json:
        cols = ("device", "engine", "op", "fit_rows", "held_out_rows", "median_ape_before",
                "median_ape_after", "p90_ape_after", "median_error_after", "tiles", "kept")
        print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in table:
            print("| " + " | ".join(str(r.get(c, "-")) for c in cols) + " |")


if __name__ == "__main__":
    main()
