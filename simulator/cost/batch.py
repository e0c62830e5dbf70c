"""What a step computes, reduced to the sums the cost model needs.

A step mixes prefill chunks (``new`` tokens on top of ``ctx`` cached ones) and decode
sequences (one token each on a context). The cost depends on the batch only through
these sums, so a step of any size costs O(1) to price.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchShape:
    prefill_tokens: int = 0
    """New tokens computed by prefill chunks this step."""
    prefill_seqs: int = 0
    """Sequences with a prefill chunk in this step."""
    prefill_attn_pairs: float = 0.0
    """Causal query-key pairs of the prefill chunks: sum of new * (ctx + (new + 1) / 2)."""
    prefill_kv_tokens: int = 0
    """KV tokens prefill attention reads: sum of (ctx + new)."""
    decode_seqs: int = 0
    """Sequences generating one token this step."""
    decode_ctx_tokens: int = 0
    """Sum of the decode sequences' context lengths (KV tokens attention reads)."""
    logits_seqs: int = 0
    """Sequences whose last position goes through the LM head (decodes + finishing prefills)."""
    prefill_max_tokens: int = 0
    """New tokens of the longest prefill chunk (0: not given; the cost model then bounds it
    from the sums)."""
    decode_max_ctx: int = 0
    """Context of the longest decode sequence (0: not given; the cost model then bounds it
    from the sums). Read only where a kernel's time follows its longest sequence
    (``OperatorFit.head_tile``)."""
    prefill_max_kv: int = 0
    """KV tokens (context + new) of the prefill chunk on the longest context (0: not
    given), for the same kernels."""

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs

    @property
    def is_empty(self) -> bool:
        return self.tokens == 0

    @classmethod
    def build(
        cls,
        prefill_chunks: Iterable[tuple[int, int, bool]] = (),
        decode_contexts: Iterable[int] = (),
    ) -> BatchShape:
        """From ``(new, ctx, samples)`` prefill chunks and decode context lengths."""
        p_tokens = p_seqs = p_kv = logits = p_max = p_max_kv = 0
        pairs = 0.0
        for new, ctx, samples in prefill_chunks:
            if new <= 0:
                continue
            p_tokens += new
            p_seqs += 1
            pairs += new * (ctx + (new + 1) / 2)
            p_kv += ctx + new
            p_max = max(p_max, new)
            p_max_kv = max(p_max_kv, ctx + new)
            logits += 1 if samples else 0
        contexts = list(decode_contexts)
        d_seqs, d_ctx, d_max = len(contexts), sum(contexts), max(contexts, default=0)
        return cls(p_tokens, p_seqs, pairs, p_kv, d_seqs, d_ctx, logits + d_seqs, p_max,
                   d_max, p_max_kv)

    @classmethod
    def decode(cls, seqs: int, ctx_tokens: int, longest: int = 0) -> BatchShape:
        """``seqs`` decode sequences of ``ctx_tokens`` context in all, the longest of
        ``longest`` (0: not given)."""
        return cls(decode_seqs=seqs, decode_ctx_tokens=ctx_tokens, logits_seqs=seqs,
                   decode_max_ctx=longest)

    @classmethod
    def prefill(cls, prompt_tokens: int, cached: int = 0, samples: bool = True) -> BatchShape:
        return cls.build([(prompt_tokens - cached, cached, samples)])
