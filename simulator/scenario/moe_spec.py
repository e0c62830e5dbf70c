"""Scenario settings of MoE serving with wide expert parallelism (a pool's ``moe:`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ExpertLoadSpec(_Spec):
    popularity: Literal["uniform", "zipf", "given"] = Field("uniform", description=(
        "Share of routed tokens per expert: `uniform`, `zipf` (the i-th most popular "
        "expert gets a share proportional to i^-zipf_exponent, in a seeded random order of "
        "expert ids), or `given` (`weights`, one per expert)."))
    zipf_exponent: float = Field(0.5, ge=0, le=4, description="Skew of `zipf` popularity.")
    weights: tuple[float, ...] | None = Field(None, description=(
        "Routed-token weights per expert id (`given`), e.g. counts from SGLang's "
        "expert-distribution recorder."))
    seed: int = Field(0, ge=0, description="Order of expert ids under `zipf` popularity.")
    eplb: bool = Field(False, description=(
        "Place experts with DeepSeek's EPLB (replicate the hottest, pack replicas evenly) "
        "instead of contiguously by id."))
    redundant_experts: int = Field(0, ge=0, description=(
        "Extra expert replicas over the EP ranks (SGLang `--ep-num-redundant-experts`); "
        "they take memory on every rank and, with `eplb`, spread the hottest experts."))

    @model_validator(mode="after")
    def _weights_iff_given(self) -> ExpertLoadSpec:
        if (self.popularity == "given") != (self.weights is not None):
            raise ValueError("popularity: given needs `weights` (one per expert), and "
                             "`weights` needs popularity: given")
        if self.weights is not None and (any(w < 0 for w in self.weights) or sum(self.weights) <= 0):
            raise ValueError("expert weights must be >= 0 and not all zero")
        return self


class MoESpec(_Spec):
    """How the MoE layers of a pool's instances communicate and balance."""

    deepep_mode: Literal["auto", "normal", "low_latency"] = Field("auto", description=(
        "DeepEP kernels with data-parallel attention: `auto` (normal for prefill, "
        "low-latency for decode, as SGLang `--deepep-mode auto`), or one of them always."))
    max_nodes_per_token: int | None = Field(None, ge=1, description=(
        "Group-limited routing: a token's experts lie on at most this many nodes "
        "(DeepSeek-V3: 4); unset = unrestricted top-k."))
    two_batch_overlap: bool = Field(False, description=(
        "Overlap one micro-batch's dispatch/combine with the other's compute (SGLang "
        "`--enable-two-batch-overlap`); needs data-parallel attention."))
    low_latency_max_tokens_per_rank: int = Field(128, ge=1, le=1024, description=(
        "Tokens per rank DeepEP's low-latency buffer is sized for (SGLang "
        "`SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK`, default 128)."))
    expert_load: ExpertLoadSpec = Field(default_factory=ExpertLoadSpec,  # type: ignore[arg-type]
                                        description="Expert popularity and placement.")
