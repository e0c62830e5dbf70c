"""Swap-to-host preemption (``scheduler.preemption: swap``).

A decoding request preempted for lack of KV keeps its KV: its blocks are copied to the
instance's host-DRAM tier (device-to-host over each rank's PCIe link, a flow on the
fabric like a tier store) and its HBM blocks are freed. It waits, ``SWAPPED``, until the
instance has room for its context again; then the blocks are booked in HBM, copied back
(host-to-device, awaited like a tier load: ``latency + bytes / bandwidth`` when alone)
and it resumes decoding where it stopped, without recomputing its prompt.

This follows vLLM V0 (``vllm/core/scheduler.py``, v0.6: ``PreemptionMode.SWAP``,
``_preempt_by_swap`` / ``_schedule_swapped``, host blocks from ``--swap-space``): the
swapped queue is served before new prompts, a step that preempted swaps nothing in, and
no new prompt is admitted while a request is swapped out (here: or
being copied back). vLLM V1 only recomputes.
Differences: vLLM V0 copies blocks inside the step (``cache_engine.swap_in/out`` before
the model runs) and aborts a request when its swap space is full; here the copies are
asynchronous flows and a request the host cannot hold is recomputed instead. The host
memory is the DRAM tier's: swapped KV takes capacity from the prefix-cache blocks the
tier holds (:meth:`~simulator.engine.kv_tiers.TierStack.lend`), so no byte is counted
twice.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from typing import Any

import simpy

from simulator.engine.fabric import FlowSpec
from simulator.engine.request import Request, State
from simulator.engine.tier_io import TierIO


class HostSwap:
    """The swapped-out requests of one instance and their copies (module docstring)."""

    def __init__(self, env: simpy.Environment, io: TierIO, block_size: int,
                 hash_block_tokens: int) -> None:
        self.env = env
        self.io = io
        self.route = io.routes["dram"]
        # A KV block's share of one hash block's bytes (the route's streams are per hash block).
        self.kv_block_share = block_size / hash_block_tokens
        self.block_size = block_size
        self.hash_block_tokens = hash_block_tokens
        self.queue: deque[Request] = deque()  # swapped out (or on their way), oldest first
        self.ready: set[int] = set()  # ids whose swap-out copy has finished
        self.incoming: dict[int, Request] = {}  # swap-ins being copied back
        self.lent: dict[int, int] = {}  # host (DRAM-tier) blocks each swapped request holds
        self.kv_blocks: dict[int, int] = {}  # KV blocks each swapped request had in HBM
        self.bytes_out = 0.0
        self.bytes_in = 0.0
        self.swap_outs = 0
        self.swap_ins = 0

    @property
    def pending(self) -> int:
        """Requests swapped out or being swapped in."""
        return len(self.queue) + len(self.incoming)

    def _specs(self, streams: Any, kv_blocks: int) -> list[FlowSpec]:
        share = kv_blocks * self.kv_block_share
        return [FlowSpec(res, per_block * share) for res, per_block in streams]

    # ----- out -------------------------------------------------------------------------
    def swap_out(self, req: Request, kv_blocks: int, on_done: Callable[[], None]) -> bool:
        """Copy ``req``'s ``kv_blocks`` KV blocks to host memory; False (nothing done) if
        the host tier cannot hold them."""
        host = -(-(kv_blocks * self.block_size) // self.hash_block_tokens)  # DRAM-tier blocks
        written = self.io.stack.lend("dram", host)
        if written is None:
            return False
        for name, n in written.items():  # cached blocks the swapped KV pushed down
            route = self.io.routes[name]
            self.io.bytes_written[name] += n * route.block_bytes
            self.io.fabric.start([FlowSpec(res, pb * n) for res, pb in route.write])
        self.lent[req.id] = host
        self.kv_blocks[req.id] = kv_blocks
        self.queue.append(req)
        req.move_to(State.SWAPPED)
        req.preemptions += 1
        req.swaps += 1
        nbytes = kv_blocks * self.kv_block_share * self.route.block_bytes
        req.swap_bytes += nbytes
        self.swap_outs += 1
        self.bytes_out += nbytes
        specs = self._specs(self.route.write, kv_blocks)
        self.env.process(self._copy_out(req, specs, on_done))
        return True

    def _copy_out(self, req: Request, specs: list[FlowSpec], on_done: Callable[[], None]
                  ) -> Generator[simpy.Event, Any, None]:
        yield from self.io.fabric.send(specs, 0.0)
        if req.id in self.lent:  # not lost to a fault meanwhile
            self.ready.add(req.id)
            on_done()

    # ----- in --------------------------------------------------------------------------
    def next_ready(self) -> Request | None:
        """The oldest swapped-out request whose copy to the host has finished."""
        if self.queue and self.queue[0].id in self.ready:
            return self.queue[0]
        return None

    def swap_in(self, req: Request, on_done: Callable[[Request], None]) -> None:
        """Copy ``req``'s blocks back (its HBM blocks are booked by the caller)."""
        assert self.queue[0] is req
        self.queue.popleft()
        self.ready.discard(req.id)
        self.incoming[req.id] = req
        kv_blocks = self.kv_blocks.pop(req.id)
        self.swap_ins += 1
        self.bytes_in += kv_blocks * self.kv_block_share * self.route.block_bytes
        specs = self._specs(self.route.read, kv_blocks)
        self.env.process(self._copy_in(req, specs, on_done))

    def _copy_in(self, req: Request, specs: list[FlowSpec],
                 on_done: Callable[[Request], None]) -> Generator[simpy.Event, Any, None]:
        yield from self.io.fabric.send(specs, self.route.latency_s)
        if self.incoming.pop(req.id, None) is None:
            return  # lost to a fault meanwhile
        self.io.stack.give_back("dram", self.lent.pop(req.id))
        on_done(req)

    # ----- cancellation --------------------------------------------------------------
    def drop(self, req: Request) -> bool:
        """The client gave up on ``req``: free its host copy (and forget a copy back in
        flight, whose HBM booking the caller frees). False if ``req`` is not here."""
        if req.id not in self.lent:
            return False
        if req.id in self.incoming:
            del self.incoming[req.id]
        else:
            self.queue.remove(req)
            self.ready.discard(req.id)
            self.kv_blocks.pop(req.id, None)
        self.io.stack.give_back("dram", self.lent.pop(req.id))
        return True

    # ----- faults ------------------------------------------------------------------------
    def lose_all(self) -> list[Request]:
        """The instance failed: every swapped request must be prefilled again."""
        lost = list(self.queue) + list(self.incoming.values())
        for host in self.lent.values():
            self.io.stack.give_back("dram", host)
        self.queue.clear()
        self.ready.clear()
        self.incoming.clear()
        self.lent.clear()
        self.kv_blocks.clear()
        return lost
