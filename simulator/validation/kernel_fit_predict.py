"""Predictions and scores of fitted operator constants on measured samples
(:mod:`simulator.validation.kernel_fit`): the work each fit prices a measured shape with, and
the held-out errors the Operators tables of docs/VALIDATION.md report."""

from __future__ import annotations

from typing import Any

import numpy as np

from simulator.cost.roofline import (
    DECODE_SPLIT_TOKENS,
    causal_quantisation,
    causal_share,
    decode_units,
    op_time,
    prefill_tiles,
    quantisation,
    whole_context_quantisation,
)
from simulator.hardware.operator_fits import (
    HEAD_DIM_REF,
    WHOLE_CONTEXT,
    OperatorFit,
    expanded_activation_blocks,
    key_tile_extra,
)
from simulator.hardware.profiles import DeviceProfile
from simulator.units import bytes_per_element
from simulator.validation.kernel_fit_comm import _ape
from simulator.validation.kernel_fit_samples import Samples

__all__ = ["both_kv_row", "causal_shares", "evaluate", "expert_streamed", "extra_floor", "flops",
           "predict", "tile_label", "time_weighted_median", "training_ape",
           "training_time_score", "warm_share"]


def _work(samples: Samples, fitted: OperatorFit, device: DeviceProfile,
          idx: np.ndarray) -> tuple[np.ndarray, Any]:
    """Parallel units and the tile/wave FLOPs multiplier of ``samples[idx]`` under
    ``fitted`` (decode attention: its split-KV partition also sets the units, and above
    its group limit the blocks are per query head, :meth:`OperatorFit.decode_group`)."""
    grouped = samples.decode and fitted.group_limit and samples.group is not None
    if (not fitted.tile_m and not grouped) or samples.tiles is None:
        return samples.units[idx], 1.0
    shape = tuple(a[idx] for a in samples.tiles)
    units = samples.units[idx]
    if fitted.head_tile and samples.heads is not None:  # blocks per (sequence, head tile)
        seqs, ctx = shape[0], shape[1]
        tiles = fitted.head_blocks(samples.heads[idx])[0]
        # Each measured shape is ``seqs`` sequences of equal context.
        return (decode_units(seqs, ctx, tiles, fitted.tile_m),
                whole_context_quantisation(tiles, ctx, ctx / seqs,
                                           fitted.resident_blocks or device.sm_count))
    if samples.prefill:
        seqs, rows, heads, kv_heads, head_dim = shape
        shape = prefill_tiles(seqs, rows, heads, kv_heads, head_dim, fitted.pack_gqa)
    share = causal_shares(samples, fitted, device, idx)
    if samples.decode:
        if grouped:
            assert samples.group is not None
            shape = (shape[0], shape[1], shape[2] * fitted.decode_group(samples.group[idx])[0])
        units = decode_units(shape[0], shape[1], shape[2], fitted.tile_m or DECODE_SPLIT_TOKENS)
    quant = quantisation(fitted, shape, device.sm_count, samples.decode)
    if share is not None:
        quant = causal_quantisation(quant, share, fitted.causal_tail)
    return units, quant


def causal_shares(samples: Samples, fitted: OperatorFit, device: DeviceProfile,
                  idx: np.ndarray) -> np.ndarray | None:
    """The longest tile's share of prefill attention (:func:`causal_share`) for a fit with
    ``causal_tail``, else ``None``: each measured shape is ``sequences`` prompts of ``rows``
    tokens, no cached context."""
    if not (samples.prefill and fitted.causal_tail and fitted.tile_m) or samples.tiles is None:
        return None
    assert device.sm_count is not None
    seqs, rows, heads = (samples.tiles[i][idx] for i in range(3))
    return np.asarray(causal_share(device.sm_count, fitted.tile_m, heads, rows, rows,
                                   seqs * rows * (rows + 1) / 2))


def flops(samples: Samples, fitted: OperatorFit, idx: np.ndarray) -> np.ndarray:
    """FLOPs of ``samples[idx]`` under ``fitted``: MLA decode attention's heads padded to
    whole query-row tiles (``OperatorFit.head_tile``); prefill attention's whole key blocks
    (``OperatorFit.key_tiles``: each measured shape is ``sequences`` prompts of ``rows``
    tokens, 4 FLOPs per head dimension of each query-key pair; a kernel that packs GQA holds
    the query heads of its tokens in a block's rows, :func:`key_tile_extra`)."""
    if fitted.head_tile and samples.heads is not None:
        return samples.flops[idx] * fitted.head_blocks(samples.heads[idx])[1]
    if fitted.key_tiles and samples.prefill and samples.tiles is not None:
        seqs, rows, heads, kv_heads, head_dim = (a[idx] for a in samples.tiles)
        group = heads / kv_heads  # query heads per KV head: a packing kernel's block rows
        keys = {(d, g): key_tile_extra(fitted.key_tiles, d, g)
                for d, g in set(zip(head_dim.tolist(), group.tolist(), strict=True))}
        extra = np.array([keys[d, g] for d, g in zip(head_dim.tolist(), group.tolist(),
                                                     strict=True)])
        return samples.flops[idx] + 4.0 * heads * head_dim * seqs * rows * extra
    return samples.flops[idx]


def _bytes_rows(samples: Samples, fitted: OperatorFit,
                idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bytes and per-row work of ``samples[idx]`` under ``fitted``: decode attention outside
    its grouped kernel re-reads KV per query head and has a block per query head
    (:meth:`OperatorFit.decode_group`; ``samples`` then count rows per KV head); a MoE
    kernel that writes every routed slot adds the other ranks' slots
    (:attr:`OperatorFit.remote_slots`), one whose routing kernels run apart from its GEMMs
    their elements per slot on the rank (:attr:`OperatorFit.slot_kernels`); MLA decode
    attention in a split-KV kernel's head blocks adds each (sequence, head block)'s rows
    (:meth:`OperatorFit.block_rows`; decode tiles: sequences first) and its latent re-read
    per further head block (:meth:`OperatorFit.block_kv_scale`)."""
    nbytes, rows = samples.nbytes[idx], samples.rows[idx]
    if fitted.head_block and samples.heads is not None and samples.tiles is not None:
        heads = samples.heads[idx]
        if samples.kv_bytes is not None:  # each further head block re-reads the latent
            nbytes = nbytes + samples.kv_bytes[idx] * (fitted.block_kv_scale(heads) - 1.0)
        return nbytes, rows + samples.tiles[0][idx] * fitted.block_rows(heads)
    if fitted.slot_kernels and samples.tiles is not None:  # MoE units: the rank's slots
        rows = rows + fitted.slot_rows(samples.units[idx], samples.tiles[2][idx],
                                       samples.tiles[3][idx])
    if fitted.remote_slots and samples.remote is not None and samples.tiles is not None:
        return nbytes, rows + fitted.remote_rows(samples.remote[idx], samples.tiles[2][idx],
                                                 samples.tiles[3][idx])
    if samples.prefill and fitted.kv_reread_share != 1.0 and samples.kv_bytes is not None:
        return nbytes - samples.kv_bytes[idx] * (1.0 - fitted.kv_reread_share), rows
    if not (samples.decode and fitted.group_limit) or samples.group is None:
        return nbytes, rows
    assert samples.kv_bytes is not None
    kv = samples.kv_bytes[idx]
    width = samples.head_dim[idx] if samples.head_dim is not None else HEAD_DIM_REF
    _, kv_scale, row_scale = fitted.decode_group(samples.group[idx], width)
    return nbytes - kv + kv * kv_scale, rows * row_scale


def gemm_depth(samples: Samples, idx: np.ndarray) -> Any:
    """Each measured GEMM's depth ``k`` (priced at ``OperatorFit.per_k_ps``), 0 for the other
    families."""
    if samples.op.startswith("gemm") and samples.tiles is not None:
        return samples.tiles[3][idx]
    return 0.0


def kv_written(samples: Samples, idx: np.ndarray) -> Any:
    """Each measured prefill's K/V elements stored into the cache (priced at
    ``OperatorFit.kv_write_ps``), 0 for the other families."""
    return samples.kv_written[idx] if samples.kv_written is not None else 0.0


def extra_floor(samples: Samples, fitted: OperatorFit, idx: np.ndarray,
                device: DeviceProfile | None = None) -> Any:
    """Seconds added to ``fitted.seconds`` of ``samples[idx]``: decode attention outside its
    grouped kernel has a floor of its own (:meth:`OperatorFit.decode_floor`), and the
    grouped kernel's shapes that ran a separate RoPE kernel pay it
    (:meth:`OperatorFit.rope_floor`); a MoE family
    pays per expert hit on the rank (:meth:`OperatorFit.group_seconds`, the experts are the
    first of its tile dimensions) and, on ``device``, per thread-block iteration of the
    expanded-space activation kernel (:meth:`OperatorFit.expanded_seconds`; the samples'
    ``batch`` and the intermediate columns, half the third tile dimension)."""
    if samples.op.startswith("moe") and samples.tiles is not None:
        extra = fitted.group_seconds(samples.tiles[0][idx]) if fitted.per_group_ns else 0.0
        if fitted.expanded_block_ns and samples.batch is not None and device is not None:
            tokens, topk = (a[idx] for a in samples.batch)
            extra = extra + fitted.expanded_seconds(expanded_activation_blocks(
                tokens, topk, samples.tiles[2][idx] / 2.0, device.sm_count or 0))
        return extra
    if not (samples.decode and fitted.group_limit and samples.group is not None):
        return 0.0
    # The measured shapes' separate RoPE kernel (OperatorFit.rope_kernel_us): the fit's only.
    rope = (fitted.rope_floor(samples.group[idx], samples.head_dim[idx]) * 1e-6
            if fitted.rope_kernel_us and samples.head_dim is not None else 0.0)
    # FlashAttention-2's query copy (OperatorFit.q_copy_us); decode tiles: batch, _, KV heads.
    if fitted.q_copy_us and samples.tiles is not None:
        rope = rope + fitted.q_copy_floor(samples.group[idx], samples.tiles[0][idx],
                                          samples.tiles[2][idx]) * 1e-6
    if fitted.group_floor_us is None:
        return rope
    return (fitted.decode_floor(samples.group[idx]) - fitted.floor_us) * 1e-6 + rope


def expert_streamed(samples: Samples, fitted: OperatorFit, device: DeviceProfile,
                    idx: np.ndarray) -> Any:
    """The least memory seconds of a MoE family whose Triton blocks stream their weights alone
    (:meth:`OperatorFit.expert_stream_seconds`; MoE tiles: experts hit, slots per expert,
    gate+up columns, hidden), 0 for the other families and fits."""
    if not (fitted.expert_block_gbs and samples.tiles is not None
            and samples.op.startswith("moe")):
        return 0.0
    experts, slots, gate_up, hidden = (a[idx] for a in samples.tiles)
    return fitted.expert_stream_seconds(experts, slots, gate_up, hidden,
                                        bytes_per_element(samples.precision), device.sm_count)


def warm_share(samples: Samples, device: DeviceProfile, idx: np.ndarray) -> Any:
    """1 where the working set of a measured shape fits the device's L2 cache
    (``l2_cache_mb``, MiB), else 0: the collector replays the same kernel on the same
    buffers back to back (``OperatorFit.l2_speedup``), so such a working set is read from
    L2 after the first replay. 0 for families without a footprint and devices without an L2
    figure."""
    if samples.footprint is None or not device.l2_cache_mb:
        return 0.0
    return (samples.footprint[idx] <= device.l2_cache_mb * 2**20).astype(float)


def predict(samples: Samples, device: DeviceProfile, fitted: OperatorFit,
            idx: np.ndarray) -> np.ndarray:
    """Seconds ``fitted`` gives the measured shapes ``idx``."""
    units, quant = _work(samples, fitted, device, idx)
    hd = samples.head_dim[idx] if samples.head_dim is not None else None
    scale = fitted.work_scale(hd) if hd is not None else 1.0
    fscale = fitted.flops_scale(hd) if hd is not None else 1.0
    nbytes, rows = _bytes_rows(samples, fitted, idx)
    warm = warm_share(samples, device, idx) if fitted.l2_speedup != 1.0 else 0.0
    return np.asarray(fitted.seconds(device.peak_flops(samples.precision),
                                     device.memory_bandwidth, flops(samples, fitted, idx) * fscale,
                                     nbytes * scale, units, rows, quant, warm,
                                     gemm_depth(samples, idx), kv_written(samples, idx),
                                     expert_streamed(samples, fitted, device, idx))
                      + extra_floor(samples, fitted, idx, device))


def _training_errors(samples: Samples, device: DeviceProfile,
                     fitted: OperatorFit | None) -> tuple[np.ndarray, np.ndarray]:
    """APE and measured seconds of (a thinned set of) the fitted shapes; ``None``:
    device-wide constants."""
    idx = np.flatnonzero(~samples.held_out)
    idx = idx[np.linspace(0, len(idx) - 1, min(len(idx), 2000)).astype(int)]
    f, b, t = samples.flops[idx], samples.nbytes[idx], samples.seconds[idx]
    if fitted is None:
        pred = np.array([op_time(device, samples.precision, fi, bi).seconds
                         for fi, bi in zip(f, b, strict=True)])
    else:
        pred = predict(samples, device, fitted, idx)
    return _ape(pred, t), t


def training_ape(samples: Samples, device: DeviceProfile, fitted: OperatorFit | None) -> float:
    """Median APE on (a thinned set of) the fitted shapes; ``None``: device-wide constants."""
    return float(np.median(_training_errors(samples, device, fitted)[0]))


TIME_WEIGHT = 0.1
"""Weight of the time-weighted median APE in :func:`training_time_score`: small, so the
per-shape median still decides unless the time-weighted error moves ten times as much."""


def time_weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value at half of the total weight, the values taken in increasing order."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2.0)])


def training_time_score(samples: Samples, device: DeviceProfile,
                        fitted: OperatorFit | None) -> float:
    """The median APE on (a thinned set of) the fitted shapes plus :data:`TIME_WEIGHT`
    times their median APE weighted by each shape's measured time: the score a term for
    long kernels is kept by (:attr:`OperatorFit.sustained_us`).

    The plain median counts every shape once, and a GEMM table holds mostly short kernels
    (on GB200 with vLLM, 4 % of the shapes take more than 0.5 ms): a fit that prices every
    long GEMM 35 % fast can still have the best median, and a term that only acts on long
    kernels cannot lower it. An engine step sums its kernels' times, and a long prompt's
    prefill is made of long GEMMs."""
    ape, seconds = _training_errors(samples, device, fitted)
    return float(np.median(ape)) + TIME_WEIGHT * time_weighted_median(ape, seconds)


def evaluate(samples: Samples, device: DeviceProfile, fitted: OperatorFit) -> dict[str, Any]:
    ho = samples.held_out
    f, b, t = samples.flops[ho], samples.nbytes[ho], samples.seconds[ho]
    before = np.array([op_time(device, samples.precision, fi, bi).seconds
                       for fi, bi in zip(f, b, strict=True)])
    after = predict(samples, device, fitted, np.flatnonzero(ho))
    return {"op": samples.op, "held_out_rows": int(ho.sum()), "fit_rows": fitted.rows,
            "median_ape_before": round(float(np.median(_ape(before, t))), 1),
            "median_ape_after": round(float(np.median(_ape(after, t))), 1),
            "p90_ape_after": round(float(np.percentile(_ape(after, t), 90)), 1),
            "median_error_after": round(float(np.median(after / t - 1) * 100), 1),
            "tiles": tile_label(fitted)}


def tile_label(fitted: OperatorFit) -> str:
    """The fit's tile choice as the tables print it: ``128x64``, ``+split-K``, ``-`` (none)."""
    if not fitted.tile_m:
        return "-"
    size = f"{fitted.tile_m}x{fitted.tile_n}" if fitted.tile_n else f"{fitted.tile_m}"
    if fitted.tile_m == WHOLE_CONTEXT:
        size = "whole context"
    if fitted.tile_dispatch:
        size = fitted.tile_dispatch
    if fitted.moe_kernel:
        size = f"{fitted.moe_kernel} {size}"
    return (size + ("+split-K" if fitted.split_k else "") + ("+packGQA" if fitted.pack_gqa else "")
            + (f"+k0 {fitted.tile_k0}" if fitted.tile_k0 else "")
            + (f"+causal {fitted.causal_tail:g}" if fitted.causal_tail else "")
            + ("+key blocks" if fitted.key_tiles else "")
            + (f"+{fitted.head_tile}-head tiles" if fitted.head_tile else ""))


def both_kv_row(scored: dict[str, Samples], fits: dict[str, OperatorFit], base: str,
                device: DeviceProfile, engine: str) -> dict[str, Any] | None:
    """Held-out error of an attention family over BF16 and FP8 KV caches together, each
    shape priced as the step model prices it (the ``_kv_fp8`` fit, else the BF16-KV fit,
    else the device-wide constants): comparable with a fit of both on one curve."""
    parts = [(scored[op], fits.get(op) or fits.get(base)) for op in (base, base + "_kv_fp8")
             if op in scored]
    if len(parts) < 2:
        return None
    before, after = [], []
    for s, fitted in parts:
        ho = np.flatnonzero(s.held_out)
        t = s.seconds[ho]
        roof = np.array([op_time(device, s.precision, f, b).seconds
                         for f, b in zip(s.flops[ho], s.nbytes[ho], strict=True)])
        before.append(_ape(roof, t))
        after.append((predict(s, device, fitted, ho) if fitted else roof) / t - 1)
    err = np.concatenate(after)
    a = np.abs(err) * 100
    return {"device": device.name, "engine": engine, "op": base + "_all_kv", "kept": True,
            "held_out_rows": len(a), "fit_rows": sum(int((~s.held_out).sum()) for s, _ in parts),
            "median_ape_before": round(float(np.median(np.concatenate(before))), 1),
            "median_ape_after": round(float(np.median(a)), 1),
            "p90_ape_after": round(float(np.percentile(a, 90)), 1),
            "median_error_after": round(float(np.median(err) * 100), 1),
            "tiles": "both KV fits"}
