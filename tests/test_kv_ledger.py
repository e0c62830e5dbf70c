"""The ledgers' one-call decode growth is their per-request growth needs, where positive."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.engine.kv_manager import KVManager
from simulator.engine.prefix_cache import PrefixCache
from simulator.engine.request import Request
from simulator.engine.scheduler.base import PlainLedger

sequences = st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 300), st.integers(0, 400),
                               st.integers(0, 6)), min_size=0, max_size=30)


@settings(max_examples=200, deadline=None)
@given(sequences, st.sampled_from([1, 16, 32]), st.integers(0, 4), st.booleans())
def test_decode_growth_is_the_positive_growth_need_of_each(seqs, bs, lookahead,
                                                           cached) -> None:
    reqs = []
    for i, (prompt, generated, blocks, pins) in enumerate(seqs):
        req = Request(i, 0.0, prompt, generated + 10)
        req.generated, req.blocks, req.cache_pins = generated, blocks, pins
        reqs.append(req)
    cache = PrefixCache(64, bs) if cached else None
    ledgers = [KVManager(10_000, bs, cache),
               PlainLedger(10_000, bs, blocks={r.id: r.blocks for r in reqs})]
    for kv in ledgers:
        needs = [kv.growth_need(r, r.context_tokens + lookahead) for r in reqs]
        expected = [(r, n) for r, n in zip(reqs, needs, strict=True) if n > 0]
        assert kv.decode_growth(reqs, lookahead) == expected
