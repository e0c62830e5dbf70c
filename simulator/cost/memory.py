"""Memory of an instance: weights, activation reserve and KV-cache capacity per device."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.cost.parallel import Parallelism, Precisions, split_layers, stage_moe_layers
from simulator.hardware.profiles import DeviceProfile
from simulator.models.arch import ModelConfig, embedding_bytes_per_element
from simulator.units import GIB, bytes_per_element


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    """Per-device memory of the most loaded device of an instance."""

    capacity_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_bytes: float
    kv_bytes_per_token: float
    """KV bytes one token takes on the most loaded device."""
    kv_capacity_tokens: int
    """KV tokens the instance holds: one device's pool, times ``dp`` with data-parallel
    attention (each attention rank keeps its own requests' KV, unreplicated)."""
    block_size: int

    @property
    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @property
    def kv_bytes(self) -> float:
        return self.usable_bytes - self.weight_bytes - self.activation_bytes


def stage_weight_bytes(model: ModelConfig, par: Parallelism, weights: str,
                       redundant_experts: int = 0) -> list[float]:
    """Weight bytes on one device of each pipeline stage.

    With data-parallel attention (``par.dp > 1``) attention, dense FFNs, shared experts
    and the embeddings are replicated on every attention rank (split only over its
    ``tp``), while each EP rank holds ``(experts + redundant_experts) / ep`` routed experts
    (SGLang ``--enable-dp-attention --moe-dense-tp-size 1 --ep-num-redundant-experts``).
    """
    wb = bytes_per_element(weights)
    # Embedding and LM head keep 16 bits in quantised checkpoints: priced in weight
    # elements so the sum below stays one multiplication.
    embed_scale = embedding_bytes_per_element(weights) / wb
    layers = split_layers(model.num_layers, par.pp, par.balanced_stages)
    moe = stage_moe_layers(model, layers)
    out = []
    for index, (n, n_moe) in enumerate(zip(layers, moe, strict=True)):
        attn = model.attention_params() + model.norm_params_per_layer()
        if model.attention == "mla":
            h = model.hidden_size
            replicated = h * (model.q_lora_rank or 0) + h * (model.kv_lora_rank + model.qk_rope_head_dim)
            attn_dev = replicated + (attn - replicated) / par.tp
        else:
            kv_dev_heads = -(-model.num_kv_heads // par.tp)
            kv = model.hidden_size * 2 * kv_dev_heads * model.head_dim
            attn_dev = (attn - model.hidden_size * 2 * model.kv_width) / par.tp + kv
        dense_ffn = model.ffn_params(model.intermediate_size) / par.tp
        params = n * attn_dev + (n - n_moe) * dense_ffn
        if n_moe:
            total, _ = model.moe_layer_params()
            expert = model.ffn_params(model.moe_intermediate_size)
            routed = model.num_experts * expert
            if par.dp > 1:
                slots = (model.num_experts + redundant_experts) * expert / par.ep
                params += n_moe * (slots + (total - routed) / par.tp)
            else:
                params += n_moe * (routed / par.tp + (total - routed) / par.tp)
        embed = model.vocab_size * model.hidden_size / par.tp * embed_scale
        if par.balanced_stages:  # the compiler spreads embedding and LM head like the rest
            params += embed * (1 if model.tie_word_embeddings else 2) / par.pp
        else:
            if index == 0:
                params += embed
            if index == par.pp - 1 and not (model.tie_word_embeddings and par.pp == 1):
                params += embed
        out.append(params * wb)
    return out


def activation_reserve_bytes(
    model: ModelConfig, par: Parallelism, activations: str, max_batched_tokens: int,
    max_seqs: int, runtime_reserve_gib: float,
) -> float:
    """Peak transient memory of a step plus the runtime's fixed reserve.

    The largest live intermediates are the FFN input/outputs of the biggest step
    (``max_batched_tokens`` tokens) and the fp32 logits of ``max_seqs`` sequences. Both
    limits are the instance's; with data-parallel attention each rank gets a ``1/dp``
    share (SGLang divides ``--chunked-prefill-size`` and ``--max-running-requests`` by the
    DP size in ``server_args.py``).
    """
    ab = bytes_per_element(activations)
    max_batched_tokens = -(-max_batched_tokens // par.dp)
    max_seqs = -(-max_seqs // par.dp)
    width = max(model.intermediate_size, model.moe_intermediate_size * model.num_experts_per_token)
    per_token = (4 * model.hidden_size + 3 * width / par.tp + model.q_width / par.tp) * ab
    logits = max_seqs * model.vocab_size / par.tp * 4
    return max_batched_tokens * per_token + logits + runtime_reserve_gib * GIB


def plan_memory(
    model: ModelConfig,
    device: DeviceProfile,
    par: Parallelism,
    precisions: Precisions,
    *,
    memory_utilization: float,
    block_size: int,
    max_batched_tokens: int,
    max_seqs: int,
    runtime_reserve_gib: float,
    kv_elements_per_token_per_layer_device: float,
    redundant_experts: int = 0,
    comm_buffer_bytes: float = 0.0,
) -> MemoryPlan:
    """Weights, reserve and KV capacity; the KV capacity may be zero or negative.

    Callers decide what "does not fit" means (no room for weights, or no room for one
    prompt's KV) and word the error; see :func:`simulator.engine.build`.
    ``comm_buffer_bytes`` (DeepEP's dispatch/combine buffers) is reserved on every device.
    """
    capacity = device.memory_bytes
    usable = capacity * memory_utilization
    weights = max(stage_weight_bytes(model, par, precisions.weights, redundant_experts))
    reserve = activation_reserve_bytes(
        model, par, precisions.activations, max_batched_tokens, max_seqs, runtime_reserve_gib
    ) + comm_buffer_bytes
    layers_max = max(split_layers(model.num_layers, par.pp, par.balanced_stages))
    kv_per_token = (
        layers_max * kv_elements_per_token_per_layer_device * bytes_per_element(precisions.kv_cache)
    )
    free = usable - weights - reserve
    tokens = int(free // kv_per_token) if free > 0 else 0
    tokens = (tokens // block_size) * block_size * par.dp
    return MemoryPlan(capacity, usable, weights, reserve, kv_per_token, tokens, block_size)
