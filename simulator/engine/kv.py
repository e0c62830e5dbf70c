"""Paged KV-cache block accounting of one instance, with an optional prefix cache."""

from __future__ import annotations

from simulator.engine.prefix_cache import PrefixCache
from simulator.errors import SimulationError


class BlockManager:
    """Counts fixed-size KV blocks; a sequence of ``n`` tokens holds ``ceil(n / size)``.

    ``used`` counts every occupied block: those requests own and those the prefix cache
    keeps. Unpinned cache entries are given up, oldest first, when an allocation needs
    room, so ``available`` (free + evictable) is what an allocation can get.
    """

    __slots__ = ("block_size", "cache", "peak_used", "total", "used")

    def __init__(self, total_blocks: int, block_size: int,
                 cache: PrefixCache | None = None) -> None:
        self.total = total_blocks
        self.block_size = block_size
        self.cache = cache
        self.used = 0
        self.peak_used = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def free(self) -> int:
        return self.total - self.used

    @property
    def available(self) -> int:
        evictable = self.cache.evictable_blocks if self.cache is not None else 0
        return self.total - self.used + evictable

    def can_allocate(self, blocks: int) -> bool:
        # ``available`` written out: this check runs at every booking.
        cache = self.cache
        return blocks <= (self.total - self.used
                          + (cache.evictable_blocks if cache is not None else 0))

    def allocate(self, blocks: int) -> None:
        if blocks < 0:
            raise SimulationError(f"negative KV allocation: {blocks}")
        short = self.used + blocks - self.total
        if short > 0 and self.cache is not None:
            self.used -= self.cache.evict(short)
        if self.used + blocks > self.total:
            raise SimulationError(
                f"KV over-allocation: {self.used} + {blocks} > {self.total} blocks"
            )
        self.used += blocks
        if self.used > self.peak_used:  # noqa: PLR1730 (a comparison: no call per booking)
            self.peak_used = self.used

    def reset(self) -> None:
        """Drop every block (the device lost its memory)."""
        self.used = 0
        if self.cache is not None:
            self.cache.clear()

    def release(self, blocks: int) -> None:
        if blocks < 0 or blocks > self.used:
            raise SimulationError(f"KV release of {blocks} with {self.used} used")
        self.used -= blocks
