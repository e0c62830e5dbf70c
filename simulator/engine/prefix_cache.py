"""A block-hash prefix cache inside one instance's KV blocks (vLLM automatic prefix
caching, SGLang RadixAttention in spirit).

A prompt is a chain of hash blocks (``block_tokens`` tokens each; the Mooncake traces use
512). When a request leaves an instance, the full hash blocks of its prompt stay in the
KV memory as cache entries instead of being freed. A later request whose prompt starts
with the same chain reuses the matching blocks: it pins them for its lifetime and skips
their prefill. Unpinned entries are evicted least-recently-used first when the KV cache
needs room.

With lower KV tiers (:mod:`simulator.engine.kv_tiers`), ``below`` receives the hashes
of every eviction, oldest first, and offloads them instead of letting them go; and the
hashes of every new entry, so that a lower tier drops a copy HBM now holds afresh (a
block is in one tier at a time).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Protocol


class Below(Protocol):
    """What sits under the HBM cache (a :class:`~simulator.engine.tier_io.TierIO`)."""

    def offload(self, hashes: list[int]) -> None: ...

    def discard(self, hashes: list[int]) -> None: ...


class PrefixCache:
    __slots__ = ("below", "block_tokens", "blocks_per_entry", "entries", "pinned")

    def __init__(self, block_tokens: int, kv_block_size: int) -> None:
        self.block_tokens = block_tokens
        self.blocks_per_entry = -(-block_tokens // kv_block_size)
        self.entries: OrderedDict[int, int] = OrderedDict()  # hash -> pins, in LRU order
        self.pinned = 0  # entries with at least one pin
        self.below: Below | None = None

    # ----- lookup ----------------------------------------------------------------------
    def match(self, hashes: list[int]) -> int:
        """Leading hash blocks of ``hashes`` present in the cache."""
        n = 0
        for h in hashes:
            if h not in self.entries:
                break
            n += 1
        return n

    @property
    def evictable_blocks(self) -> int:
        return (len(self.entries) - self.pinned) * self.blocks_per_entry

    # ----- pins ------------------------------------------------------------------------
    def pin(self, hashes: list[int]) -> None:
        for h in hashes:
            pins = self.entries[h]
            if pins == 0:
                self.pinned += 1
            self.entries[h] = pins + 1
            self.entries.move_to_end(h)

    def unpin(self, hashes: list[int]) -> None:
        for h in hashes:
            pins = self.entries.get(h)
            if pins is None:
                continue
            if pins == 1:
                self.pinned -= 1
            self.entries[h] = pins - 1

    # ----- insert / evict ----------------------------------------------------------------
    def insert(self, hashes: list[int]) -> int:
        """Add unpinned entries for ``hashes`` not cached yet; return how many were new."""
        new: list[int] = []
        for h in hashes:
            if h in self.entries:
                self.entries.move_to_end(h)
            else:
                self.entries[h] = 0
                new.append(h)
        if new and self.below is not None:
            self.below.discard(new)
        return len(new)

    def evict(self, blocks: int) -> int:
        """Drop unpinned entries, oldest first, until ``blocks`` are freed; return freed."""
        freed = 0
        if blocks <= 0:
            return 0
        gone: list[int] = []
        for h in list(self.entries):
            if freed >= blocks:
                break
            if self.entries[h] == 0:
                del self.entries[h]
                gone.append(h)
                freed += self.blocks_per_entry
        if gone and self.below is not None:
            self.below.offload(gone)
        return freed

    def clear(self) -> None:
        self.entries.clear()
        self.pinned = 0
