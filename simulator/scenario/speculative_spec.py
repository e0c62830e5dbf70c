"""A pool's speculative decoding / multi-token prediction setting (``speculative:``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SpeculativeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    method: Literal["mtp", "eagle", "draft_model", "ngram"] = Field(description=(
        "Proposer: DeepSeek `mtp`, `eagle` (EAGLE-3), a small `draft_model`, or `ngram` "
        "prompt lookup (vLLM `--speculative-config`, SGLang `--speculative-algorithm`)."))
    draft_tokens: int = Field(ge=1, le=16, description=(
        "Tokens drafted per step (k); each step verifies k + 1 positions per sequence."))
    acceptance_length: float | None = Field(None, ge=1, description=(
        "Mean tokens a sequence advances per step, 1..k+1 (as engines report it)."))
    acceptance_rates: tuple[float, ...] | None = Field(None, description=(
        "P(draft i accepted | drafts before it accepted), one per drafted position."))
    acceptance_histogram: tuple[float, ...] | None = Field(None, description=(
        "Counts or shares of steps that advanced 1, 2, ..., k+1 tokens."))
    draft_layers: float | None = Field(None, ge=0, description=(
        "Target decoder layers one draft pass costs (default: 1 for mtp/eagle, 0 for "
        "ngram; give it for a draft_model)."))
    host_us_per_step: float = Field(0.0, ge=0, description=(
        "Proposer host time per step, microseconds (n-gram lookup, tree bookkeeping)."))

    @model_validator(mode="after")
    def _one_acceptance(self) -> SpeculativeSpec:
        given = [x for x in (self.acceptance_length, self.acceptance_rates,
                             self.acceptance_histogram) if x is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of acceptance_length, acceptance_rates, "
                             "acceptance_histogram")
        k = self.draft_tokens
        if self.acceptance_length is not None and self.acceptance_length > k + 1:
            raise ValueError(f"acceptance_length {self.acceptance_length:g} exceeds "
                             f"draft_tokens + 1 = {k + 1}")
        if self.acceptance_rates is not None and (
                len(self.acceptance_rates) != k or any(not 0 <= r <= 1 for r in self.acceptance_rates)):
            raise ValueError(f"acceptance_rates needs {k} rates in [0, 1] (one per drafted token)")
        h = self.acceptance_histogram
        if h is not None and (len(h) != k + 1 or any(c < 0 for c in h) or sum(h) <= 0):
            raise ValueError(f"acceptance_histogram needs {k + 1} non-negative counts "
                             "(steps that advanced 1..k+1 tokens), not all zero")
        if self.method == "draft_model" and self.draft_layers is None:
            raise ValueError("method draft_model needs draft_layers (its cost in target layers)")
        return self
