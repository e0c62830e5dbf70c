"""KV management of one instance: block accounting plus the prefix-cache glue.

:class:`KVManager` owns every KV field of a request on this instance (``blocks``,
``cache_pins``, ``src_blocks``) and is the :class:`~simulator.engine.scheduler.base.KVLedger`
the scheduler books through: admit a prompt (less its prefix-cache hit), grow a decode,
free a preempted or finished request (its full prompt and reply blocks stay cached),
reserve KV for an incoming hand-off (pinning the leading blocks a decode-side prefix
cache already holds), stage blocks loaded from a lower KV tier. Block counting itself is
:class:`~simulator.engine.kv.BlockManager`, the cache
:class:`~simulator.engine.prefix_cache.PrefixCache`.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.engine.kv import BlockManager
from simulator.engine.prefix_cache import Below, PrefixCache
from simulator.engine.request import Request


class KVManager:
    __slots__ = ("block_size", "blocks", "cache", "reserved_pins")

    def __init__(self, kv_blocks: int, block_size: int, cache: PrefixCache | None) -> None:
        self.cache = cache
        self.blocks = BlockManager(kv_blocks, block_size, cache)
        self.block_size = block_size
        # Decode role: prefix-cache blocks pinned for incoming hand-offs, by request id.
        self.reserved_pins: dict[int, int] = {}

    # ----- reads -----------------------------------------------------------------------
    @property
    def used(self) -> int:
        return self.blocks.used

    @property
    def total(self) -> int:
        return self.blocks.total

    @property
    def available(self) -> int:
        return self.blocks.available

    def blocks_for(self, tokens: int) -> int:
        return self.blocks.blocks_for(tokens)

    def can_allocate(self, blocks: int) -> bool:
        return self.blocks.can_allocate(blocks)

    def usable_hashes(self, req: Request) -> list[int]:
        """Hash blocks of the prompt a cache hit may cover (at least one token is computed)."""
        cache = self.cache
        if cache is None or not req.block_hashes:
            return []
        limit = min(len(req.block_hashes), (req.prompt_tokens - 1) // cache.block_tokens)
        return req.block_hashes[:limit]

    def owned(self, req: Request) -> int:
        return req.blocks + self.pinned_blocks(req)

    def prefix_hit(self, req: Request) -> int:
        return self.prefix_match_tokens(req) if self.cache is not None else 0

    def pinned_blocks(self, req: Request) -> int:
        """KV blocks of ``req`` that the prefix cache owns (its pinned leading blocks)."""
        return req.cache_pins * self.cache.blocks_per_entry if self.cache is not None else 0

    def prefix_match_tokens(self, req: Request) -> int:
        """Prompt tokens the prefix cache would spare ``req`` now."""
        if self.cache is None:
            return 0
        return self.cache.match(self.usable_hashes(req)) * self.cache.block_tokens

    # ----- the scheduler's ledger ----------------------------------------------------
    def growth_need(self, req: Request, tokens: int) -> int:
        cache = self.cache
        pinned = req.cache_pins * cache.blocks_per_entry if cache is not None else 0
        return -(-tokens // self.block_size) - req.blocks - pinned

    def decode_growth(self, reqs: Sequence[Request],
                      lookahead: int) -> list[tuple[Request, int]]:
        # growth_need of each, without a call per request (the decode pass of every step);
        # with no prefix cache nothing is pinned.
        bs = self.block_size
        if self.cache is None:
            return [(r, n) for r in reqs
                    if (n := -(-(r.prompt_tokens + r.generated + lookahead) // bs)
                        - r.blocks) > 0]
        per = self.cache.blocks_per_entry
        return [(r, n) for r in reqs
                if (n := -(-(r.prompt_tokens + r.generated + lookahead) // bs) - r.blocks
                    - r.cache_pins * per) > 0]

    def grow(self, req: Request, blocks: int) -> None:
        self.blocks.allocate(blocks)
        req.blocks += blocks

    def preempt(self, req: Request) -> None:
        self.free_request(req, req.blocks)
        req.blocks = 0

    def admit(self, req: Request, target_tokens: int,
              book_tokens: int | None = None) -> int | None:
        hit = 0
        cache = self.cache
        if cache is not None:
            usable = self.usable_hashes(req)
            hit = cache.match(usable)
            cache.pin(usable[:hit])
        need = self.blocks.blocks_for(target_tokens + 1 if book_tokens is None else book_tokens)
        if hit:
            need = max(0, need - hit * cache.blocks_per_entry)  # type: ignore[union-attr]
        if not self.blocks.can_allocate(need):
            if hit:
                cache.unpin(req.block_hashes[:hit])  # type: ignore[union-attr, index]
            return None
        self.blocks.allocate(need)
        req.blocks = need
        if cache is None:
            return 0
        req.cache_pins = hit
        return hit * cache.block_tokens

    # ----- freeing and hand-offs -------------------------------------------------------
    @staticmethod
    def computed_tokens(req: Request) -> int:
        """Tokens whose KV ``req`` holds here: while prefilling, the chunks done so far
        (KV is booked per chunk, so a request preempted or cancelled mid-prefill owns no
        more); after it, the prompt and the reply but its last token (sampled, never fed
        back). vLLM caches generated blocks too: a multi-turn session finds its history."""
        if req.in_prefill:
            return req.prefilled
        return req.prompt_tokens + max(0, req.generated - 1)

    def free_request(self, req: Request, owned: int) -> None:
        """Give back a request's KV; with a prefix cache its full computed blocks stay cached
        (:meth:`computed_tokens`: a request cut short mid-prefill leaves only its chunks)."""
        cache = self.cache
        if cache is None or not req.block_hashes:
            self.blocks.release(owned)
            return
        pins = req.cache_pins
        full = min(len(req.block_hashes), self.computed_tokens(req) // cache.block_tokens)
        computed = req.block_hashes[pins:full]
        kept = cache.insert(computed) * cache.blocks_per_entry
        kept = min(kept, owned)
        self.blocks.release(owned - kept)
        cache.unpin(req.block_hashes[:pins])
        req.cache_pins = 0

    def can_reserve_for(self, req: Request) -> bool:
        """Room for an incoming hand-off's KV (its context and the next token)."""
        blocks = self.blocks
        return blocks.can_allocate(-(-(req.prompt_tokens + req.generated + 1)
                                     // blocks.block_size))

    def reserve(self, req: Request) -> None:
        """Book an incoming hand-off's KV. With a prefix cache, the prompt's leading blocks
        it holds are pinned instead, and the hand-off moves only the rest
        (``req.decode_cached_tokens``)."""
        need = self.blocks.blocks_for(req.context_tokens + 1)
        cache = self.cache
        hit = 0
        if cache is not None:
            usable = self.usable_hashes(req)
            hit = cache.match(usable)
            cache.pin(usable[:hit])
            need = max(0, need - hit * cache.blocks_per_entry)
        self.blocks.allocate(need)
        req.blocks = need
        self.reserved_pins[req.id] = hit
        req.decode_cached_tokens = hit * cache.block_tokens if cache is not None else 0

    def take_reserved_pins(self, req: Request) -> None:
        """The hand-off arrived: the pinned leading blocks are the request's own pins."""
        req.cache_pins = self.reserved_pins.pop(req.id, 0)

    def cancel(self, req: Request) -> None:
        self.blocks.release(req.blocks)
        req.blocks = 0
        pins = self.reserved_pins.pop(req.id, 0)
        if pins and self.cache is not None and req.block_hashes:
            self.cache.unpin(req.block_hashes[:pins])
        req.decode_cached_tokens = 0

    # ----- KV tiers ----------------------------------------------------------------------
    def attach_below(self, below: Below | None) -> None:
        if self.cache is not None:
            self.cache.below = below

    def stage(self, head: list[int], loaded: list[int]) -> None:
        """Blocks loaded from a lower tier become unpinned HBM cache entries; ``head`` (the
        prompt's blocks already cached) is kept from eviction while room is made. If the
        room cannot be had, the loaded blocks are dropped."""
        cache = self.cache
        if cache is None:
            return
        fresh = [h for h in loaded if h not in cache.entries]
        need = len(fresh) * cache.blocks_per_entry
        present = [h for h in head if h in cache.entries]
        cache.pin(present)
        if self.blocks.can_allocate(need):
            self.blocks.allocate(need)
            cache.insert(fresh)
        cache.unpin(present)

    def reset(self) -> None:
        """The device lost its memory."""
        self.blocks.reset()
        self.reserved_pins.clear()
