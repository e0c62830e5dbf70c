"""Data-parallel attention ranks and two-batch overlap, on top of the per-rank step model.

An instance with ``dp`` attention ranks holds all its requests, spread over the ranks by
the DP scheduler (SGLang's ``DataParallelController`` round-robin / shortest-queue,
vLLM's DP coordinator balancing queue lengths); every MoE layer is a barrier, so a step
takes as long as its busiest rank. The instance's batch is therefore priced as the
busiest rank's share: ``ceil(1/dp)`` of the sequences and of the tokens.

Two-batch overlap (SGLang ``--enable-two-batch-overlap``, ``sglang/srt/two_batch_overlap.py``;
DeepEP's receive hooks) splits a rank's batch into two micro-batches and runs one's
dispatch/combine while the other computes. With per-micro-batch compute ``C`` and
communication ``A`` summed over the layers, the layers pipeline as two stages:
``2 max(C, A)`` plus one un-hidden ``min(C, A)`` per MoE layer of fill. Its constraints:
it needs the all-to-all of data-parallel attention (nothing to hide under TP attention),
a batch that splits (two or more sequences, or a prefill of two or more tokens), and each
micro-batch streams the weights again, so a weight-bound decode step gains little or
loses. DeepEP's normal kernels (prefill) occupy SMs while they run (the README's example
``Buffer.set_num_sms(24)``, of the 132 SMs of an H100/H800), so overlapped compute runs
on the rest; the low-latency kernels (decode) receive through hooks and take no SMs.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simulator.cost.accounting import DecodeSeries, StepCost
from simulator.cost.batch import BatchShape
from simulator.cost.moe_comm import deepep_kernel

NORMAL_KERNEL_SM_SHARE = 24 / 132
"""SMs DeepEP's normal kernels hold while overlapping compute (Hopper, 24 of 132)."""

if TYPE_CHECKING:
    from simulator.cost.step import InstanceCostModel


def _share(value: float, parts: int) -> int:
    return math.ceil(value / parts)


def rank_limit(limit: int | None, dp: int) -> int | None:
    """One of ``dp`` attention ranks' share of an instance's batch limit (None: unset): the
    limit each rank's executor runs under."""
    return None if limit is None else _share(limit, dp)


def rank_batch(batch: BatchShape, dp: int) -> BatchShape:
    """The busiest of ``dp`` evenly balanced attention ranks' share of ``batch``."""
    if dp <= 1 or batch.is_empty:
        return batch
    d_seqs = _share(batch.decode_seqs, dp)
    p_seqs = _share(batch.prefill_seqs, dp)
    d_frac = d_seqs / batch.decode_seqs if batch.decode_seqs else 0.0
    p_frac = p_seqs / batch.prefill_seqs if batch.prefill_seqs else 0.0
    p_tokens = _share(batch.prefill_tokens, dp)
    t_frac = p_tokens / batch.prefill_tokens if batch.prefill_tokens else 0.0
    prefill_logits = batch.logits_seqs - batch.decode_seqs
    return BatchShape(
        prefill_tokens=p_tokens,
        prefill_seqs=p_seqs,
        prefill_attn_pairs=batch.prefill_attn_pairs * t_frac,
        prefill_kv_tokens=round(batch.prefill_kv_tokens * max(p_frac, t_frac)),
        decode_seqs=d_seqs,
        decode_ctx_tokens=round(batch.decode_ctx_tokens * d_frac),
        logits_seqs=d_seqs + _share(prefill_logits, dp),
        prefill_max_tokens=min(batch.prefill_max_tokens, p_tokens),
        decode_max_ctx=min(batch.decode_max_ctx, round(batch.decode_ctx_tokens * d_frac)),
        prefill_max_kv=min(batch.prefill_max_kv,
                           round(batch.prefill_kv_tokens * max(p_frac, t_frac))),
    )


def split_in_two(batch: BatchShape) -> BatchShape | None:
    """The larger of two micro-batches, or None when the batch does not split."""
    if batch.decode_seqs + batch.prefill_seqs < 2 and batch.prefill_tokens < 2:
        return None
    half = BatchShape(
        prefill_tokens=_share(batch.prefill_tokens, 2),
        prefill_seqs=_share(batch.prefill_seqs, 2),
        prefill_attn_pairs=batch.prefill_attn_pairs / 2,
        prefill_kv_tokens=_share(batch.prefill_kv_tokens, 2),
        decode_seqs=_share(batch.decode_seqs, 2),
        decode_ctx_tokens=_share(batch.decode_ctx_tokens, 2),
        logits_seqs=_share(batch.logits_seqs, 2),
        prefill_max_tokens=min(batch.prefill_max_tokens, _share(batch.prefill_tokens, 2)),
        decode_max_ctx=min(batch.decode_max_ctx, _share(batch.decode_ctx_tokens, 2)),
        prefill_max_kv=min(batch.prefill_max_kv, _share(batch.prefill_kv_tokens, 2)),
    )
    return half if not half.is_empty else None


def two_batch_overlap_step(cost: InstanceCostModel, batch: BatchShape,
                           moe_layers: float) -> StepCost | None:
    """The step of ``batch`` (one rank's) with two-batch overlap, or None if it cannot split."""
    half = split_in_two(batch)
    host = cost.host
    if half is None or host is None or moe_layers <= 0:
        return None
    one = cost._step(half, decode_attention=True)
    gpu_half = sum(one.stage_seconds)
    comm = one.communication_s
    compute = gpu_half - comm
    if deepep_kernel(cost.deepep_mode, extend_tokens(batch)) == "normal":
        compute /= 1.0 - NORMAL_KERNEL_SM_SHARE
    gpu = 2 * max(compute, comm) + min(compute, comm) / moe_layers
    seqs = batch.prefill_seqs + batch.decode_seqs
    graphed = host.graph_batch(batch.decode_seqs, batch.prefill_tokens) is not None
    seconds = float(host.step_seconds(gpu, host.host_s(seqs, cost.model.num_layers, graphed)))
    hidden = 2 * (compute + comm) - gpu
    return StepCost(seconds, (gpu,), 2 * one.compute_s, 2 * one.memory_s,
                    max(2 * comm - hidden, 0.0), seconds - gpu + 2 * (one.overhead_s -
                                                                      (one.seconds - gpu_half)))


def extend_tokens(b: BatchShape) -> int:
    """Prefill tokens that are not sampled: zero for decode and speculative-verify batches
    (every new token sampled), which SGLang runs on DeepEP's low-latency kernels."""
    return max(b.prefill_tokens - (b.logits_seqs - b.decode_seqs), 0)


def series_by_steps(cost: InstanceCostModel, seqs: int, ctx_sums: np.ndarray,
                    longest: np.ndarray | None = None) -> DecodeSeries:
    ctx = np.asarray(ctx_sums)
    most = np.zeros(len(ctx), dtype=np.int64) if longest is None else longest
    out = [cost.step(BatchShape.decode(seqs, int(total), int(m)))
           for total, m in zip(ctx, most, strict=True)]
    bounds = ("compute", "memory", "communication", "overhead")
    return DecodeSeries(np.array([c.seconds for c in out]),
                        np.array([bounds.index(c.bound) for c in out], dtype=np.int64),
                        np.array([c.compute_s for c in out]), np.array([c.memory_s for c in out]))
