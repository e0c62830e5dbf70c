"""Bytes of a KV hand-off between two instances, rank by rank.

Each destination rank must end up with the KV it keeps for its own attention heads of its
own pipeline stage's layers, and pulls it from a source rank that holds it. Which rank
holds what follows how serving engines shard the cache:

* GQA with ``tp <= num_kv_heads``: each rank keeps ``num_kv_heads / tp`` heads;
* GQA with ``tp > num_kv_heads``: heads are replicated, ``tp / num_kv_heads`` ranks keep
  each head (vLLM ``vllm/model_executor/layers/linear.py`` ``QKVParallelLinear``:
  ``num_kv_head_replicas``);
* MLA: one latent per token, replicated on every TP rank (vLLM
  ``vllm/v1/kv_cache_interface.py``: "for MLA we only store a single latent vector",
  on every rank), so every decode rank pulls the whole latent; vLLM-Ascend's Mooncake
  connector counts an MLA cache as one KV head replicated ``tp`` times
  (``_init_key_head_config``: ``put_step = tp_size // num_kv_head``).

The bytes a hand-off moves are therefore the KV bytes each destination rank needs, which
is more than the unique KV whenever the destination replicates (up to ``tp`` times for
MLA): every rank's NIC carries its own copy.
"""

from __future__ import annotations

from simulator.cost.parallel import Parallelism, split_layers
from simulator.models.arch import ModelConfig


def _heads(model: ModelConfig) -> int:
    return 1 if model.attention == "mla" else model.num_kv_heads


def _head_interval(rank: int, tp: int, heads: int) -> tuple[float, float]:
    if tp <= heads:
        return rank * heads / tp, (rank + 1) * heads / tp
    head = rank * heads // tp
    return float(head), float(head + 1)


def _layer_ranges(model: ModelConfig, par: Parallelism) -> list[tuple[float, float]]:
    out, start = [], 0.0
    for n in split_layers(model.num_layers, par.pp, par.balanced_stages):
        out.append((start, start + n))
        start += n
    return out


def handoff_streams(model: ModelConfig, kv_precision: str, src: Parallelism,
                    dst: Parallelism) -> list[tuple[int, int, float]]:
    """``(source rank, destination rank, bytes per prompt token)`` of every stream.

    Ranks are numbered ``stage * tp + tp_rank`` inside each instance, as placement lays
    devices out. A destination rank pulls a replicated slice from the replica whose index
    matches its own (modulo the replica count), which spreads the load over source NICs.
    """
    heads = _heads(model)
    per_layer_head = model.kv_bytes_per_token(kv_precision) / model.num_layers / heads
    # Distinct source slices and the source TP ranks that hold each one.
    slices: dict[tuple[float, float], list[int]] = {}
    for r in range(src.tp):
        slices.setdefault(_head_interval(r, src.tp, heads), []).append(r)
    src_layers = _layer_ranges(model, src)
    dst_layers = _layer_ranges(model, dst)
    out: dict[tuple[int, int], float] = {}
    for d_stage, (b0, b1) in enumerate(dst_layers):
        for j in range(dst.tp):
            lo, hi = _head_interval(j, dst.tp, heads)
            for (s_lo, s_hi), replicas in slices.items():
                width = min(hi, s_hi) - max(lo, s_lo)
                if width <= 0:
                    continue
                i = replicas[j % len(replicas)]
                for s_stage, (a0, a1) in enumerate(src_layers):
                    layers = min(a1, b1) - max(a0, b0)
                    if layers <= 0:
                        continue
                    key = (s_stage * src.tp + i, d_stage * dst.tp + j)
                    out[key] = out.get(key, 0.0) + layers * width * per_layer_head
    return [(a, b, v) for (a, b), v in out.items()]

