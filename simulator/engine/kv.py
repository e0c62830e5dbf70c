"""Paged KV-cache block accounting of one instance."""

from __future__ import annotations

from simulator.errors import SimulationError


class BlockManager:
    """Counts fixed-size KV blocks; a sequence of ``n`` tokens holds ``ceil(n / size)``."""

    __slots__ = ("block_size", "peak_used", "total", "used")

    def __init__(self, total_blocks: int, block_size: int) -> None:
        self.total = total_blocks
        self.block_size = block_size
        self.used = 0
        self.peak_used = 0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def free(self) -> int:
        return self.total - self.used

    def can_allocate(self, blocks: int) -> bool:
        return blocks <= self.total - self.used

    def allocate(self, blocks: int) -> None:
        if blocks < 0 or self.used + blocks > self.total:
            raise SimulationError(
                f"KV over-allocation: {self.used} + {blocks} > {self.total} blocks"
            )
        self.used += blocks
        self.peak_used = max(self.peak_used, self.used)

    def reset(self) -> None:
        """Drop every block (the device lost its memory)."""
        self.used = 0

    def release(self, blocks: int) -> None:
        if blocks < 0 or blocks > self.used:
            raise SimulationError(f"KV release of {blocks} with {self.used} used")
        self.used -= blocks
