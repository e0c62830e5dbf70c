"""KV tiers below an instance's HBM prefix cache: host DRAM, local NVMe, a shared pool.

The HBM prefix cache (:mod:`simulator.engine.prefix_cache`) holds hash blocks of
finished prompts in device memory. With tiers configured, a block the HBM cache evicts
is not dropped but offloaded to the first lower tier; a tier that is full pushes its
least-recently-used block down to the next one, and the last private tier's overflow
is dropped. The shared pool, when there is one, is written through: every block HBM
evicts is also put there (LMCache stores to each of its backends, Mooncake Store
receives every block its clients put), so other instances can find it. A prompt whose
leading blocks are found below HBM loads them back instead of recomputing them.

This follows vLLM's KV offloading connector (``vllm/v1/kv_offload/``, v0.11:
``OffloadingConnector`` with the CPU backend, ``--kv-offloading-backend native
--kv-offloading-size``; an LRU block pool on the host, asynchronous D2H stores and H2D
loads on their own CUDA streams), LMCache's local CPU and local disk backends
(``LMCACHE_LOCAL_CPU``, ``LMCACHE_LOCAL_DISK``, ``LMCACHE_MAX_LOCAL_CPU_SIZE``), and
Mooncake Store (FAST'25) for the pool every instance shares over RDMA.

Accounting rule: the private tiers of one instance (HBM, DRAM, SSD) are **exclusive**:
a block is in at most one of them. A load moves the block up into HBM and out of the
tier it came from; an offload moves it down. (vLLM's CPU pool keeps its copy after a
load; the simulator moves it instead, so that capacity is never counted twice, and says
so in docs/kv_tiers.md.) The shared pool is a cache every instance reads: a load copies
from it and it keeps its block, as Mooncake Store's ``Get`` does.

Pure bookkeeping: no SimPy, no byte rates. The engine turns the counts this module
returns into flows on the network fabric.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

TIER_NAMES = ("dram", "ssd", "remote")
"""Tier kinds from the fastest to the slowest; HBM sits above all of them."""


class TierStore:
    """One tier's hash blocks in LRU order, with a capacity in blocks."""

    __slots__ = ("capacity", "entries", "name")

    def __init__(self, name: str, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"tier {name!r} holds {capacity} blocks; need at least 1")
        self.name = name
        self.capacity = capacity
        self.entries: OrderedDict[int, None] = OrderedDict()

    def __contains__(self, h: int) -> bool:
        return h in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, h: int) -> list[int]:
        """Store ``h`` as the most recent block; return the blocks pushed out (oldest)."""
        entries = self.entries
        if h in entries:
            entries.move_to_end(h)
            return []
        entries[h] = None
        out: list[int] = []
        while len(entries) > self.capacity:
            old, _ = entries.popitem(last=False)
            out.append(old)
        return out

    def touch(self, h: int) -> None:
        self.entries.move_to_end(h)

    def remove(self, h: int) -> None:
        del self.entries[h]


@dataclass
class TierCounters:
    """Blocks moved per tier, for the summary (bytes = blocks x bytes per block)."""

    loads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIER_NAMES, 0))
    """Blocks loaded from this tier into HBM (prefix hits below HBM)."""
    writes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TIER_NAMES, 0))
    """Blocks written into this tier (offloads from above)."""
    dropped: int = 0
    """Blocks that fell off the last private tier (gone from this instance's tiers)."""
    discarded: int = 0
    """Private-tier copies dropped because HBM computed the block again."""


class TierStack:
    """The tiers under one instance's HBM: private ones in order, then a shared pool.

    ``shared`` may be the same :class:`TierStore` object in the stacks of several
    instances (a cluster-wide pool); private stores belong to one stack only.
    """

    def __init__(self, private: Iterable[TierStore], shared: TierStore | None = None) -> None:
        self.private = list(private)
        self.shared = shared
        self.counters = TierCounters()
        names = [t.name for t in self.levels]
        if len(set(names)) != len(names):
            raise ValueError(f"tiers repeat a kind: {names}")

    @property
    def levels(self) -> list[TierStore]:
        return self.private + ([self.shared] if self.shared is not None else [])

    # ----- down: offload -------------------------------------------------------------
    def offload(self, hashes: Iterable[int]) -> dict[str, int]:
        """HBM evicted ``hashes``: store them in the first tier, cascading overflow down.

        Returns the blocks written into each tier by this call (cascades included).
        """
        written: dict[str, int] = {}
        counters = self.counters
        shared = self.shared
        for h in hashes:
            if shared is not None:
                if h in shared:
                    shared.touch(h)  # the pool has it already: nothing to write
                else:
                    written[shared.name] = written.get(shared.name, 0) + 1
                    counters.writes[shared.name] += 1
                    shared.put(h)  # what the pool pushes out is gone for good
            moving = [h]
            for level in self.private:
                if not moving:
                    break
                pushed: list[int] = []
                for x in moving:
                    written[level.name] = written.get(level.name, 0) + 1
                    counters.writes[level.name] += 1
                    pushed.extend(level.put(x))
                moving = pushed
            counters.dropped += len(moving)
        return written

    # ----- up: a prefix hit below HBM ------------------------------------------------
    def lookup(self, hashes: Iterable[int]) -> list[str]:
        """Tier of each leading block of ``hashes`` found below HBM (stops at a miss)."""
        out: list[str] = []
        levels = self.levels
        for h in hashes:
            found = next((level.name for level in levels if h in level), None)
            if found is None:
                break
            out.append(found)
        return out

    def take(self, hashes: Iterable[int]) -> dict[str, int]:
        """Load the leading found blocks of ``hashes`` into HBM; return blocks per tier.

        A private tier gives its block up (it now lives in HBM); the shared pool keeps
        its copy and counts it as most recently used.
        """
        taken: dict[str, int] = {}
        for h in hashes:
            level = next((t for t in self.levels if h in t), None)
            if level is None:
                break
            if level is self.shared:
                level.touch(h)
            else:
                level.remove(h)
            taken[level.name] = taken.get(level.name, 0) + 1
            self.counters.loads[level.name] += 1
        return taken

    def discard(self, hashes: Iterable[int]) -> None:
        """HBM holds ``hashes`` afresh (recomputed): private tiers drop their copies."""
        for h in hashes:
            for level in self.private:
                if h in level:
                    level.remove(h)
                    self.counters.discarded += 1

    # ----- host memory lent to swapped-out requests ---------------------------------
    def lend(self, name: str, blocks: int) -> dict[str, int] | None:
        """Take ``blocks`` blocks of private tier ``name``'s capacity for swapped KV: its
        oldest cached blocks move down to the next private tiers (or are dropped). Returns
        the blocks written into each lower tier, or None (nothing changed) if the tier is
        too small. Swapped KV and cached blocks thus never share the same bytes."""
        level = next(t for t in self.private if t.name == name)
        if level.capacity - blocks < 0:
            return None
        level.capacity -= blocks
        moving: list[int] = []
        while len(level.entries) > level.capacity:
            moving.append(level.entries.popitem(last=False)[0])
        written: dict[str, int] = {}
        for lower in self.private[self.private.index(level) + 1:]:
            if not moving:
                break
            pushed: list[int] = []
            for x in moving:
                written[lower.name] = written.get(lower.name, 0) + 1
                self.counters.writes[lower.name] += 1
                pushed.extend(lower.put(x))
            moving = pushed
        self.counters.dropped += len(moving)
        return written

    def give_back(self, name: str, blocks: int) -> None:
        """Swapped KV left tier ``name``: its capacity returns to the cache."""
        level = next(t for t in self.private if t.name == name)
        level.capacity += blocks

    def holders(self, h: int) -> list[str]:
        """Names of the tiers holding ``h`` (tests check the private ones are exclusive)."""
        return [t.name for t in self.levels if h in t]
