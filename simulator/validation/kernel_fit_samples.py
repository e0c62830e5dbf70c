"""Measured operator samples for :mod:`simulator.validation.kernel_fit`.

Each reader turns one of NVIDIA AIConfigurator's per-operator tables (``gemm_perf``,
``context_attention_perf``, ``generation_attention_perf``, ``moe_perf``) into the work the
roofline prices (FLOPs, bytes, parallel units, per-row work), the tile shape its wave
quantisation counts (:func:`simulator.cost.roofline.quantisation`), the measured seconds and
the leave-shapes-out mask. Nothing else in the package is opened.
"""

from __future__ import annotations

import functools
import itertools
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.cost.roofline import decode_units, kv_reread_bytes
from simulator.hardware.operator_fits import few_token_batch, tuned_moe_layout
from simulator.runner.kernel_tables import default_attention, plain_attention
from simulator.units import bytes_per_element

HOLDOUT_SHARE = 0.25
_KV = {"bfloat16": "bf16", "fp8": "fp8"}
_GEMM = {"bfloat16": ("gemm", "bf16"), "fp8": ("gemm_fp8", "fp8"), "nvfp4": ("gemm_fp4", "fp4")}


@dataclass(frozen=True)
class Samples:
    """One operator family's measurements: work, precision, time and hold-out mask."""

    op: str
    precision: str
    flops: np.ndarray
    nbytes: np.ndarray
    units: np.ndarray
    rows: np.ndarray
    seconds: np.ndarray
    held_out: np.ndarray
    source: str
    kv_rows: np.ndarray | None = None
    """Decode attention: the per-row work counted per (sequence, KV head) instead."""
    tiles: tuple[np.ndarray, ...] | None = None
    """The tile shape wave quantisation counts: ``(groups, m, n, k)`` (GEMM: 1, m, n, k;
    prefill attention: sequences, query rows, heads, KV heads, head dim, turned
    into blocks by :func:`simulator.cost.roofline.prefill_tiles`; MoE: experts hit, tokens
    per expert hit, gate+up columns, hidden size), or for decode attention ``(sequences,
    context tokens, KV heads)``."""
    head_dim: np.ndarray | None = None
    """Attention: the head dimension of each shape (``OperatorFit.head_dim_exp``). Decode
    attention is offered the exponent only once it has chosen its other terms
    (:func:`simulator.validation.kernel_fit.fit_family`), and keeps it where its training
    shapes improve. (Offered in every decode choice instead, it had scored vLLM's H100
    decode 8.2 -> 9.3 % held out.)"""
    group: np.ndarray | None = None
    """Decode attention: query heads per KV head (``OperatorFit.group_limit``)."""
    kv_bytes: np.ndarray | None = None
    """Decode attention: the KV-cache part of ``nbytes`` (``OperatorFit.group_reread``);
    prefill attention: its K/V re-read (``OperatorFit.kv_reread_share``)."""
    footprint: np.ndarray | None = None
    """The bytes one timed replay touches once each (attention: KV cache, queries, outputs;
    GEMM: every copy's operands, :data:`GEMM_COPIES`; MoE: the hit experts' weights and the
    activations, the collectors replaying one set of expert weights), which a warm L2 holds
    between the collector's back-to-back replays where they fit (``OperatorFit.l2_speedup``;
    :func:`simulator.validation.kernel_fit_predict.warm_share`)."""
    heads: np.ndarray | None = None
    """MLA decode attention: query heads per sequence on the timed rank
    (``OperatorFit.head_tile``)."""
    remote: np.ndarray | None = None
    """MoE: the routed token slots whose expert is not on the timed rank
    (``OperatorFit.remote_slots``)."""
    routing: str = ""
    """MoE: the load of the timed rank the samples are priced with
    (:data:`simulator.validation.kernel_fit.MOE_ROUTINGS`; ``per_layout``: each model layout
    its own, :func:`mixed_routing`)."""
    layout: np.ndarray | None = None
    """MoE: the model layout of each row (``hidden/inter/topk/experts``), the unit the
    collector was run per (:func:`mixed_routing`)."""
    kv_written: np.ndarray | None = None
    """Prefill attention (not MLA): the elements of K and V the timed forward stores into
    the KV cache, ``2 x KV heads x head dim`` per prompt token (``OperatorFit.kv_write_ps``)."""
    batch: tuple[np.ndarray, np.ndarray] | None = None
    """MoE: the tokens handed to the kernel (the whole batch; with the ``rank0_clamped`` load
    the tokens with a slot on the timed rank) and each token's routed slots (top-k), the
    expanded space of ``OperatorFit.expanded_block_ns``."""

    @property
    def prefill(self) -> bool:
        return self.op.startswith("attention_prefill")

    @property
    def decode(self) -> bool:
        return self.op.startswith("attention_decode")


def _held_out(keys: pd.Series) -> np.ndarray:
    """Stable per-shape split: crc32 of the shape key, a quarter of the distinct keys."""
    codes = {k: zlib.crc32(k.encode()) % 1000 < HOLDOUT_SHARE * 1000 for k in keys.unique()}
    return keys.map(codes).to_numpy(bool)


GEMM_COPIES = {"vllm": 6, "sglang": 6, "trtllm": 5}
"""Copies of a GEMM's operands the collector cycles through in one timed replay, so that
repeated calls span more than the L2 (ai-dynamo/aiconfigurator collector/vllm/collect_gemm.py
and collector/sglang/collect_gemm.py: ``outside_loop_count = 6`` GEMMs;
collector/trtllm/collect_gemm.py: ``max(1, min(5, ceil(L2 / weight bytes)))`` copies, whose
weights fill the L2 exactly where five of them do not fit it, so five classify every shape
alike). A GEMM whose copies fit the L2 together still runs warm (:attr:`Samples.footprint`,
:func:`gemm_footprint`)."""


def gemm_footprint(engine: str | None, precision: str, m: np.ndarray, n: np.ndarray,
                   k: np.ndarray) -> np.ndarray | None:
    """Bytes one timed replay of a GEMM table's shape touches (None: engine unknown).

    The collectors pass every copy the same BF16 input in vLLM and TensorRT-LLM
    (``op.forward(x)`` for each of the :data:`GEMM_COPIES` layers, each with its own
    weight), and build a whole GEMM per copy in SGLang (``create_gemm``: its own input,
    weight and, for FP8, quantised input), so a large batch's input counts once in the first
    two and per copy in SGLang. A low-precision GEMM also quantises its input (one buffer of
    the input's elements, freed and reused call after call), and each call's output reuses
    the previous call's freed block."""
    copies = GEMM_COPIES.get(engine or "")
    if copies is None:
        return None
    b = bytes_per_element(precision)
    weight = n * k * b
    inputs = m * k * 2.0 + (m * k * b if precision != "bf16" else 0.0)
    out = m * n * 2.0
    if engine == "sglang":
        return copies * (inputs + weight) + out
    return inputs + copies * weight + out


def gemm_samples(folder: Path) -> list[Samples]:
    """BF16, FP8 and NVFP4 GEMMs of one engine's ``gemm_perf`` table
    (``.../gemm/<engine>/<version>``)."""
    g = pd.read_parquet(folder / "gemm_perf.parquet")
    engine = folder.parent.name
    out = []
    for dtype, (op, precision) in _GEMM.items():
        part = g[g["gemm_dtype"] == dtype]
        if part.empty:
            continue
        part = part.groupby(["m", "n", "k"])["latency"].min().reset_index()
        m, n, k = (part[c].to_numpy(float) for c in ("m", "n", "k"))
        b = bytes_per_element(precision)
        nbytes = (m * k + k * n) * b + m * n * 2.0
        keys = part["n"].astype(str) + "x" + part["k"].astype(str)
        out.append(Samples(op, precision, 2 * m * n * k, nbytes, m, m * k,
                           part["latency"].to_numpy(float) * 1e-3, _held_out(keys),
                           f"{folder}/gemm_perf.parquet ({dtype})",
                           tiles=(np.ones_like(m), m, n, k),
                           footprint=gemm_footprint(engine, precision, m, n, k)))
    return out


DECODE_PATH_KERNELS: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm_flashinfer_fidecode", "vllm_flashinfer_trtllmdecode")}
"""Per engine, the decode kernels (the tables' ``kernel_source``) its prefill tables time their
1-token prompts on, which a prefill family may leave out (``attention_samples``'s
``decode_path``; :func:`simulator.validation.kernel_fit.fit_device` fits both and keeps the one
that prices the prefill kernel's own training rows better): vLLM's FlashInfer backend runs every
request of at most ``reorder_batch_threshold`` (1) query tokens down its decode path
(vllm-project/vllm ``vllm/v1/attention/backends/flashinfer.py``,
``FlashInferMetadataBuilder.reorder_batch_threshold = 1``, ``split_decodes_and_prefills``), so
the ``context_attention_perf`` rows of ``isl`` 1 on L40S (FP8 KV, ``vllm_flashinfer_fidecode``)
and B200 / GB200 (``vllm_flashinfer_trtllmdecode``) time the decode kernel, not the prefill
kernel the fit prices (the B200 FP8-KV prefill fit priced them +21 to +24 % too slow at 1 to 8
sequences)."""


def attention_samples(folder: Path, split_kv: bool = True,
                      decode_path: bool = True) -> list[Samples]:
    """Prefill and decode attention; with ``split_kv`` the shapes over an FP8 KV cache are a
    family of their own (``attention_*_kv_fp8``). Without ``decode_path`` the prefill rows the
    engine runs on its decode kernel (:data:`DECODE_PATH_KERNELS`) are left out."""
    out = []
    for name, op in (("context_attention_perf.parquet", "attention_prefill"),
                     ("generation_attention_perf.parquet", "attention_decode")):
        if not (folder / name).is_file():
            continue
        # .../systems/data/<system>/attention/<engine>/<version>: the engine's default kernels
        a = default_attention(plain_attention(pd.read_parquet(folder / name)),
                              folder.parent.name, folder.parents[2].name)
        if op == "attention_prefill" and not decode_path and "kernel_source" in a:
            a = a[~a["kernel_source"].isin(DECODE_PATH_KERNELS.get(folder.parent.name, ()))]
        a = a[a["kv_cache_dtype"].isin(_KV)]
        shape = ["batch_size", "isl", "step", "num_heads", "num_key_value_heads", "head_dim",
                 "kv_cache_dtype"]
        a = a.groupby(shape)["latency"].min().reset_index()
        batch, isl, step, heads, kvh, hd = (a[c].to_numpy(float) for c in shape[:6])
        kvb = a["kv_cache_dtype"].map({"bfloat16": 2.0, "fp8": 1.0}).to_numpy(float)
        tiles: tuple[np.ndarray, ...]
        written = None
        if op == "attention_prefill":
            written = batch * isl * 2 * kvh * hd
            pairs = isl * (isl + 1) / 2
            flops = 4 * heads * hd * pairs * batch
            nbytes = batch * isl * (2 * kvh * hd * kvb + 2 * heads * hd * 2)
            kv_bytes = kv_reread_bytes(batch * pairs, kvh * 2 * hd * kvb)
            footprint = nbytes
            nbytes = nbytes + kv_bytes
            units, rows = batch * heads, batch * isl * heads
            tiles = (batch, isl, heads, kvh, hd)
        else:
            kv = isl + step
            flops = 4 * heads * hd * kv * batch
            kv_bytes = batch * kv * 2 * kvh * hd * kvb
            nbytes = kv_bytes + batch * 2 * heads * hd * 2
            footprint = nbytes
            units, rows = decode_units(batch, batch * kv, kvh), batch * heads
            tiles = (batch, batch * kv, kvh)
        keys = (a["num_heads"].astype(str) + "/" + a["num_key_value_heads"].astype(str) + "/"
                + a["head_dim"].astype(str))
        whole = Samples(op, "bf16", flops, nbytes, units, rows, a["latency"].to_numpy(float) * 1e-3,
                        _held_out(keys), f"{folder}/{name}",
                        batch * kvh if op == "attention_decode" else None, tiles,
                        hd, heads / kvh if op == "attention_decode" else None, kv_bytes,
                        footprint, kv_written=written)
        if not split_kv:
            out.append(whole)
            continue
        fp8 = a["kv_cache_dtype"].to_numpy() == "fp8"
        for mask, suffix in ((~fp8, ""), (fp8, "_kv_fp8")):
            if mask.any():
                out.append(_subset(whole, mask, op + suffix))
    return out


MLA_LAYOUT = {"kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
              "v_head_dim": 128, "head_dim": 128}
"""The multi-head latent attention layout the MLA tables time: DeepSeek-V3's (its 128 query
heads split over ``tp_size``, the table's ``num_heads`` being one rank's), as AIConfigurator's
collector builds the layer (ai-dynamo/aiconfigurator collector/trtllm/collect_mla.py:
``kv_lora_rank`` 512, ``qk_nope_head_dim`` 128, ``qk_rope_head_dim`` 64, ``v_head_dim`` 128;
prefill runs the heads as plain multi-head attention, decode attends over the 576-wide
latent, one KV head); ``head_dim`` is the catalog's DeepSeek-V3 entry."""


def mla_samples(folder: Path) -> list[Samples]:
    """Prefill and decode MLA (``context_mla_perf``, ``generation_mla_perf``), each over a
    BF16 and, where measured, an FP8 KV cache (``attention_*_mla`` and ``*_mla_kv_fp8``).

    The work is what the step model prices for an MLA layer on one rank
    (:meth:`simulator.cost.step.InstanceCostModel._attention_constants`): decode FLOPs
    ``2 * heads * (2 * kv_lora_rank + qk_rope_head_dim)`` per context token and the latent
    read once for all heads; prefill FLOPs ``2 * heads * (qk_nope + qk_rope + v)`` per causal
    (query, key) pair, the latent written once per token; plus each token's query and output.
    Decode parallel units are (sequence, split) pairs over the one latent head."""
    out = []
    lay = MLA_LAYOUT
    latent = lay["kv_lora_rank"] + lay["qk_rope_head_dim"]
    io = lay["qk_nope_head_dim"] + lay["qk_rope_head_dim"] + lay["v_head_dim"]
    for name, op in (("context_mla_perf.parquet", "attention_prefill_mla"),
                     ("generation_mla_perf.parquet", "attention_decode_mla")):
        if not (folder / name).is_file():
            continue
        a = plain_attention(pd.read_parquet(folder / name))
        a = a[a["kv_cache_dtype"].isin(_KV)]
        shape = ["batch_size", "isl", "step", "num_heads", "kv_cache_dtype"]
        a = a.groupby(shape)["latency"].min().reset_index()
        batch, isl, step, heads = (a[c].to_numpy(float) for c in shape[:4])
        kvb = a["kv_cache_dtype"].map({"bfloat16": 2.0, "fp8": 1.0}).to_numpy(float)
        per_token_io = heads * io * 2.0
        kv_rows = None
        tiles: tuple[np.ndarray, ...]
        if op == "attention_prefill_mla":
            pairs = isl * (isl + 1) / 2
            flops = 2 * heads * io * pairs * batch
            nbytes = batch * isl * (latent * kvb + per_token_io)
            kv_bytes = None
            units, rows = batch * heads, batch * isl * heads
            tiles = (batch, isl, heads, heads, np.full_like(batch, lay["head_dim"]))
        else:
            kv = isl + step
            flops = 2 * heads * (2 * lay["kv_lora_rank"] + lay["qk_rope_head_dim"]) * kv * batch
            kv_bytes = batch * kv * latent * kvb
            nbytes = kv_bytes + batch * per_token_io
            ones = np.ones_like(batch)
            units, rows, kv_rows = decode_units(batch, batch * kv, ones), batch * heads, batch
            tiles = (batch, batch * kv, ones)
        # The layout key of the GQA families (query heads / KV heads / head dimension):
        # prefill runs ``heads`` heads of width qk_nope + qk_rope, decode one latent head.
        width = (f"/{lay['qk_nope_head_dim'] + lay['qk_rope_head_dim']}"
                 if op == "attention_prefill_mla" else f"/{latent}")
        kv_key = a["num_heads"].astype(str) if op == "attention_prefill_mla" else "1"
        keys = a["num_heads"].astype(str) + "/" + kv_key + width
        whole = Samples(op, "bf16", flops, nbytes, units, rows,
                        a["latency"].to_numpy(float) * 1e-3, _held_out(keys),
                        f"{folder}/{name}", kv_rows, tiles, kv_bytes=kv_bytes,
                        footprint=nbytes, heads=None if kv_rows is None else heads)
        fp8 = a["kv_cache_dtype"].to_numpy() == "fp8"
        for mask, suffix in ((~fp8, ""), (fp8, "_kv_fp8")):
            if mask.any():
                out.append(_subset(whole, mask, op + suffix))
    return out


def _subset(s: Samples, mask: np.ndarray, op: str) -> Samples:
    def cut(x: np.ndarray | None) -> np.ndarray | None:
        return None if x is None else x[mask]
    tiles = None if s.tiles is None else tuple(t[mask] for t in s.tiles)
    return Samples(op, s.precision, s.flops[mask], s.nbytes[mask], s.units[mask], s.rows[mask],
                   s.seconds[mask], s.held_out[mask], f"{s.source} ({op})", cut(s.kv_rows),
                   tiles, cut(s.head_dim), cut(s.group), cut(s.kv_bytes), cut(s.footprint),
                   heads=cut(s.heads), remote=cut(s.remote),
                   routing=s.routing, layout=cut(s.layout), kv_written=cut(s.kv_written))


NON_GATED_LAYOUTS = ((22, 512, None, None), (6, 128, 2688, 1856))
"""``(topk, experts, hidden, inter)`` (``None``: any) of the non-gated MoE layouts in the
tables: NVIDIA Nemotron-3 Nano / Super / Ultra (relu^2 experts, up and down projections only)
and their latent-dimension variants, as AIConfigurator's collector lists them
(ai-dynamo/aiconfigurator collector/cases/models/NemotronHForCausalLM_cases.yaml; its
collector/sglang/collect_moe.py runs them with the relu^2 activation,
``_NON_GATED_MOE_MODEL_PATTERNS``)."""


def gated_moe(mo: pd.DataFrame) -> pd.DataFrame:
    """The rows of a ``moe_perf`` table that time gated (SwiGLU, three-matrix) experts.

    The MoE families are fitted on these only: the step model prices gated experts (the
    catalog's MoE models: Mixtral, DeepSeek, Qwen3 MoE, ...), and the engines run non-gated
    ones with other kernels (SGLang 0.5.x on Hopper: FlashInfer's CUTLASS MoE,
    ``sglang_flashinfer_cutlass_moe``, a median 2.4x slower than the curve fitted mostly
    on the Triton kernel; TensorRT-LLM: ``moe_torch_flow_nongated``). Priced as two-matrix experts on the
    gated curve they were no better (H100 SGLang held-out 24.6 -> 27.7 %).
    """
    non_gated = mo["kernel_source"].astype(str).str.contains("nongated")
    for topk, experts, hidden, inter in NON_GATED_LAYOUTS:
        hit = (mo["topk"] == topk) & (mo["num_experts"] == experts)
        if hidden is not None:
            hit &= (mo["hidden_size"] == hidden) & (mo["inter_size"] == inter)
        non_gated |= hit
    return mo[~non_gated]


def balanced_rank0_load(tokens: np.ndarray, experts: np.ndarray, topk: np.ndarray,
                        ep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(experts hit, token slots)`` of EP rank 0 under AIConfigurator's balanced routing.

    The collector's ``balanced`` rows route token ``t``'s ``i``-th choice to expert
    ``(t + i * stride) % E``, ``stride = ceil(E / topk)``, or with fewer tokens than
    ``stride`` to ``floor(t * stride / tokens + i * stride) % E`` (ai-dynamo/aiconfigurator
    collector/helper.py ``balanced_logits``), and times one rank holding the first ``E / ep``
    experts: the routing of every token is built over the model's experts and the module keeps
    rank 0's expert map (collector/vllm/collect_moe.py, collector/trtllm/collect_moe.py: the
    fused MoE module built with the EP mapping of rank 0). The timed rank therefore always
    holds at least one hit expert with at least one token, and with few tokens every hit
    expert is a distinct one: ``min(E, tokens x topk)`` experts in all rather than the
    expectation under random routing, ``E x (1 - (1 - topk / E) ** tokens)``.
    """
    out = [_rank0_load(int(t), int(e), int(k), int(p))
           for t, e, k, p in zip(tokens, experts, topk, ep, strict=True)]
    load = np.array(out, dtype=float).reshape(-1, 2)
    return load[:, 0], load[:, 1]


GROUPED_ROUTING: dict[tuple[int, int, int, int], tuple[int, int]] = {(7168, 2048, 8, 256): (8, 4)}
"""``(hidden, intermediate, topk, experts)`` of the MoE layouts whose router limits each
token to ``topk_group`` of ``n_group`` expert groups, and those two numbers: DeepSeek-V3
(``n_group`` 8, ``topk_group`` 4 in its Hugging Face config; ai-dynamo/aiconfigurator
``collector/cases/models/DeepseekV3ForCausalLM_cases.yaml`` runs its cases with them). Where
the fused MoE routes inside the kernel (:data:`ROUTING_KERNELS`) the collector's balanced
logits pass through that routing (:func:`balanced_rank0_grouped_load`)."""
ROUTING_KERNELS = ("_flashinfer_trtllm",)
"""MoE families (the suffixes of :data:`simulator.validation.kernel_fit.MOE_KERNEL_FAMILIES`)
whose kernel routes the router logits itself, with the model's routing method: FlashInfer's
TensorRT-LLM-gen fused MoE, which SGLang's collector hands every token's logits over all
experts (ai-dynamo/aiconfigurator collector/sglang/collect_moe.py, the FusedMoE path of the
``flashinfer_trtllm`` backend, the ``TopK`` layer built with ``num_expert_group`` and
``topk_group``)."""


def balanced_rank0_grouped_load(tokens: np.ndarray, experts: np.ndarray, topk: np.ndarray,
                                ep: np.ndarray, groups: tuple[int, int]
                                ) -> tuple[np.ndarray, np.ndarray]:
    """``(experts hit, token slots)`` of EP rank 0 when the collector's balanced logits
    (:func:`balanced_rank0_load`) pass through a group-limited router (``groups``:
    ``(n_group, topk_group)``, :data:`GROUPED_ROUTING`). The balanced logits give each token
    ``topk`` equal high scores ``ceil(E / topk)`` experts apart and every other expert one
    equal low score, so with DeepSeek-V3's 256 experts in 8 groups of 32 each group holds one
    high expert and all groups score alike: the router keeps ``topk_group`` groups and takes
    their high experts and, for the rest of the ``topk`` slots, low ones, all ties going to
    the lower index (groups 0-3, and experts 0-3 on almost every token). That is the load
    SGLang 0.5.14's B200 table shows for DeepSeek-V3 on FlashInfer's TensorRT-LLM MoE: at
    16,384 tokens and TP 1, EP 2 takes the time of EP 1 (12.27 against 12.26 ms: every slot
    on the first 128 experts) and EP 4 0.77 of it (this load: 0.75), EP 64 0.54 (0.50)."""
    out = [_rank0_load(int(t), int(e), int(k), int(p), groups=groups)
           for t, e, k, p in zip(tokens, experts, topk, ep, strict=True)]
    load = np.array(out, dtype=float).reshape(-1, 2)
    return load[:, 0], load[:, 1]


def balanced_rank0_clamped_load(tokens: np.ndarray, experts: np.ndarray, topk: np.ndarray,
                                ep: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(experts hit, token slots, tokens)`` of EP rank 0 under AIConfigurator's balanced
    routing (:func:`balanced_rank0_load`) as its SGLang collector times the Triton fused MoE:
    it hands the kernel only the tokens with at least one expert on rank 0, and sets each of
    their slots routed to another rank to local expert 0 with weight 0
    (ai-dynamo/aiconfigurator collector/sglang/collect_moe.py, ``build_rank0_workloads`` and
    ``benchmark_config``: ``topk_ids.clamp(min=0)``, because the kernel indexes the weights
    by expert id unmasked). Every slot of those tokens is therefore a GEMM row on the rank,
    the other ranks' on expert 0. The engine itself runs no such rows (its kernel gives a
    slot of another rank's expert a block that writes zeros, ``OperatorFit.remote_slots``);
    only the samples carry them."""
    out = [_rank0_load(int(t), int(e), int(k), int(p), clamped=True)
           for t, e, k, p in zip(tokens, experts, topk, ep, strict=True)]
    load = np.array(out, dtype=float).reshape(-1, 3)
    return load[:, 0], load[:, 1], load[:, 2]


@functools.cache
def _rank0_load(tokens: int, experts: int, topk: int, ep: int, clamped: bool = False,
                groups: tuple[int, int] = (0, 0)) -> tuple[int, ...]:
    stride = math.ceil(experts / topk)
    t = np.arange(tokens, dtype=float)[:, None]
    i = np.arange(topk, dtype=float)[None, :]
    offset = t if tokens >= stride else np.floor(t * stride / tokens)
    chosen = (offset + i * stride).astype(np.int64) % experts
    if groups[0]:  # a group-limited router: the top groups by their best two, then experts
        n_group, keep = groups
        score = np.zeros((tokens, experts))
        np.put_along_axis(score, chosen, 1.0, axis=1)
        best_two = np.sort(score.reshape(tokens, n_group, -1), axis=2)[:, :, -2:].sum(axis=2)
        kept = np.zeros((tokens, n_group), dtype=bool)
        np.put_along_axis(kept, np.argsort(-best_two, axis=1, kind="stable")[:, :keep], True,
                          axis=1)
        allowed = np.repeat(kept, experts // n_group, axis=1)
        chosen = np.argsort(np.where(allowed, -score, np.inf), axis=1, kind="stable")[:, :topk]
    # A token's choices are distinct experts (they are stride apart), so no slot is lost.
    local = chosen < experts // ep
    counts = np.bincount(chosen[local], minlength=experts // ep)
    if not clamped:
        return int((counts > 0).sum()), int(counts.sum())
    timed = local.any(axis=1)
    counts[0] += int((~local[timed]).sum())
    return int((counts > 0).sum()), int(timed.sum()) * topk, int(timed.sum())


def moe_samples(folder: Path, routing: str = "expected",
                kernels: dict[str, str] | None = None,
                tuned: frozenset[tuple[int, int]] | None = None,
                fp8_dtype: str = "fp8") -> list[Samples]:
    """Gated MoE layers (:func:`gated_moe`) under balanced routing, BF16 and FP8.

    ``routing``: the load of the timed EP rank. ``expected``: the step model's, each token's
    experts drawn at random (experts hit ``E / ep x (1 - (1 - topk / E) ** tokens)``, token
    slots ``tokens x topk / ep``); ``rank0``: the collector's balanced routing on rank 0
    (:func:`balanced_rank0_load`). ``kernels``: ``kernel_source`` -> suffix; those rows form
    families of their own (``moe`` / ``moe_fp8`` + suffix), the others keep ``moe`` /
    ``moe_fp8`` (:data:`simulator.validation.kernel_fit.MOE_KERNEL_FAMILIES`). ``tuned``: the
    ``(experts per rank, intermediate size per rank)`` layouts the engine runs with a tuned
    kernel configuration (:data:`simulator.hardware.operator_fits.SGLANG_TUNED_MOE_CONFIGS`);
    their BF16 rows outside those kernels form the ``moe_tuned`` family. Given (even empty),
    the engine's other BF16 Triton rows run its default configuration, whose blocks change
    with the batch: those of at most as many tokens as the rank has experts form
    ``moe_few_tokens`` (:func:`simulator.hardware.operator_fits.moe_fit_labels`).
    ``fp8_dtype``: the table's ``moe_dtype`` of the FP8 experts the engine runs (SGLang's
    tables time block-scaled FP8, ``fp8_block``; the others per-tensor ``fp8``)."""
    path = folder / "moe_perf.parquet"
    if not path.is_file():
        return []
    mo = gated_moe(pd.read_parquet(path))
    mo = mo[(mo["distribution"] == "balanced") & mo["moe_dtype"].isin(["bfloat16", fp8_dtype])]
    family = pd.Series("", index=mo.index)
    for source, suffix in (kernels or {}).items():
        family[mo["kernel_source"] == source] = suffix
    if tuned is not None:  # the engine's rule, as the step model applies it (moe_fit_labels)
        per_rank = mo["num_experts"] / mo["moe_ep_size"]
        triton = (mo["moe_dtype"] == "bfloat16") & (family == "")
        hit = triton & pd.Series([tuned_moe_layout(tuned, e, n) for e, n in zip(
            per_rank, mo["inter_size"] / mo["moe_tp_size"], strict=True)], index=mo.index)
        family[hit] = "_tuned"
        family[triton & ~hit & few_token_batch(mo["num_tokens"], per_rank)] = "_few_tokens"
    mo = mo.assign(family=family)
    shape = ["num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
             "moe_ep_size", "moe_dtype", "family"]
    mo = mo.groupby(shape)["latency"].min().reset_index()
    out = []
    for (dtype, precision), suffix in itertools.product(
            (("bfloat16", "bf16"), (fp8_dtype, "fp8")),
            ("", *sorted(set((kernels or {}).values())
                         | ({"_few_tokens", "_tuned"} if tuned is not None else set())))):
        p = mo[(mo["moe_dtype"] == dtype) & (mo["family"] == suffix)]
        if p.empty:
            continue
        tokens, h, inter, topk, experts, tp, ep = (p[c].to_numpy(float) for c in shape[:7])
        expert = 3 * h * inter / tp
        rows, remote = tokens * h, tokens * topk
        if routing == "rank0":
            touched, tokens_here = balanced_rank0_load(tokens, experts, topk, ep)
            if suffix in ROUTING_KERNELS:  # the kernel's own router, group-limited layouts
                for key, groups in GROUPED_ROUTING.items():
                    rows_of = ((h == key[0]) & (inter == key[1]) & (topk == key[2])
                               & (experts == key[3]))
                    if rows_of.any():
                        touched[rows_of], tokens_here[rows_of] = balanced_rank0_grouped_load(
                            tokens[rows_of], experts[rows_of], topk[rows_of], ep[rows_of],
                            groups)
        elif routing == "rank0_clamped":
            touched, tokens_here, timed = balanced_rank0_clamped_load(tokens, experts, topk, ep)
            rows, remote = timed * h, None
        else:
            p_hit = 1.0 - (1.0 - topk / experts) ** tokens
            touched, tokens_here = experts / ep * p_hit, tokens * topk / ep
        flops = 2 * tokens_here * expert
        nbytes = (touched * expert * bytes_per_element(precision)
                  + tokens_here * (2 * h + 2 * inter / tp) * 2)
        keys = p[shape[1:7]].astype(str).agg("/".join, axis=1)
        op = ("moe" if precision == "bf16" else "moe_fp8") + suffix
        out.append(Samples(op, precision, flops,
                           nbytes, tokens_here, rows, p["latency"].to_numpy(float) * 1e-3,
                           _held_out(keys), f"{path} ({dtype}, balanced, {routing} load)",
                           tiles=(touched, tokens_here / np.maximum(touched, 1e-9),
                                  2 * inter / tp, h),
                           remote=None if remote is None else np.maximum(remote - tokens_here, 0.0),
                           footprint=nbytes, routing=routing,
                           layout=p[shape[1:5]].astype(str).agg("/".join, axis=1).to_numpy(),
                           batch=(rows / h, topk)))
    return out


def mixed_routing(loads: dict[str, Samples], choice: dict[str, str], default: str) -> Samples:
    """One MoE family's samples with each model layout priced with its own load of the timed
    rank: ``loads`` are the family's samples under each routing of
    :func:`moe_samples` (same rows, same order), ``choice`` maps a layout
    (:attr:`Samples.layout`) to the routing its rows take, ``default`` the routing of the
    layouts not in it. A row of a load without the other ranks' slots
    (``rank0_clamped``) carries none (0)."""
    ref = loads[default]
    assert ref.layout is not None
    assert ref.tiles is not None
    picks = {r: np.array([choice.get(str(k), default) == r for k in ref.layout]) for r in loads}

    def pick(name: str) -> np.ndarray:
        out = np.zeros_like(ref.seconds)
        for r, s in loads.items():
            a = getattr(s, name)
            if a is not None:
                out = np.where(picks[r], a, out)
        return out

    tiles = tuple(np.select([picks[r] for r in loads], [s.tiles[i] for s in loads.values()
                                                        if s.tiles is not None])
                  for i in range(len(ref.tiles)))
    batch = None
    if all(s.batch is not None for s in loads.values()):
        batch = tuple(np.select([picks[r] for r in loads], [s.batch[i] for s in loads.values()
                                                            if s.batch is not None])
                      for i in range(2))
    footprint = (pick("footprint") if all(s.footprint is not None for s in loads.values())
                 else None)
    return Samples(ref.op, ref.precision, pick("flops"), pick("nbytes"), pick("units"),
                   pick("rows"), ref.seconds, ref.held_out, f"{ref.source} (per-layout load)",
                   tiles=tiles, remote=pick("remote"), footprint=footprint, routing="per_layout",
                   layout=ref.layout, batch=batch)  # type: ignore[arg-type]
