"""Transformer architectures: the shapes the cost model needs, and counts derived from them.

One class covers dense GQA models (Llama, Qwen, OPT), MoE models (Mixtral, Qwen3-MoE,
DeepSeek) and multi-head latent attention (MLA, DeepSeek-V2/V3). Parameter counts and KV
bytes per token are computed from the shapes, never typed in, so tests can check them
against the published totals.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.units import bytes_per_element


def embedding_bytes_per_element(weights: str) -> float:
    """Bytes per element of the token embedding and LM head of a checkpoint whose other
    weights are stored at ``weights``.

    Quantised checkpoints keep both in 16 bits: NVIDIA ModelOpt FP8 / NVFP4 checkpoints
    quantise Linear layers only and list the LM head in ``exclude_modules`` (e.g.
    nvidia/Llama-3.3-70B-Instruct-FP8, hf_quant_config.json ``"exclude_modules":
    ["lm_head"]``), llm-compressor FP8 checkpoints ``ignore`` ``lm_head``, and DeepSeek-V3's
    native FP8 checkpoint block-quantises the Linear layers only. So any precision below
    16 bits prices these at BF16; 16- and 32-bit weights keep their own width.
    """
    return max(bytes_per_element(weights), bytes_per_element("bf16"))


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Model name, e.g. `Llama-3.1-70B`.")
    released_precision: Literal["bf16", "fp16", "fp8"] = Field("bf16", description=(
        "Precision the weights were published in (DeepSeek-V3: fp8); a scenario's "
        "`precision` defaults to it."))
    num_layers: int = Field(gt=0, description="Transformer blocks.")
    hidden_size: int = Field(gt=0, description="Residual stream width.")
    num_attention_heads: int = Field(gt=0, description="Query heads.")
    num_kv_heads: int = Field(gt=0, description="Key/value heads (GQA); ignored for MLA.")
    head_dim: int = Field(gt=0, description="Width of one attention head.")
    intermediate_size: int = Field(gt=0, description="FFN width of dense layers.")
    vocab_size: int = Field(gt=0, description="Vocabulary size (embedding and LM head rows).")
    max_context_tokens: int = Field(gt=0, description="Longest supported context.")
    mlp_kind: Literal["gated", "plain"] = Field(
        "gated", description="`gated` = SwiGLU (3 matrices); `plain` = fc1/fc2 with biases (OPT)."
    )
    norm_kind: Literal["rms", "layer"] = Field("rms", description="RMSNorm or LayerNorm.")
    qkv_bias: bool = Field(False, description="Bias on the Q/K/V projections (Qwen2).")
    qk_norm: bool = Field(False, description="Per-head RMSNorm on Q and K (Qwen3).")
    tie_word_embeddings: bool = Field(False, description="LM head shares the embedding.")
    learned_positions: int = Field(
        0, ge=0, description="Rows of a learned position embedding (OPT), 0 for RoPE."
    )
    # Multi-head latent attention (DeepSeek-V2/V3).
    attention: Literal["gqa", "mla"] = Field("gqa", description="Attention family.")
    q_lora_rank: int = Field(0, ge=0, description="MLA query compression rank (0 = none).")
    kv_lora_rank: int = Field(0, ge=0, description="MLA latent KV width.")
    qk_nope_head_dim: int = Field(0, ge=0, description="MLA per-head non-rotary Q/K width.")
    qk_rope_head_dim: int = Field(0, ge=0, description="MLA rotary key width (shared).")
    v_head_dim: int = Field(0, ge=0, description="MLA per-head value width.")
    # Mixture of experts.
    num_experts: int = Field(0, ge=0, description="Routed experts per MoE layer (0 = dense).")
    num_experts_per_token: int = Field(0, ge=0, description="Routed experts per token (top-k).")
    moe_intermediate_size: int = Field(0, ge=0, description="FFN width of one expert.")
    num_shared_experts: int = Field(0, ge=0, description="Always-active shared experts.")
    first_dense_layers: int = Field(
        0, ge=0, description="Leading layers with a dense FFN in a MoE model (DeepSeek: 3)."
    )
    architecture: str = Field("", description=(
        "Hugging Face architecture class (config.json `architectures[0]`, e.g. "
        "`Qwen3MoeForCausalLM`); engines choose some kernels by it "
        "(simulator.hardware.operator_fits.moe_kernel_family)."))
    source: str = Field("", description="Where the shapes come from.")

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.attention == "gqa" and self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.attention == "mla" and not (self.kv_lora_rank and self.v_head_dim):
            raise ValueError("MLA needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim")
        if self.num_experts:
            if not (0 < self.num_experts_per_token <= self.num_experts):
                raise ValueError("num_experts_per_token must be in 1..num_experts for a MoE model")
            if not self.moe_intermediate_size:
                raise ValueError("moe_intermediate_size is required for a MoE model")
            if self.first_dense_layers > self.num_layers:
                raise ValueError("first_dense_layers cannot exceed num_layers")
        return self

    # ----- shapes -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_dense_layers if self.is_moe else 0

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def q_width(self) -> int:
        """Width of all query heads together."""
        if self.attention == "mla":
            return self.num_attention_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.num_attention_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of K (= V) across all KV heads, for GQA."""
        return self.num_kv_heads * self.head_dim

    @property
    def attn_out_width(self) -> int:
        if self.attention == "mla":
            return self.num_attention_heads * self.v_head_dim
        return self.num_attention_heads * self.head_dim

    # ----- parameters, per layer -----------------------------------------------------
    def attention_params(self) -> int:
        h = self.hidden_size
        if self.attention == "mla":
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * self.q_width
            else:
                q = h * self.q_width
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
            kv_b = self.kv_lora_rank * self.num_attention_heads * (
                self.qk_nope_head_dim + self.v_head_dim
            )
            return q + kv_a + kv_b + self.attn_out_width * h
        qkv = h * (self.q_width + 2 * self.kv_width)
        bias = (self.q_width + 2 * self.kv_width) if self.qkv_bias else 0
        if self.norm_kind == "layer" and self.mlp_kind == "plain":  # OPT: every linear has bias
            bias = self.q_width + 2 * self.kv_width + h
        qk_norm = 2 * self.head_dim if self.qk_norm else 0
        return qkv + bias + self.attn_out_width * h + qk_norm

    def ffn_params(self, width: int) -> int:
        h = self.hidden_size
        if self.mlp_kind == "gated":
            return 3 * h * width
        return 2 * h * width + width + h

    def norm_params_per_layer(self) -> int:
        return 2 * self.hidden_size * (2 if self.norm_kind == "layer" else 1)

    def moe_layer_params(self) -> tuple[int, int]:
        """(total, active) FFN parameters of one MoE layer, router included."""
        expert = self.ffn_params(self.moe_intermediate_size)
        router = self.hidden_size * self.num_experts
        shared = self.num_shared_experts * expert
        total = self.num_experts * expert + shared + router
        active = self.num_experts_per_token * expert + shared + router
        return total, active

    def embedding_params(self) -> int:
        emb = self.vocab_size * self.hidden_size + self.learned_positions * self.hidden_size
        head = 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size
        final_norm = self.hidden_size * (2 if self.norm_kind == "layer" else 1)
        return emb + head + final_norm

    def params_total(self) -> int:
        per_layer = self.attention_params() + self.norm_params_per_layer()
        dense_ffn = self.ffn_params(self.intermediate_size)
        total = self.num_layers * per_layer + self.num_dense_layers * dense_ffn
        if self.is_moe:
            total += self.num_moe_layers * self.moe_layer_params()[0]
        return total + self.embedding_params()

    def params_active(self) -> int:
        """Parameters touched by one token (all of them for a dense model)."""
        if not self.is_moe:
            return self.params_total()
        per_layer = self.attention_params() + self.norm_params_per_layer()
        dense_ffn = self.ffn_params(self.intermediate_size)
        active = self.num_layers * per_layer + self.num_dense_layers * dense_ffn
        active += self.num_moe_layers * self.moe_layer_params()[1]
        return active + self.embedding_params()

    # ----- KV cache -----------------------------------------------------------------
    def kv_elements_per_token_per_layer(self) -> int:
        if self.attention == "mla":
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_width

    def kv_bytes_per_token(self, precision: str = "bf16") -> float:
        """KV-cache bytes one token occupies across all layers (unsharded)."""
        per_layer = self.kv_elements_per_token_per_layer() * bytes_per_element(precision)
        return self.num_layers * per_layer

    def weight_bytes(self, precision: str = "bf16") -> float:
        """Checkpoint bytes: the embedding and LM head at their own width
        (``embedding_bytes_per_element``), every other parameter at ``precision``."""
        embed = self.embedding_params()
        return ((self.params_total() - embed) * bytes_per_element(precision)
                + embed * embedding_bytes_per_element(precision))
