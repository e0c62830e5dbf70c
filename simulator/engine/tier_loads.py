"""Prefix hits below HBM: load the blocks, then queue the request for prefill.

When a request is sent to an instance whose prompt continues, past what the HBM prefix
cache holds, with blocks a lower tier holds, those blocks are loaded first (a flow per
rank on the fabric, :mod:`simulator.engine.tier_io`) and put into the HBM cache; the
request joins the instance's queue when they have arrived, and its admission then
finds them in HBM like any other prefix hit. The instance keeps stepping its other
requests meanwhile. This is SGLang HiCache's prefetch on enqueue
(``python/sglang/srt/managers/scheduler.py`` with ``--enable-hierarchical-cache``:
the host/storage prefix of a new request is loaded while it waits) and the
asynchronous load of vLLM's offloading connector (a request with external hits waits
in ``WAITING_FOR_REMOTE_KVS`` while others run); one difference from vLLM is that the
load starts when the request arrives rather than when it reaches the head of the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

import simpy

from simulator.engine.fabric import Fabric
from simulator.engine.kv_tiers import TIER_NAMES, TierStack, TierStore
from simulator.engine.request import Request
from simulator.engine.tier_io import TierIO, TierRoute

if TYPE_CHECKING:
    from simulator.engine.instance import Instance


class TierLoader:
    """Every instance's tier traffic in one cluster; see the module docstring."""

    def __init__(self, env: simpy.Environment, fabric: Fabric,
                 tiers: list[tuple[TierRoute, ...]], block_tokens: int,
                 reroute: Callable[[Request], None]) -> None:
        self.env = env
        self.block_tokens = block_tokens
        self.reroute = reroute
        shared: TierStore | None = None
        self.io: dict[int, TierIO] = {}
        self.sharers: list[Instance] = []
        for i, routes in enumerate(tiers):
            if not routes:
                continue
            private = [TierStore(r.name, r.capacity_blocks) for r in routes if r.name != "remote"]
            pool = next((r for r in routes if r.name == "remote"), None)
            if pool is not None and shared is None:
                shared = TierStore("remote", pool.capacity_blocks)  # one pool per cluster
            stack = TierStack(private, shared if pool is not None else None)
            self.io[i] = TierIO(env, fabric, stack, {r.name: r for r in routes})

    def enqueue(self, inst: Instance, req: Request) -> None:
        """Queue ``req`` on ``inst``, after loading its prefix from a lower tier if any."""
        io = self.io.get(inst.index)
        if io is None or not req.block_hashes:
            inst.enqueue(req)
            return
        b = self.block_tokens
        usable = req.block_hashes[:min(len(req.block_hashes), (req.prompt_tokens - 1) // b)]
        hit = inst.prefix_match_tokens(req) // b
        if io.stack.shared is not None:
            # The shared pool is written by every instance's evictions, and an instance in
            # a decode jump books them lazily: bring each writer up to date (its gate does)
            # before reading the pool, as step-by-step simulation would have them.
            for other in self.sharers:
                _ = other.kv_load
        found = io.lookup(usable[hit:])
        if not found:
            inst.enqueue(req)
            return
        hashes = usable[hit:hit + len(found)]
        taken, done = io.load(hashes)
        if req.prefill_start_s != req.prefill_start_s:  # NaN: its first prefill, counted once
            req.dram_hit_tokens += taken.get("dram", 0) * b
            req.ssd_hit_tokens += taken.get("ssd", 0) * b
            req.remote_hit_tokens += taken.get("remote", 0) * b
        self.env.process(self._after_load(inst, req, usable[:hit], hashes, done))

    def _after_load(self, inst: Instance, req: Request, head: list[int], hashes: list[int],
                    done: simpy.Event) -> Generator[simpy.Event, Any, None]:
        start, attempt = self.env.now, req.restarts
        ok = yield done
        req.kv_load_s += self.env.now - start
        if req.restarts != attempt:
            return
        if ok and inst.accepting:
            inst.stage_prefix(head, hashes)
            inst.enqueue(req)
        else:  # the instance went away (or a link died): its loaded blocks are lost
            self.reroute(req)

    def bind(self, instances: list[Instance]) -> None:
        """The cluster's instances, built after this loader; those sharing the pool."""
        self.sharers = [x for x in instances
                        if (io := self.io.get(x.index)) is not None and io.stack.shared is not None]

    def summary(self) -> dict[str, float]:
        """Bytes read from and written to each tier, over every instance."""
        out: dict[str, float] = {}
        for name in TIER_NAMES:
            out[f"kv_tier_{name}_bytes_read"] = sum(io.bytes_read[name] for io in self.io.values())
            out[f"kv_tier_{name}_bytes_written"] = sum(io.bytes_written[name]
                                                       for io in self.io.values())
        return out

    def below(self, index: int) -> TierIO | None:
        """What sits under instance ``index``'s HBM prefix cache."""
        return self.io.get(index)
