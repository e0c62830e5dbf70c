"""The operators of one engine step: how each is priced (cost/step.py assembles them).

Every per-layer operator (GEMM groups, prefill and decode attention, routed experts,
elementwise kernels, the TP all-reduce, the LM head) is priced here on the device-wide
roofline or, where the device carries one for the engine, its fitted per-operator curve
(:class:`simulator.hardware.operator_fits.OperatorFit`) with its tile/wave quantisation
(:func:`simulator.cost.roofline.quantisation`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from simulator.cost.accounting import LinkSet, _Acc
from simulator.cost.batch import BatchShape
from simulator.cost.collectives import allreduce_time
from simulator.cost.dp_attention import extend_tokens
from simulator.cost.moe_comm import DeepEPMode, EPGroup, deepep_kernel, moe_exchange_seconds
from simulator.cost.parallel import Parallelism
from simulator.cost.roofline import (
    causal_quantisation,
    causal_share,
    decode_units,
    kv_reread_bytes,
    op_time,
    prefill_tiles,
    quantisation,
    scalar_quantisation,
    whole_context_quantisation,
)
from simulator.hardware.operator_fits import (
    OperatorFit,
    expanded_activation_blocks,
    few_token_batch,
)
from simulator.hardware.profiles import DeviceProfile
from simulator.models.arch import ModelConfig
from simulator.units import bytes_per_element, compute_precision

QUANT_MEMO_SIZE = 65536
"""Remembered tile/wave multipliers per instance before the memo starts over."""
MLA_DECODE_PATH_TOKENS = 16
"""Query tokens per sequence up to which an MLA model's chunks on a cached context run the
engine's MLA decode kernel (:meth:`OperatorPricing._mla_decode_path`): a speculative verify
of up to 15 drafts."""
RESIDUAL_BYTES = 2.0
"""Bytes per element of the hidden state the TP all-reduce sums: the model's 16-bit dtype at
every weight and activation precision. FP8 and NVFP4 quantise only a GEMM's input; the
attention and MLP outputs that are reduced, the residual and the norms stay 16-bit
(TensorRT-LLM ``tensorrt_llm/_torch/models/modeling_llama.py``: ``LlamaDecoderLayer`` hands
the 16-bit projection output to ``AllReduce`` with ``AllReduceFusionOp.RESIDUAL_RMS_NORM``).
The engines' measured all-reduce is keyed by elements: the collector reduces a 16-bit tensor
of ``message_size`` elements (ai-dynamo/aiconfigurator ``collector/collect_all_reduce.py``,
``get_input_shape_and_comm_size``)."""
WHOLE_LAYER_FITS = frozenset({"moe"})
"""Operator labels whose fitted curve prices the whole operator as one measured call: the
kernel tables time a routed-expert layer end to end (both grouped GEMMs, the activation and
the combine in one ``moe_perf`` row; ai-dynamo/aiconfigurator ``collector/*/collect_moe.py``),
so its fitted floor counts once per layer. A GEMM group's GEMMs are timed one per row, so
each of its ``kernels`` pays the floor."""

DECODE_BATCH_FIT = "attention_decode_batch"
"""The instance's decode-attention fit for a decode-only step of more than one sequence,
kept only where it differs from the one-sequence (or mixed-step) fit: vLLM's FlashAttention-2
path copies the queries into its grouped layout then (``OperatorFit.q_copy_us``)."""


def gemm_fit_label(precision: str) -> str | None:
    """The fitted GEMM family a GEMM at compute ``precision`` runs on: ``gemm`` (16-bit),
    ``gemm_fp8``, ``gemm_fp4``; None where no family is fitted (FP32, INT8)."""
    return {"bf16": "gemm", "fp16": "gemm", "fp8": "gemm_fp8", "fp4": "gemm_fp4"}.get(precision)


def gemm_group_work(tokens: float, params: float, out_width: float, in_width: float,
                    weight_bytes: float, input_bytes: float,
                    output_bytes: float) -> tuple[float, float]:
    """FLOPs and bytes of a group of GEMMs sharing ``tokens`` input rows: the weights
    (``params`` elements) read once, the input (``in_width`` per row) at the GEMM's
    activation precision, the output (``out_width`` per row) at ``output_bytes`` (an FP8 or
    NVFP4 GEMM writes the model's 16-bit dtype, as the kernel tables' GEMMs do)."""
    flops = 2.0 * tokens * params
    nbytes = params * weight_bytes + tokens * (in_width * input_bytes + out_width * output_bytes)
    return flops, nbytes


def fitted_time(fit: OperatorFit, peak: float, bandwidth: float, flops: float, nbytes: float,
                kernels: int, units: float, rows: float, quant: float = 1.0,
                groups: float = 0.0, depth: float = 0.0, written: float = 0.0,
                blocks: float = 0.0, streamed: float = 0.0,
                whole_layer: bool = False) -> tuple[float, float]:
    """(compute, memory) seconds of one operator on its fitted curve, the fixed terms (floor,
    per-row and per-depth time, the shorter side's exposed share) on the longer side.

    ``units`` input rows per GEMM (tokens), for each of the ``kernels`` GEMMs of a group:
    each GEMM pays the half-work terms and the floor, as the single GEMMs the fit was made
    on did; a ``whole_layer`` fit (:data:`WHOLE_LAYER_FITS`) prices the kernels as one call.
    The step model (:meth:`OperatorPricing._roofline`) and ``disagg-sim validate --engine``
    price through this one function.
    """
    calls = 1 if whole_layer else kernels
    c, m = fit.parts(peak, bandwidth, flops, nbytes, units, quant, kernels=calls,
                     streamed=streamed)
    compute, memory = float(c), float(m)
    busy = fit.busy(compute, memory)  # the longer side and the shorter's exposed share
    exposed = busy - max(compute, memory)
    fixed = (float(fit.fixed(rows, busy, units * calls, depth, written))
             + (calls - 1) * fit.floor_us * 1e-6 + exposed + fit.group_seconds(groups)
             + fit.expanded_seconds(blocks))
    if compute >= memory:
        return compute + fixed, memory
    return compute, memory + fixed


def fitted_gemm_time(device: DeviceProfile, engine: str, dtype: str, m: float, n: float,
                     k: float) -> tuple[float, float] | None:
    """(compute, memory) seconds of one GEMM ``C[m,n] = A[m,k] @ B[k,n]`` at ``dtype`` as
    the step model prices a group of one GEMM on ``engine``'s fitted curve for ``device``
    (:meth:`OperatorPricing._gemm`); None if the device carries no such fit."""
    if not device.operators or engine not in device.operators:
        return None
    label = gemm_fit_label(compute_precision(dtype, dtype))
    fit = device.operator_fits(engine).get(label) if label is not None else None
    if fit is None:
        return None
    wb = bytes_per_element(dtype)
    flops, nbytes = gemm_group_work(m, n * k, n, k, wb, wb, max(RESIDUAL_BYTES, wb))
    quant = (scalar_quantisation(fit, (1.0, m, n, k), device.sm_count) if fit.tile_m else 1.0)
    return fitted_time(fit, device.peak_flops(compute_precision(dtype, dtype)),
                       device.memory_bandwidth, flops, nbytes, 1, m, m * k, float(quant),
                       depth=k)


class OperatorPricing:
    """Operator pricing of :class:`simulator.cost.step.InstanceCostModel` (a mixin: the
    attributes below are the model's fields and the constants its ``__post_init__`` sets)."""

    model: ModelConfig
    device: DeviceProfile
    parallelism: Parallelism
    links: LinkSet
    moe_imbalance: float
    ep_group: EPGroup | None
    deepep_mode: DeepEPMode
    redundant_experts: int
    norm_fusion_bytes: float
    _fits: dict[str, OperatorFit]
    _ar_curves: dict[int, Any]
    _ar_knots: dict[int, tuple[np.ndarray, np.ndarray]]
    _peak: float
    _peak16: float
    _bw: float
    _sms: int | None
    _launch: float
    _flat: bool
    _eta_c: float
    _eta_m: float
    _cp: str
    _wb: float
    _ab: float
    _hb: float
    """Bytes per element of the tensors kernels hand each other outside a GEMM's input: GEMM
    and attention outputs, the residual, norm and activation inputs (:data:`RESIDUAL_BYTES`,
    or the activation precision where that is wider)."""
    _kvb: float
    _attn_params: float
    _attn_out: float
    _ffn_params: float
    _ffn_width: float
    _ffn_shapes: tuple[tuple[float, float], ...]
    _attn_shapes: tuple[tuple[float, float], ...] | None
    _quant_memo: dict[tuple[Any, ...], float]
    # attention shapes per device (InstanceCostModel._attention_constants)
    _kvh: int
    _kv_elems: float
    _q_heads: float
    _attn_io: float
    _decode_io: float
    _decode_per_ctx: float
    _decode_step_per_ctx: float
    _prefill_per_pair: float
    _decode_split: int
    _decode_kvh: float
    _whole_context: bool
    _by_longest: bool
    _decode_resident: float | None
    _decode_kv_elems: float
    _decode_rows: float
    _prefill_scale: float | None
    _prefill_flops_scale: float | None
    _prefill_key_extra: float

    @property
    def kv_heads_per_device(self) -> int:
        return math.ceil(self.model.num_kv_heads / self.parallelism.tp)

    def kv_elements_per_token_per_layer_device(self) -> float:
        """KV elements one token stores per layer on one TP rank.

        GQA shards KV heads over TP (a rank keeps at least one head, so TP beyond the KV
        head count replicates). MLA's single latent is replicated on every rank.
        """
        m = self.model
        if m.attention == "mla":
            return m.kv_elements_per_token_per_layer()
        return 2 * self.kv_heads_per_device * m.head_dim

    def _quant(self, label: str, shape: tuple[Any, ...]) -> Any:
        """Tile/wave FLOPs multiplier of operator ``label`` of ``shape`` (1 without a tiled
        fit). Scalar shapes are remembered per instance where they repeat (a run prices the
        same prompt lengths and expert loads over and over), not for decode attention: its
        shape holds the batch's context sum, which seldom comes back (6 % of (a)'s decode
        tile counts and 3 % of (b)'s, benchmarks/bench.py at 5,000 requests), and a float
        tile count costs less than remembering it."""
        fit = self._fits.get(label)
        if fit is None or not fit.tile_m:
            return 1.0
        decode = label == "attention_decode"
        if isinstance(shape[1], np.ndarray):
            return quantisation(fit, shape, self.device.sm_count, decode)
        if decode:
            return scalar_quantisation(fit, shape, self._sms, True)
        key = (label, *shape)
        memo = self._quant_memo
        quant = memo.get(key)
        if quant is None:
            if len(memo) >= QUANT_MEMO_SIZE:
                memo.clear()
            quant = scalar_quantisation(fit, shape, self._sms)
            memo[key] = quant
        return quant

    def _decode_row_heads(self, fit: OperatorFit) -> float:
        """Rows of per-row decode-attention work per sequence, as the fit counts them (MLA:
        one latent head, and a split-KV kernel's head blocks, ``OperatorFit.head_block``)."""
        heads = self.model.num_attention_heads / self.parallelism.tp
        mla = self.model.attention == "mla"
        blocks = float(fit.block_rows(heads)) if mla else 0.0
        if fit.row_unit == "kv_head":
            return (1.0 if mla else float(self.kv_heads_per_device)) + blocks
        return heads + blocks

    def _decode_units(self, seqs: Any, ctx: Any, longest: float = 0.0) -> tuple[Any, Any]:
        """Parallel units and tile/wave FLOPs multiplier of decode attention: a tiled fit's
        ``tile_m`` is its split-KV partition, else ``DECODE_SPLIT_TOKENS``. A kernel with a
        block per query head (``OperatorFit.group_limit``) counts query heads. A kernel
        that does not split the context (``OperatorFit.head_tile``) takes at least its
        longest sequence on one block: ``longest``, the longest context (0: not given,
        bounded by all but one token per other sequence)."""
        kvh = self._decode_kvh
        if self._whole_context:
            most = longest if longest else max(float(ctx) - (seqs - 1), 1.0)
            return (decode_units(seqs, ctx, kvh, self._decode_split),
                    whole_context_quantisation(kvh, ctx, most, self._decode_resident))
        return (decode_units(seqs, ctx, kvh, self._decode_split),
                self._quant("attention_decode", (seqs, ctx, kvh)))

    def _decode_attention_op(self, seqs: int, ctx: float,
                             longest: int = 0) -> tuple[float, float, float, float]:
        """FLOPs, bytes, parallel units and FLOPs multiplier decode attention is priced with.

        The batch is priced as ``seqs`` equal sequences of its context sum. Under a fitted
        curve, whose fill term favours many units, that can be cheaper than one of its
        sequences alone (a long one next to a short one): the batch is then priced as its
        longest possible sequence (all but one token per other sequence), so adding a
        sequence never makes a step faster. A kernel that does not split the context
        (``OperatorFit.head_tile``) is priced on the batch's longest context where the
        shape gives it (``longest``; :meth:`_decode_units`), and so is that sequence alone.
        """
        flops, nbytes = self._decode_attention_work(seqs, ctx)
        units, quant = self._decode_units(seqs, ctx, longest)
        fit = self._fits.get("attention_decode")
        if fit is None or seqs <= 1:
            return flops, nbytes, units, quant
        # One step's floats; a decode series makes the same choice per element in
        # InstanceCostModel._decode_series_parts.
        single = (float(longest) if longest and self._by_longest
                  else max(float(ctx) - (seqs - 1), 1.0))
        flops1, nbytes1 = self._decode_attention_work(1, single)
        units1, quant1 = self._decode_units(1, single, single)
        batch = fit.parts(self._peak16, self._bw, flops, nbytes, units, quant)
        alone = fit.parts(self._peak16, self._bw, flops1, nbytes1, units1, quant1)
        return ((flops1, nbytes1, units1, quant1) if max(alone) > max(batch)
                else (flops, nbytes, units, quant))

    @staticmethod
    def _longest_chunk(seqs: int, tokens: int, pairs: float) -> int:
        """The most new tokens one of ``seqs`` prefill chunks of ``tokens`` new tokens and
        ``pairs`` causal pairs can hold: a chunk of ``n`` has at least ``n (n + 1) / 2`` pairs
        and the others' ``T - n`` tokens at least those of equal chunks, so ``n`` is the
        largest with ``n (n+1)/2 + (T-n) ((T-n)/(s-1) + 1)/2 <= pairs``. It is the mean for
        chunks of equal length, a long prompt's own length next to short ones, and it never
        falls as chunks are added."""
        if seqs <= 1:
            return tokens
        r = 1.0 / (seqs - 1)
        disc = max((1 + r) * (2 * pairs - tokens) - r * tokens * tokens, 0.0)
        longest = (r * tokens + math.sqrt(disc)) / (1 + r)
        return int(max(min(math.floor(longest + 1e-6), tokens - (seqs - 1)), 1))

    def _prefill_attention_op(self, b: BatchShape) -> tuple[float, float, float, float]:
        """FLOPs, bytes, parallel units and tile/wave multiplier of one layer's prefill
        attention.

        A variable-length FlashAttention launch sizes its grid by the longest chunk
        (``max_seqlen_q``: ``ceil(max_seqlen_q / kBlockM)`` query tiles for every sequence
        and head; Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h),
        so the tile and the waves follow the longest chunk (``prefill_max_tokens``, else
        bounded by :meth:`_longest_chunk`), and a wave lasts as long as its longest blocks:
        every row is priced at the work per query row of the longest chunk where the batch's
        mean is less. Chunks of equal length keep the mean-length tiles the kernel tables measure,
        and adding a chunk never makes the operator cheaper (tiles from the mean length
        would: a short prompt next to a long one halves the tile).
        """
        m = self.model
        seqs, tokens, pairs = b.prefill_seqs, b.prefill_tokens, b.prefill_attn_pairs
        heads, per_pair = self._q_heads, self._prefill_per_pair
        kv_token = self._kv_elems * self._kvb
        nbytes = b.prefill_kv_tokens * kv_token + tokens * self._attn_io * self._hb
        fit = self._fits.get("attention_prefill")
        if m.attention != "mla":  # K/V re-read per query block (FlashAttention-class)
            reread = kv_reread_bytes(pairs, kv_token)
            if fit is not None and fit.kv_reread_share != 1.0:  # the rest hits L2
                reread *= fit.kv_reread_share
            nbytes += reread
            scale, flops_scale = self._prefill_scale, self._prefill_flops_scale
            if scale is not None and flops_scale is not None:  # tiles chosen by head dim
                per_pair, nbytes = per_pair * flops_scale, nbytes * scale
        longest = (min(b.prefill_max_tokens, tokens) if b.prefill_max_tokens
                   else self._longest_chunk(seqs, tokens, pairs))
        longest = max(longest, math.ceil(tokens / seqs))
        shape = prefill_tiles(seqs, float(longest), heads, float(self._kvh),
                              m.head_dim, fit is not None and fit.pack_gqa)
        quant = self._quant("attention_prefill", shape)
        if seqs > 1 and fit is not None and fit.tile_m:
            # The tiles hold ``tokens`` rows, not ``seqs * longest`` (also when the waves
            # happen to be full and the tile/wave multiplier is exactly 1).
            quant *= seqs * longest / tokens * max(1.0, tokens * (longest + 1) / 2 / pairs)
        if fit is not None and fit.causal_tail and fit.tile_m and self._sms:
            # The longest tile: the last query block of the longest chunk, over its cached
            # context too where the chunk is alone (a batch keeps only the context sum, and
            # the chunk alone on all of it below bounds the batch).
            keys = longest + (b.prefill_kv_tokens - tokens) if seqs <= 1 else longest
            quant = causal_quantisation(
                quant, causal_share(self._sms, fit.tile_m, heads, longest, keys, pairs),
                fit.causal_tail)
        # A kernel computing whole key blocks charges each row keys past its causal ones
        # (OperatorFit.key_tiles; the tile shapes above keep the causal pairs).
        batch = (per_pair * (pairs + tokens * self._prefill_key_extra), nbytes, seqs * heads,
                 float(quant))
        if fit is None or seqs <= 1:
            return batch
        # Cached context is not in the tile bound: the batch also costs at least its longest
        # possible chunk alone, on all the batch's cached context (at most its pairs).
        ctx = b.prefill_kv_tokens - tokens
        alone = self._prefill_attention_op(BatchShape(
            prefill_tokens=longest, prefill_seqs=1,
            prefill_attn_pairs=min(longest * (ctx + (longest + 1) / 2), pairs),
            prefill_kv_tokens=min(ctx + longest, b.prefill_kv_tokens)))
        slower = (max(fit.parts(self._peak16, self._bw, *alone))
                  > max(fit.parts(self._peak16, self._bw, *batch)))
        return alone if slower else batch

    def attention_seconds(self, b: BatchShape) -> tuple[float, float, float]:
        """(compute, memory, launch) seconds of one layer's attention of ``b`` on one device,
        priced as a step prices it (:meth:`_attention`); the side that does not bound the
        operator is 0. ``disagg-sim validate --engine`` prices attention rows through it
        (:func:`simulator.cost.step.fitted_attention_time`)."""
        acc = _Acc()
        self._attention(acc, b, 1.0)
        return acc.compute, acc.memory, acc.launch

    def _decode_attention_work(self, seqs: int, ctx: np.ndarray | float) -> tuple[Any, Any]:
        """FLOPs and bytes of one layer's decode attention on one device (the KV bytes of
        the engine's kernel for this head layout: ``OperatorFit.decode_group``)."""
        flops = self._decode_step_per_ctx * ctx
        nbytes = ctx * self._decode_kv_elems * self._kvb + seqs * self._decode_io * self._hb
        return flops, nbytes

    # ----- operators -----------------------------------------------------------------
    def _op(self, acc: _Acc, flops: float, nbytes: float, kernels: int, times: float,
            label: str = "other", key: Any = None, units: float = 1.0, rows: float = 0.0,
            quant: float = 1.0, groups: float = 0.0, fit_label: str | None = None,
            depth: float = 0.0, written: float = 0.0, blocks: float = 0.0,
            streamed: float = 0.0) -> None:
        """The roofline of one operator, added ``times`` times to ``acc``.

        ``key`` describes the operator's shape for predictors that look it up in measured
        tables (:class:`simulator.cost.predictor.TablePredictor`); the roofline ignores it.
        ``units``, ``rows`` and ``quant`` (tile/wave FLOPs multiplier) feed the fitted
        per-operator curves (:class:`OperatorFit`); ``groups``, the experts a grouped MoE
        GEMM walks (:meth:`OperatorFit.group_seconds`); ``fit_label``, the fitted curve
        when it is not ``label``'s (the MoE batches of SGLang's default Triton blocks);
        ``depth``, the sum of a GEMM group's depths ``k`` (:attr:`OperatorFit.per_k_ps`);
        ``written``, the K/V elements prefill attention stores into the cache
        (:attr:`OperatorFit.kv_write_ps`); ``blocks``, the thread-block iterations of a
        fused MoE's expanded-space activation kernel (:meth:`OperatorFit.expanded_seconds`);
        ``streamed``, the least memory seconds of a MoE kernel whose blocks stream their
        weights alone (:meth:`OperatorFit.expert_stream_seconds`).
        """
        acc.add_op(*self._roofline(label, flops, nbytes, kernels, units, rows, quant, groups,
                                   fit_label, depth, written, blocks, streamed), times, label)

    def _roofline(self, label: str, flops: float, nbytes: float, kernels: int, units: float,
                  rows: float, quant: float = 1.0, groups: float = 0.0,
                  fit_label: str | None = None, depth: float = 0.0,
                  written: float = 0.0, blocks: float = 0.0,
                  streamed: float = 0.0) -> tuple[float, float, float]:
        """(compute, memory, launch) seconds of one operator."""
        fit = self._fits.get(fit_label or label)
        if fit is not None:
            peak = self._peak if label.startswith(("gemm", "lm_head", "moe")) else self._peak16
            compute, memory = fitted_time(fit, peak, self._bw, flops, nbytes, kernels, units,
                                          rows, quant, groups, depth, written, blocks, streamed,
                                          whole_layer=label in WHOLE_LAYER_FITS)
            # The floor is kernel time, not launch: CUDA graphs do not remove it.
            return compute, memory, 0.0
        if not self._flat:
            t = op_time(self.device, self._cp, flops, nbytes, kernels)
            return t.compute_s, t.memory_s, t.launch_s
        compute = flops / (self._peak * self._eta_c) if flops else 0.0
        memory = nbytes / (self._bw * self._eta_m) if nbytes else 0.0
        return compute, memory, kernels * self._launch

    def _gemm(self, acc: _Acc, tokens: int, params: float, out_width: float,
              in_width: float, times: float, kernels: int = 1, label: str = "gemm",
              shapes: tuple[tuple[float, float], ...] | None = None) -> None:
        """A group of GEMMs sharing ``tokens`` rows; ``shapes`` lists each one's (n, k)."""
        if tokens <= 0 or times <= 0:
            return
        flops, nbytes = gemm_group_work(tokens, params, out_width, in_width, self._wb,
                                        self._ab, self._hb)
        k_sum = sum(k for _, k in shapes) if shapes is not None else in_width
        quant = 1.0
        fit = self._fits.get(label)
        if fit is not None and fit.tile_m:
            gemms = shapes if shapes is not None else ((params / in_width, in_width),)
            key = (label, tokens, gemms)
            quant = self._quant_memo.get(key)  # type: ignore[assignment]
            if quant is None:
                # Each GEMM of the group has its own tiles: FLOP-weighted multiplier.
                quant = (sum(n * k * scalar_quantisation(fit, (1.0, tokens, n, k), self._sms)
                             for n, k in gemms) / sum(n * k for n, k in gemms))
                self._quant_memo[key] = quant
        # Each GEMM of the group walks its own depth k (OperatorFit.per_k_ps): k_sum.
        self._op(acc, flops, nbytes, kernels, times, label,
                 (tokens, shapes) if shapes is not None else None, tokens, tokens * k_sum,
                 float(quant), depth=k_sum)

    def _allreduce(self, acc: _Acc, nbytes: float, ranks: int, times: float) -> None:
        link = self.links.tp
        if link is None:
            return
        # The engine's own measured all-reduce where the group stays on the scale-up link.
        curve = self._ar_curves.get(ranks) if link.name == self.device.scale_up_link else None
        seconds = (curve.seconds(nbytes / RESIDUAL_BYTES, self._ar_knots[ranks])
                   if curve is not None else None)
        if seconds is None:
            seconds = allreduce_time(nbytes, ranks, link)
        acc.add_comm(seconds * times, "allreduce")

    def _layers(self, acc: _Acc, b: BatchShape, count: float, *, moe: bool,
                decode_attention: bool = True) -> None:
        if count <= 0:
            return
        m, par = self.model, self.parallelism
        t, h, tokens = par.tp, m.hidden_size, b.tokens
        # Attention projections (QKV + output) as one weight-streaming group of GEMMs.
        self._gemm(acc, tokens, self._attn_params, self._attn_out, 2 * h, count, kernels=2,
                   label="gemm_attention", shapes=self._attn_shapes)
        self._attention(acc, b, count, decode_attention)
        if moe:
            self._moe(acc, b, count)
        else:
            self._gemm(acc, tokens, self._ffn_params, 2 * self._ffn_width, 2 * h, count,
                       kernels=2, label="gemm_ffn", shapes=self._ffn_shapes)
        # Norms, residual adds, rotary, activation: bandwidth-bound elementwise kernels.
        ffn_width = (m.moe_intermediate_size * m.num_experts_per_token if moe
                     else m.intermediate_size) / t
        # Their traffic is 16-bit but for what they write as the next GEMM's input at its
        # activation precision (an FP8/NVFP4 model's fused quantisation): the two normed
        # hidden states and the gated activation.
        elem_bytes = tokens * ((8 * h + 3 * ffn_width) * self._hb
                               - (2 * h + ffn_width) * (self._hb - self._ab))
        reduced = tokens * h * RESIDUAL_BYTES
        # Three kernels: two residual adds with their RMSNorms, and the gated activation.
        # An engine that fuses each TP all-reduce with the add and norm after it runs the
        # norms inside the all-reduce's kernel: their traffic stays, their kernels go.
        kernels = 1 if t > 1 and reduced <= self.norm_fusion_bytes else 3
        self._op(acc, 0.0, elem_bytes, kernels, count, "elementwise")
        if t > 1:
            self._allreduce(acc, reduced, t, 2 * count)

    def _mla_decode_path(self, b: BatchShape) -> bool:
        """Whether the step's prefill chunks run the engine's MLA *decode* kernel: an MLA
        model's chunks of at most :data:`MLA_DECODE_PATH_TOKENS` query tokens on a cached
        context (speculative verification, MTP). The engines attend those over the latent
        as they decode: vLLM's FlashMLA backend sends query lengths up to 128 down its
        decode path (``vllm/v1/attention/backends/mla/flashmla.py``,
        ``FlashMLAMetadataBuilder.reorder_batch_threshold``), SGLang runs its target-verify
        batches on the decode attention backend, TensorRT-LLM its MTP drafts in the
        generation phase; the non-absorbed prefill form would up-project the whole cached
        latent for a few query rows."""
        return (self.model.attention == "mla"
                and 0 < b.prefill_max_tokens <= MLA_DECODE_PATH_TOKENS
                and b.prefill_kv_tokens > b.prefill_tokens)

    def _mla_chunks_on_decode_op(self, b: BatchShape) -> tuple[float, float, float, float, float]:
        """FLOPs, bytes, units, per-row work and FLOPs multiplier of MLA chunks on the decode
        kernel (:meth:`_mla_decode_path`): every (query, key) pair of the chunks at the
        absorbed decode cost, the latent of each sequence read once for its query tokens."""
        seqs, tokens = b.prefill_seqs, b.prefill_tokens
        flops = self._decode_per_ctx * b.prefill_attn_pairs
        nbytes = (b.prefill_kv_tokens * self._decode_kv_elems * self._kvb
                  + tokens * self._attn_io * self._hb)
        fit = self._fits.get("attention_decode")
        if fit is not None and fit.head_tile:
            # Each sequence's query tokens x heads are the padded query rows of its blocks.
            blocks, pad = fit.head_blocks(self._q_heads * tokens / seqs)
            flops = flops * pad
            kv = b.prefill_kv_tokens
            units = decode_units(seqs, kv, blocks, self._decode_split)
            quant = whole_context_quantisation(
                blocks, kv, b.prefill_max_kv or max(kv - (seqs - 1), 1), self._decode_resident)
        else:
            units, quant = self._decode_units(seqs, b.prefill_kv_tokens)
        per_seq = tokens / seqs if fit is not None and fit.row_unit == "query_head" else 1.0
        return flops, nbytes, float(units), seqs * per_seq * self._decode_rows, float(quant)

    def _attention(self, acc: _Acc, b: BatchShape, count: float, decode: bool = True) -> None:
        if b.prefill_tokens and self._mla_decode_path(b):
            flops, nbytes, units, rows, quant = self._mla_chunks_on_decode_op(b)
            self._op(acc, flops, nbytes, 1, count, "attention_decode", b, units, rows, quant)
        elif b.prefill_tokens:
            flops, nbytes, units, quant = self._prefill_attention_op(b)
            # The prompt's K/V stored into the cache beside the kernel (OperatorFit.kv_write_ps).
            self._op(acc, float(flops), float(nbytes), 1, count, "attention_prefill", b,
                     float(units), b.prefill_tokens * self._q_heads, float(quant),
                     written=b.prefill_tokens * self._kv_elems)
        if b.decode_seqs and decode:
            flops, nbytes, units, quant = self._decode_attention_op(
                b.decode_seqs, b.decode_ctx_tokens, b.decode_max_ctx)
            # A decode-only step of several sequences may run a kernel more (DECODE_BATCH_FIT).
            batched = (DECODE_BATCH_FIT if b.decode_seqs > 1 and not b.prefill_tokens
                       and DECODE_BATCH_FIT in self._fits else None)
            self._op(acc, float(flops), float(nbytes), 1, count, "attention_decode", b,
                     float(units), b.decode_seqs * self._decode_rows, float(quant),
                     fit_label=batched)

    def _moe(self, acc: _Acc, b: BatchShape, count: float) -> None:
        m, par = self.model, self.parallelism
        h, tokens = m.hidden_size, b.tokens
        expert_params = m.ffn_params(m.moe_intermediate_size) / par.expert_tp
        experts_here = (m.num_experts + self.redundant_experts) / par.ep
        # With DP attention ``tokens`` is one rank's; the EP group routes all ranks' tokens.
        group_tokens = tokens * par.dp
        routed = group_tokens * m.num_experts_per_token
        # Expected experts hit by at least one token, on the busiest device.
        p_hit = 1.0 - (1.0 - m.num_experts_per_token / m.num_experts) ** group_tokens
        touched = experts_here * p_hit
        tokens_here = routed / par.ep * self.moe_imbalance
        width = m.moe_intermediate_size / par.expert_tp
        flops = 2.0 * tokens_here * expert_params
        nbytes = touched * expert_params * self._wb + tokens_here * (2 * h + 2 * width) * self._hb
        # DP attention with an EP group exchanges tokens (DeepEP): a rank gets its own only.
        exchange = self.ep_group if par.dp > 1 else None
        # SGLang's default Triton blocks differ while the rank's kernel sees at most as many
        # tokens as it holds experts (OperatorFit families moe_few_tokens / moe).
        label = ("moe_few_tokens" if "moe_few_tokens" in self._fits
                 and few_token_batch(group_tokens, experts_here) else "moe")
        fit = self._fits.get(label)
        rows = tokens * h
        if fit is not None:  # the routing kernels' elements per slot (OperatorFit.slot_kernels)
            rows += fit.slot_rows(tokens_here, 2 * width, h)
        if fit is not None and exchange is None:
            # Without a token exchange every rank holds every token; a kernel that writes
            # every routed slot (OperatorFit.remote_slots) writes the other ranks' too.
            rows += fit.remote_rows(max(routed - tokens_here, 0.0), 2 * width, h)
        blocks = 0.0
        if fit is not None and fit.expanded_block_ns and exchange is None:
            # The activation kernel's blocks over every token's slots, the other ranks' too
            # (OperatorFit.expanded_block_ns): every rank is handed every token.
            blocks = float(expanded_activation_blocks(group_tokens, m.num_experts_per_token,
                                                      width, self.device.sm_count or 0))
        # Grouped GEMM tiles: the experts hit, their tokens each, the gate+up columns.
        quant = self._quant(label, (touched, tokens_here / max(touched, 1e-9), 2 * width, h))
        # A Triton kernel's blocks, each streaming its weight columns alone
        # (OperatorFit.expert_block_gbs): the floor of the memory time.
        streamed = (float(fit.expert_stream_seconds(touched, tokens_here / max(touched, 1e-9),
                                                    2 * width, h, self._wb, self._sms))
                    if fit is not None else 0.0)
        self._op(acc, flops, nbytes, 2, count, "moe", tokens, tokens_here, rows, float(quant),
                 touched, fit_label=label, blocks=blocks, streamed=streamed)
        # Router GEMM and shared experts are dense, TP-sharded.
        shared = m.num_shared_experts * m.ffn_params(m.moe_intermediate_size) / par.tp
        router = h * m.num_experts
        self._gemm(acc, tokens, shared + router, m.num_experts, h, count, kernels=1,
                   label="gemm_moe_dense")
        if exchange is not None:
            kernel = deepep_kernel(self.deepep_mode, extend_tokens(b))
            acc.add_comm(moe_exchange_seconds(
                kernel, tokens, h, m.num_experts, m.num_experts_per_token, exchange,
                self.moe_imbalance) * count, "moe_alltoall")
            return
        # TP attention: the layer's all-reduce already combines the experts' outputs
        # (moe_token_exchange_time("tp", ...) is zero), so EP sends nothing of its own.

    def _lm_head(self, acc: _Acc, b: BatchShape) -> None:
        m, t = self.model, self.parallelism.tp
        if b.logits_seqs <= 0:
            return
        params = m.vocab_size * m.hidden_size / t
        self._gemm(acc, b.logits_seqs, params, m.vocab_size / t, m.hidden_size, 1,
                   label="lm_head", shapes=((m.vocab_size / t, m.hidden_size),))

