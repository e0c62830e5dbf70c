"""Time of one engine step of a batch on one instance (a TP x PP x EP group).

Built once per instance: every per-layer operator is reduced to coefficients (FLOPs and
bytes per token, fixed weight bytes), so pricing a step is a few dozen float operations.
The model behind it is described in docs/concepts.md (the parallelism axes) and
docs/hardware.md (efficiency factors and per-operator fits).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from simulator.cost.accounting import DecodeSeries, LinkSet, StepCost, _Acc
from simulator.cost.batch import BatchShape
from simulator.cost.collectives import p2p_time
from simulator.cost.dp_attention import rank_batch, series_by_steps, two_batch_overlap_step
from simulator.cost.host import HostModel
from simulator.cost.moe_comm import DeepEPMode, EPGroup
from simulator.cost.operators import (
    DECODE_BATCH_FIT,
    RESIDUAL_BYTES,
    OperatorPricing,
    gemm_fit_label,
)
from simulator.cost.parallel import Parallelism, Precisions, split_layers, stage_moe_layers
from simulator.cost.roofline import (
    DECODE_SPLIT_TOKENS,
    decode_blocks,
    decode_units,
    whole_context_quantisation,
)
from simulator.hardware.operator_fits import (
    WHOLE_CONTEXT,
    OperatorFit,
    key_tile_extra,
    moe_fit_labels,
)
from simulator.hardware.profiles import DeviceProfile
from simulator.models.arch import ModelConfig
from simulator.units import bytes_per_element, compute_precision

__all__ = ["DECODE_SPLIT_TOKENS", "DecodeSeries", "InstanceCostModel", "StepCost", "_Acc",
           "decode_units", "fitted_attention_time"]


@dataclass
class InstanceCostModel(OperatorPricing):
    model: ModelConfig
    device: DeviceProfile
    parallelism: Parallelism = field(default_factory=Parallelism)
    precisions: Precisions = field(default_factory=Precisions)
    links: LinkSet = field(default_factory=LinkSet)
    step_overhead_s: float = 0.0
    """Host-side scheduling, sampling and launch work per step (serving-engine profile)."""
    per_sequence_overhead_s: float = 0.0
    """Host time per sequence in the step (bookkeeping, sampling)."""
    graph_launch_factor: float = 1.0
    """Share of kernel-launch cost left in decode-only steps that replay CUDA graphs."""
    moe_imbalance: float = 1.0
    """Tokens on the busiest expert device relative to a uniform split (>= 1)."""
    engine: str | None = None
    """Serving engine whose fitted per-operator constants (``device.operators``) apply."""
    fitted: bool = False
    """Price operators with the device's fitted per-operator constants and the engine's
    measured all-reduce (``cost.predictor: fitted``); else the device-wide factors."""
    host: HostModel | None = None
    """The engine's host costs (cost/host.py); None = the two overheads above, no overlap."""
    ep_group: EPGroup | None = None
    """Where the EP ranks sit, for DeepEP dispatch/combine (data-parallel attention)."""
    deepep_mode: DeepEPMode = "auto"
    """DeepEP kernels: ``auto`` (normal for prefill, low-latency for decode), or one."""
    two_batch_overlap: bool = False
    """Hide one micro-batch's all-to-all behind the other's compute (cost/dp_attention.py)."""
    redundant_experts: int = 0
    """Extra expert replicas spread over the EP ranks (EPLB)."""
    norm_fusion_bytes: float = 0.0
    """Largest TP all-reduce the engine fuses with the residual add and RMSNorm after it,
    bytes (0: never fused; ``ServingEngineProfile.allreduce_norm_fusion``)."""

    def __post_init__(self) -> None:
        m, par = self.model, self.parallelism
        if par.pp > m.num_layers and not par.balanced_stages:
            raise ValueError(f"pp ({par.pp}) cannot exceed the model's {m.num_layers} layers "
                             "(whole-layer stages)")
        slots = m.num_experts + self.redundant_experts
        if m.is_moe and slots % par.ep:
            raise ValueError(f"ep ({par.ep}) must divide the {m.num_experts} experts"
                             + (f" + {self.redundant_experts} redundant"
                                if self.redundant_experts else ""))
        if par.dp > 1 and m.is_moe and self.ep_group is None:
            raise ValueError("data-parallel attention needs the EP group's links (ep_group)")
        if par.tp > 1 and self.links.tp is None:
            raise ValueError("tp > 1 needs a TP link")
        self._wb = bytes_per_element(self.precisions.weights)
        self._ab = bytes_per_element(self.precisions.activations)
        self._hb = max(self._ab, RESIDUAL_BYTES)
        self._kvb = bytes_per_element(self.precisions.kv_cache)
        self._cp = compute_precision(self.precisions.weights, self.precisions.activations)
        self._stage_layers = split_layers(m.num_layers, par.pp, par.balanced_stages)
        self._stage_moe = stage_moe_layers(m, self._stage_layers)
        self._decode_base: dict[int, StepCost] = {}
        self._quant_memo: dict[tuple[Any, ...], float] = {}
        # Per-device constants of the roofline, looked up once (pricing runs every step).
        dev, eff = self.device, self.device.efficiency
        self._peak = dev.peak_flops(self._cp)
        self._bw = dev.memory_bandwidth
        self._sms = dev.sm_count
        self._launch = dev.kernel_launch_us * 1e-6
        self._flat = eff.compute_curve is None and eff.memory_curve is None
        self._eta_c = eff.eta_compute(1.0, self._cp)
        self._eta_m = eff.memory
        t = par.tp
        self._attn_params = self._attn_weight_params_device()
        self._attn_out = m.q_width / t + m.attn_out_width / t
        self._ffn_params = m.ffn_params(m.intermediate_size) / t
        self._ffn_width = m.intermediate_size / t
        self._fits = self._operator_fits() if self.fitted else {}
        self._attention_constants()
        self._ar_curves = dev.allreduce_curves(self.engine) if self.fitted else {}
        if (self.fitted and dev.deepep is not None and self.ep_group is not None
                and self.ep_group.measured is None and dev.sm_count):
            # The device's measured DeepEP kernels price the NVLink leg (cost/moe_comm.py).
            self.ep_group = replace(self.ep_group, measured=dev.deepep, sm_count=dev.sm_count)
        self._ar_knots = {ranks: c.knots() for ranks, c in self._ar_curves.items()}
        self._peak16 = dev.peak_flops("bf16")
        # (n, k) of each GEMM per device, for predictors that look shapes up in tables.
        h = m.hidden_size
        self._ffn_shapes = ((2 * self._ffn_width, h), (h, self._ffn_width))
        self._attn_shapes: tuple[tuple[float, float], ...] | None = None
        if m.attention != "mla":
            qkv = m.q_width / t + 2 * self.kv_heads_per_device * m.head_dim
            self._attn_shapes = ((qkv, h), (h, m.attn_out_width / t))
        if self.host is None:
            self.host = HostModel(self.step_overhead_s, self.per_sequence_overhead_s)

    def _attention_constants(self) -> None:
        """The per-device shapes attention is priced with, computed once per instance."""
        m, t = self.model, self.parallelism.tp
        self._kvh = self.kv_heads_per_device
        self._kv_elems = self.kv_elements_per_token_per_layer_device()
        self._q_heads = m.num_attention_heads / t
        self._attn_io = (m.q_width + m.attn_out_width) / t
        if m.attention == "mla":  # absorbed MLA: scores and values on the latent
            self._decode_per_ctx = 2 * self._q_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
            self._prefill_per_pair = 2 * self._q_heads * (
                m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        else:
            self._decode_per_ctx = 4 * self._q_heads * m.head_dim
            self._prefill_per_pair = 4 * self._q_heads * m.head_dim
        decode = self._fits.get("attention_decode")
        self._decode_split = decode.tile_m if decode is not None and decode.tile_m else (
            DECODE_SPLIT_TOKENS)
        self._decode_rows = self._decode_row_heads(decode) if decode else self._q_heads
        # The decode kernel the engine dispatches for this head layout (OperatorFit.group_limit).
        # Absorbed MLA attends over one latent head shared by all query heads.
        self._decode_kvh = 1.0 if m.attention == "mla" else float(self._kvh)
        self._decode_kv_elems = self._kv_elems
        self._decode_step_per_ctx = self._decode_per_ctx
        self._whole_context = bool(decode is not None and decode.head_tile
                                   and m.attention == "mla")
        # A decode kernel that does not split the context (MLA's head tiles, or a whole-context
        # partition): a batch is priced at least as its longest sequence alone.
        self._by_longest = self._whole_context or bool(
            decode is not None and decode.tile_m == WHOLE_CONTEXT)
        self._decode_resident = self._sms
        if decode is not None and self._whole_context:
            self._decode_resident = decode.resident_blocks or self._sms
            # The heads as padded query-row tiles, a block per tile (OperatorFit.head_tile).
            self._decode_kvh, pad = decode.head_blocks(self._q_heads)
            self._decode_step_per_ctx = self._decode_per_ctx * pad
        if decode is not None and decode.head_block and m.attention == "mla":
            # Each further head block re-reads the latent (OperatorFit.block_kv_scale).
            self._decode_kv_elems = self._kv_elems * decode.block_kv_scale(self._q_heads)
        if decode is not None and decode.group_limit and m.attention != "mla":
            # (the grouped kernel's per-row work by head dimension: group_row_head_dim_exp)
            heads, kv, rows = decode.decode_group(self._q_heads / self._kvh, m.head_dim)
            self._decode_kvh = self._kvh * heads
            self._decode_kv_elems = self._kv_elems * kv
            self._decode_rows = self._decode_rows * rows
        self._decode_io = self._attn_io
        if decode is not None and decode.head_dim_exp and m.attention != "mla":
            # The decode kernel's work by head dimension (OperatorFit.head_dim_exp).
            scale = decode.work_scale(m.head_dim)
            self._decode_step_per_ctx *= scale
            self._decode_kv_elems *= scale
            self._decode_io *= scale
        prefill = self._fits.get("attention_prefill")
        # Prefill tiles are chosen by head dimension (FlashAttention-class kernels).
        self._prefill_scale = (None if m.attention == "mla" or prefill is None
                               else prefill.work_scale(m.head_dim))
        # Its FLOPs also per pair at least the softmax's (OperatorFit.softmax_dim).
        self._prefill_flops_scale = (None if self._prefill_scale is None or prefill is None
                                     else prefill.flops_scale(m.head_dim))
        # Keys per query row past the causal pairs of a kernel's whole key blocks.
        # (A kernel that packs GQA holds a KV head's query heads in one block's rows.)
        self._prefill_key_extra = (
            key_tile_extra(prefill.key_tiles, m.head_dim, self._q_heads / self._kvh)
            if prefill is not None and prefill.key_tiles and m.attention != "mla" else 0.0)

    def _operator_fits(self) -> dict[str, OperatorFit]:
        """Fitted roofline per operator label (labels without a fit use device-wide factors)."""
        fits = self.device.operator_fits(self.engine)
        low = {"fp8": "_fp8", "fp4": "_fp4"}.get(self._cp, "")
        out: dict[str, OperatorFit] = {}
        gemm_label = gemm_fit_label(self._cp)
        gemm = fits.get(gemm_label) if gemm_label is not None else None
        if gemm is not None:
            for label in ("gemm_attention", "gemm_ffn", "gemm_moe_dense", "lm_head"):
                out[label] = gemm
        # An FP8 KV cache runs kernels of its own, fitted separately where measured; MLA
        # runs kernels of its own too (the ``*_mla`` families, never the GQA curves).
        kv8 = "_kv_fp8" if self.precisions.kv_cache == "fp8" else ""
        mla = "_mla" if self.model.attention == "mla" else ""
        for label in ("attention_prefill", "attention_decode"):
            fit = fits.get(label + mla + kv8) or fits.get(label + mla)
            if fit is not None and label == "attention_decode" and not mla:
                # The floor of the decode kernel dispatched for this head layout.
                # The group as OperatorFit.decode_group sees it (_attention_constants).
                group = (self.model.num_attention_heads / self.parallelism.tp
                         / self.kv_heads_per_device)
                batched = fit.for_decode_layout(group, self.kv_heads_per_device, batch=2.0)
                fit = fit.for_decode_layout(group, self.kv_heads_per_device)
                if batched != fit:  # a decode-only step of several sequences pays more
                    out[DECODE_BATCH_FIT] = batched
            if fit is not None:
                out[label] = fit
        # The MoE kernel and configuration the engine dispatches (operator_fits.moe_fit_labels):
        # the first label the profile has a fit for, and the few-token batches' fit.
        m, par = self.model, self.parallelism
        labels, few = moe_fit_labels(self.engine, self.device.kernel_tables, m.architecture,
                                     low.removeprefix("_") or "bf16",
                                     (m.num_experts + self.redundant_experts) / par.ep,
                                     m.moe_intermediate_size / par.expert_tp, par.dp > 1)
        moe = next((fits[label] for label in labels if label in fits), None)
        if moe is not None:
            out["moe"] = moe
            if few is not None and few in fits:
                out[few] = fits[few]
        return out

    # ----- per-device shapes -------------------------------------------------------
    def _attn_weight_params_device(self) -> float:
        m, t = self.model, self.parallelism.tp
        if m.attention == "mla":
            h = m.hidden_size
            replicated = h * (m.q_lora_rank or 0) + h * (m.kv_lora_rank + m.qk_rope_head_dim)
            return replicated + (m.attention_params() - replicated) / t
        q_o = (m.q_width * m.hidden_size + m.attn_out_width * m.hidden_size) / t
        kv = m.hidden_size * 2 * self.kv_heads_per_device * m.head_dim
        return q_o + kv

    # ----- the step ------------------------------------------------------------------
    def step(self, batch: BatchShape) -> StepCost:
        batch = rank_batch(batch, self.parallelism.dp)
        if self.two_batch_overlap:
            overlapped = two_batch_overlap_step(self, batch, sum(self._stage_moe))
            if overlapped is not None:
                return overlapped
        return self._step(batch, decode_attention=True)

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds of one step per operator family (summed over layers and stages).

        Launch costs are included per operator before CUDA-graph scaling; the host
        overhead is listed as ``host``.
        """
        ops: dict[str, float] = {}
        batch = rank_batch(batch, self.parallelism.dp)
        self._step(batch, decode_attention=True, ops=ops)
        hm = self.host
        assert hm is not None
        graphed = hm.graph_batch(batch.decode_seqs, batch.prefill_tokens) is not None
        ops["host"] = hm.host_s(batch.prefill_seqs + batch.decode_seqs, self.model.num_layers,
                                graphed)
        return ops

    @property
    def decode_needs_longest(self) -> bool:
        """Whether a decode step's price depends on its longest context, not only on its
        size and context sum: a decode-attention kernel that does not split the context
        (``OperatorFit.head_tile``, or a whole-context partition)."""
        return self._by_longest

    def decode_series(self, seqs: int, ctx_sums: np.ndarray,
                      longest: np.ndarray | None = None) -> DecodeSeries:
        """Seconds and bound codes of consecutive decode-only steps of ``seqs`` sequences.

        ``ctx_sums[j]`` is the batch's total context at step ``j`` and ``longest[j]`` its
        longest sequence's (None: not given). Equals ``step()`` of each
        ``BatchShape.decode(seqs, ctx_sums[j], longest[j])`` (to rounding): everything but
        decode attention is the same in every step and priced once; attention is
        vectorised. Bound codes index ``("compute", "memory", "communication", "overhead")``.
        """
        if self.parallelism.pp != 1:
            raise ValueError("decode_series prices single-stage instances only")
        if self.parallelism.dp > 1 or self.two_batch_overlap:  # ranks' shares: step by step
            return series_by_steps(self, seqs, ctx_sums, longest)
        host = self.host
        assert host is not None
        base = self._decode_base.get(seqs)
        if base is None:  # everything but attention depends on the batch size alone
            base = self._step(BatchShape.decode(seqs, 0), decode_attention=False)
            self._decode_base[seqs] = base
        padded = host.graph_batch(seqs)
        graphed = padded is not None
        host_s = host.host_s(seqs, self.model.num_layers, graphed)
        rows = max(seqs, padded or 0)  # a replayed graph runs its captured batch size
        ctx = np.asarray(ctx_sums, dtype=float)
        layers = self.model.num_layers
        fit = (self._fits.get(DECODE_BATCH_FIT) if rows > 1 else None) or self._fits.get(
            "attention_decode")
        launch = self._launch * (self.graph_launch_factor if graphed else 1.0) * layers
        if fit is not None:
            compute, memory = self._decode_series_parts(rows, ctx, fit, longest)
            fixed = fit.fixed(rows * self._decode_rows, np.maximum(compute, memory))
            on_compute = compute >= memory
            compute = np.where(on_compute, compute + fixed, compute)
            memory = np.where(on_compute, memory, memory + fixed)
            launch = 0.0
        elif self._flat:
            # Constant efficiencies: both terms are affine in ctx, one division each.
            flops, nbytes = self._decode_attention_work(rows, ctx)
            compute = flops * (1.0 / (self._peak * self._eta_c))
            memory = nbytes * (1.0 / (self._bw * self._eta_m))
        else:
            flops, nbytes = self._decode_attention_work(rows, ctx)
            eff, peak = self.device.efficiency, self._peak
            compute = np.where(flops > 0, flops / (peak * eff.eta_compute(flops, self._cp)), 0.0)
            memory = np.where(nbytes > 0, nbytes / (self._bw * eff.eta_memory(nbytes)), 0.0)
        is_compute = compute >= memory
        gpu = sum(base.stage_seconds) + np.maximum(compute, memory) * layers + launch
        seconds = host.step_seconds(gpu, host_s)
        comp = base.compute_s + np.where(is_compute, compute * layers, 0.0)
        mem = base.memory_s + np.where(is_compute, 0.0, memory * layers)
        over = seconds - gpu + (base.overhead_s - (base.seconds - sum(base.stage_seconds))) + launch
        busiest = np.maximum(comp, mem)
        bound = np.where(mem >= comp, 1, 0)
        bound = np.where(busiest < base.communication_s, 2, bound)
        bound = np.where(np.maximum(busiest, base.communication_s) < over, 3, bound)
        return DecodeSeries(seconds, bound, comp, mem)

    def _decode_series_parts(self, seqs: int, ctx: np.ndarray, fit: OperatorFit,
                             longest: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Compute and memory seconds (before the fixed part) of one layer's decode attention
        over a series of context sums ``ctx`` (floats) under the fitted curve ``fit``:
        :meth:`_decode_attention_op`'s choice between the batch and its longest sequence
        alone, then ``fit.parts`` of the one chosen. ``parts`` is elementwise, so the parts
        of the chosen inputs are the chosen parts: each is computed once and the slower
        picked, and the block counts come from :func:`decode_blocks` (the same floats as
        ``_decode_units``, bit for bit: tests/test_step_pricing.py)."""
        kvh, tile_m, sms = self._decode_kvh, fit.tile_m, self._sms
        flops, nbytes = self._decode_attention_work(seqs, ctx)
        bound = np.maximum(ctx - (seqs - 1), 1.0)  # the longest a sequence can be
        most = bound
        if self._by_longest and longest is not None:
            most = np.where(longest > 0, longest, bound)
        if self._whole_context:  # the same floats as _decode_units, per element
            units = decode_units(seqs, ctx, kvh, self._decode_split)
            quant = whole_context_quantisation(kvh, ctx, most, self._decode_resident)
        else:
            units, quant = decode_blocks(seqs, ctx, kvh, tile_m, sms)
        compute, memory = fit.parts(self._peak16, self._bw, flops, nbytes, units, quant)
        if seqs <= 1:
            return compute, memory
        single = most.astype(float)
        flops1, nbytes1 = self._decode_attention_work(1, single)
        if self._whole_context:
            units1 = decode_units(1, single, kvh, self._decode_split)
            quant1 = whole_context_quantisation(kvh, single, single, self._decode_resident)
        else:
            units1, quant1 = decode_blocks(1, single, kvh, tile_m, sms)
        compute1, memory1 = fit.parts(self._peak16, self._bw, flops1, nbytes1, units1, quant1)
        slower = np.maximum(compute1, memory1) > np.maximum(compute, memory)
        return np.where(slower, compute1, compute), np.where(slower, memory1, memory)

    def _step(self, batch: BatchShape, *, decode_attention: bool,
              ops: dict[str, float] | None = None) -> StepCost:
        hm = self.host
        assert hm is not None
        if batch.is_empty:
            return StepCost(hm.step_s, (0.0,), 0.0, 0.0, 0.0, hm.step_s)
        seqs = batch.prefill_seqs + batch.decode_seqs
        padded = hm.graph_batch(batch.decode_seqs, batch.prefill_tokens)
        if padded is not None and batch.prefill_tokens == 0 and padded > batch.decode_seqs:
            # A replayed graph runs its captured batch size: the padding rows cost GPU time.
            batch = BatchShape(decode_seqs=padded, decode_ctx_tokens=batch.decode_ctx_tokens,
                               logits_seqs=padded, decode_max_ctx=batch.decode_max_ctx)
        launch_scale = self.graph_launch_factor if padded is not None else 1.0
        host = hm.host_s(seqs, self.model.num_layers, padded is not None)
        stages: list[float] = []
        total = _Acc()
        last = len(self._stage_layers) - 1
        # Stages with the same layer mix cost the same: price each mix once per step.
        by_mix: dict[tuple[float, float], _Acc] = {}
        for index, layers in enumerate(self._stage_layers):
            moe_layers = self._stage_moe[index]
            mix = (layers, moe_layers)
            body = by_mix.get(mix)
            if body is None:
                body = _Acc(ops={} if ops is not None else None, launch_scale=launch_scale)
                self._layers(body, batch, layers - moe_layers, moe=False,
                             decode_attention=decode_attention)
                if moe_layers:
                    self._layers(body, batch, moe_layers, moe=True,
                                 decode_attention=decode_attention)
                by_mix[mix] = body
            acc = _Acc(body.compute, body.memory, body.comm, body.launch,
                       dict(body.ops) if body.ops is not None else None, launch_scale)
            if index == last:
                self._lm_head(acc, batch)
            if index < last and self.links.pp is not None:
                acc.add_comm(p2p_time(batch.tokens * self.model.hidden_size * self._hb,
                                      self.links.pp), "pp_p2p")
            acc.launch *= launch_scale
            if ops is not None and acc.ops is not None:
                for label, seconds in acc.ops.items():
                    ops[label] = ops.get(label, 0.0) + seconds
            stages.append(acc.total)
            total.compute += acc.compute
            total.memory += acc.memory
            total.comm += acc.comm
            total.launch += acc.launch
        seconds = float(hm.step_seconds(sum(stages), host))
        return StepCost(
            seconds,
            tuple(stages),
            total.compute,
            total.memory,
            total.comm,
            total.launch + seconds - sum(stages),
        )


def fitted_attention_time(device: DeviceProfile, engine: str, dtype: str, batch: BatchShape, *,
                          num_heads: int, num_kv_heads: int,
                          head_dim: int) -> tuple[float, float] | None:
    """(compute, memory) seconds of one layer's GQA attention of ``batch`` on one device, as
    the step model prices ``engine``'s attention on its fitted curves for ``device``
    (:meth:`OperatorPricing.attention_seconds` of an instance of one layer with these heads
    per device, the K/V cache at ``dtype``); None where the device carries no fit for the
    kernel the batch runs (prefill if it has prefill chunks, else decode)."""
    if not device.operators or engine not in device.operators:
        return None
    model = ModelConfig(name="attention", num_layers=1, hidden_size=num_heads * head_dim,
                        num_attention_heads=num_heads, num_kv_heads=num_kv_heads,
                        head_dim=head_dim, intermediate_size=1, vocab_size=1,
                        max_context_tokens=1 << 30)
    instance = InstanceCostModel(model, device, precisions=Precisions(dtype, dtype, dtype),
                                 engine=engine, fitted=True)
    label = "attention_prefill" if batch.prefill_tokens else "attention_decode"
    if label not in instance._fits:
        return None
    compute, memory, _ = instance.attention_seconds(batch)
    return compute, memory
