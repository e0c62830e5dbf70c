"""Speculative decoding and multi-token prediction: draft cost, verify batches, acceptance.

One speculative step of a decode batch (vLLM ``vllm/v1/spec_decode/``, SGLang
``sglang/srt/speculative/``) does two things:

* **draft** ``k`` tokens per sequence: DeepSeek MTP and EAGLE-3 run a one-layer draft
  head ``k`` times autoregressively (the MTP module is one extra decoder layer sharing the
  target's embedding and LM head); a draft model runs a small model ``k`` times; n-gram
  (prompt lookup) costs host time only;
* **verify**: the target runs once over ``k + 1`` positions per sequence (the last
  accepted token plus the ``k`` drafts) and samples at every one of them. That is a
  different batch shape from a decode step: ``k + 1`` query tokens on each context, priced
  by the same predictor as a prefill chunk that samples every position.

Between 1 and ``k + 1`` tokens come out of each sequence per step: the accepted prefix of
the drafts plus one token from the target. The expected count (*acceptance length*) is
given as a mean, as per-position conditional acceptance rates (``rates[i]`` = P(draft
``i+1`` accepted | drafts ``1..i`` accepted)), or as a histogram of tokens per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from simulator.cost.accounting import DecodeSeries, StepCost
from simulator.cost.batch import BatchShape

if TYPE_CHECKING:
    from simulator.cost.predictor import StepTimePredictor

SpeculativeMethod = Literal["mtp", "eagle", "draft_model", "ngram"]


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Tokens emitted per sequence per speculative step: a distribution over 1..k+1."""

    probabilities: tuple[float, ...]
    """``probabilities[j]`` = P(``j + 1`` tokens come out of a step)."""

    def __post_init__(self) -> None:
        p = self.probabilities
        if not p or any(x < 0 for x in p) or not math.isclose(sum(p), 1.0, abs_tol=1e-9):
            raise ValueError("acceptance probabilities must be >= 0 and sum to 1")

    @property
    def draft_tokens(self) -> int:
        return len(self.probabilities) - 1

    @property
    def mean_tokens(self) -> float:
        """Acceptance length: expected tokens a sequence advances per step (>= 1)."""
        return float(sum((j + 1) * p for j, p in enumerate(self.probabilities)))

    @classmethod
    def from_rates(cls, rates: list[float]) -> Acceptance:
        """From per-position conditional acceptance rates of the ``k = len(rates)`` drafts."""
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ValueError("acceptance rates must lie in [0, 1]")
        probs, alive = [], 1.0
        for r in rates:
            probs.append(alive * (1.0 - r))
            alive *= r
        probs.append(alive)
        return cls(tuple(probs))

    @classmethod
    def from_histogram(cls, counts: list[float]) -> Acceptance:
        """From counts (or shares) of steps that emitted 1, 2, ..., k+1 tokens."""
        total = float(sum(counts))
        if total <= 0 or any(c < 0 for c in counts):
            raise ValueError("an acceptance histogram needs non-negative counts, not all zero")
        return cls(tuple(c / total for c in counts))

    @classmethod
    def from_mean(cls, mean: float, draft_tokens: int) -> Acceptance:
        """The distribution with a constant per-position rate whose mean is ``mean``."""
        k = draft_tokens
        if k < 1 or not 1.0 <= mean <= k + 1:
            raise ValueError(f"mean acceptance length must lie in [1, {k + 1}] for {k} drafts")
        if mean == k + 1:
            return cls.from_rates([1.0] * k)
        lo, hi = 0.0, 1.0
        for _ in range(80):  # mean tokens grows with the rate: bisect
            mid = (lo + hi) / 2
            if cls.from_rates([mid] * k).mean_tokens < mean:
                lo = mid
            else:
                hi = mid
        return cls.from_rates([(lo + hi) / 2] * k)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Tokens emitted by ``size`` sequence-steps."""
        return rng.choice(np.arange(1, len(self.probabilities) + 1), size=size,
                          p=np.asarray(self.probabilities))


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: SpeculativeMethod
    acceptance: Acceptance
    draft_layers: float = 1.0
    """Decoder layers of the target one draft pass costs (MTP / EAGLE: 1; a draft model:
    its layer count scaled to the target's width; n-gram: 0)."""
    host_us_per_step: float = 0.0
    """Host time the proposer adds per step (n-gram lookup, tree bookkeeping)."""

    @property
    def draft_tokens(self) -> int:
        return self.acceptance.draft_tokens


def verify_batch(contexts_sum: int, seqs: int, draft_tokens: int,
                 longest: int = 0) -> BatchShape:
    """The target's verify pass: ``k + 1`` sampled positions on each sequence's context
    (the longest of ``longest`` tokens; 0: not given)."""
    q = draft_tokens + 1
    if seqs <= 0:
        return BatchShape()
    pairs = seqs * q * (contexts_sum / seqs + (q + 1) / 2)
    return BatchShape(prefill_tokens=seqs * q, prefill_seqs=seqs, prefill_attn_pairs=pairs,
                      prefill_kv_tokens=contexts_sum + seqs * q, logits_seqs=seqs * q,
                      prefill_max_tokens=q, prefill_max_kv=longest + q if longest else 0)


def steps_for(output_tokens: int, mean_tokens_per_step: float) -> int:
    """Decode steps a request of ``output_tokens`` needs when each step emits the mean."""
    if output_tokens <= 0:
        return 0
    return math.ceil(output_tokens / mean_tokens_per_step - 1e-9)


@dataclass(frozen=True, slots=True)
class SpeculativeStep:
    seconds: float
    """Draft passes + verify + the proposer's host time."""
    draft_s: float
    verify: StepCost
    tokens_per_seq: float
    """Expected tokens each sequence advances (the acceptance length)."""


def speculative_step(cost: StepTimePredictor, num_layers: int, seqs: int, ctx_sum: int,
                     spec: SpeculativeConfig) -> SpeculativeStep:
    """One draft-then-verify step of ``seqs`` decoding sequences with ``ctx_sum`` context.

    A draft pass is priced as ``draft_layers / num_layers`` of the target's GPU time for a
    plain decode step of the same batch (one decoder layer plus its share of the LM head
    for MTP and EAGLE); the verify pass is the predictor's price of the verify batch.
    """
    k = spec.draft_tokens
    plain = cost.step(BatchShape.decode(seqs, ctx_sum))
    draft = k * sum(plain.stage_seconds) * spec.draft_layers / num_layers
    verify = cost.step(verify_batch(ctx_sum, seqs, k))
    seconds = verify.seconds + draft + spec.host_us_per_step * 1e-6
    return SpeculativeStep(seconds, draft, verify, spec.acceptance.mean_tokens)


def with_verify(batch: BatchShape, draft_tokens: int) -> BatchShape:
    """``batch`` with each decode sequence turned into a ``k + 1``-position verify."""
    seqs = batch.decode_seqs
    if seqs == 0:
        return batch
    v = verify_batch(batch.decode_ctx_tokens, seqs, draft_tokens, batch.decode_max_ctx)
    return BatchShape(
        prefill_tokens=batch.prefill_tokens + v.prefill_tokens,
        prefill_seqs=batch.prefill_seqs + v.prefill_seqs,
        prefill_attn_pairs=batch.prefill_attn_pairs + v.prefill_attn_pairs,
        prefill_kv_tokens=batch.prefill_kv_tokens + v.prefill_kv_tokens,
        logits_seqs=batch.logits_seqs - seqs + v.logits_seqs,
        prefill_max_tokens=(max(batch.prefill_max_tokens, v.prefill_max_tokens)
                            if batch.prefill_max_tokens or not batch.prefill_seqs else 0),
        prefill_max_kv=(max(batch.prefill_max_kv, v.prefill_max_kv)
                        if v.prefill_max_kv and (batch.prefill_max_kv or not batch.prefill_seqs)
                        else 0),
    )


@dataclass
class SpeculativePredictor:
    """A step-time predictor whose decode sequences draft and verify (one pool's setting).

    Prefill chunks are priced as they are; the decode part of every step becomes the
    draft passes plus a verify batch merged with the step's prefill chunks, all priced by
    the wrapped predictor. Decode stretches are priced step by step (a verify pass is not
    affine in the context the way a decode step is).
    """

    inner: StepTimePredictor
    spec: SpeculativeConfig
    num_layers: int

    @property
    def parallelism(self) -> Any:
        return self.inner.parallelism

    def step(self, batch: BatchShape) -> StepCost:
        if batch.decode_seqs == 0:
            return self.inner.step(batch)
        k = self.spec.draft_tokens
        verify = self.inner.step(with_verify(batch, k))
        plain = self.inner.step(BatchShape.decode(batch.decode_seqs, batch.decode_ctx_tokens,
                                                  batch.decode_max_ctx))
        draft = k * sum(plain.stage_seconds) * self.spec.draft_layers / self.num_layers
        extra = draft + self.spec.host_us_per_step * 1e-6
        return StepCost(verify.seconds + extra, tuple(s + extra for s in verify.stage_seconds),
                        verify.compute_s + draft, verify.memory_s, verify.communication_s,
                        verify.overhead_s + self.spec.host_us_per_step * 1e-6)

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        ops = dict(self.inner.breakdown(with_verify(batch, self.spec.draft_tokens)))
        if batch.decode_seqs:
            plain = self.inner.step(BatchShape.decode(batch.decode_seqs, batch.decode_ctx_tokens,
                                                      batch.decode_max_ctx))
            ops["draft"] = (self.spec.draft_tokens * sum(plain.stage_seconds)
                            * self.spec.draft_layers / self.num_layers)
        return ops

    def decode_series(self, seqs: int, ctx_sums: np.ndarray,
                      longest: np.ndarray | None = None) -> DecodeSeries:
        most = np.zeros(len(ctx_sums), dtype=np.int64) if longest is None else longest
        out = [self.step(BatchShape.decode(seqs, int(total), int(m)))
               for total, m in zip(np.asarray(ctx_sums), most, strict=True)]
        bounds = ("compute", "memory", "communication", "overhead")
        return DecodeSeries(np.array([c.seconds for c in out]),
                            np.array([bounds.index(c.bound) for c in out], dtype=np.int64),
                            np.array([c.compute_s for c in out]),
                            np.array([c.memory_s for c in out]))
