"""One serving instance: a TP x PP group of devices with a scheduler and a KV cache.

Its SimPy process loops: form a batch (continuous batching), ask the cost model how long
the step takes, ``yield env.timeout(seconds)``, then apply the step's results. The
role decides what happens when a prompt is prefilled: a colocated instance keeps
decoding it, a prefill instance hands it to the cluster for a KV transfer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import simpy

from simulator.cost.batch import BatchShape
from simulator.cost.step import InstanceCostModel
from simulator.engine.config import SchedulerSpec
from simulator.engine.kv import BlockManager
from simulator.engine.request import Request

if TYPE_CHECKING:
    from simulator.engine.recorder import Recorder


@dataclass(slots=True)
class Batch:
    chunks: list[tuple[Request, int]]
    decodes: list[Request]


class Instance:
    def __init__(
        self,
        env: simpy.Environment,
        index: int,
        name: str,
        pool: str,
        role: str,
        cost: InstanceCostModel,
        kv_blocks: int,
        block_size: int,
        scheduler: SchedulerSpec,
        recorder: Recorder,
        on_prefilled: Callable[[Instance, Request], None],
        on_complete: Callable[[Instance, Request], None],
        on_kv_freed: Callable[[Instance], None],
    ) -> None:
        self.env = env
        self.index = index
        self.name = name
        self.pool = pool
        self.role = role
        self.cost = cost
        self.kv = BlockManager(kv_blocks, block_size)
        self.sched = scheduler
        self.recorder = recorder
        self._on_prefilled = on_prefilled
        self._on_complete = on_complete
        self._on_kv_freed = on_kv_freed
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.held = 0  # requests whose KV waits for a transfer out (prefill role)
        self.reserved = 0  # requests whose KV is reserved for a transfer in (decode role)
        self.queued_tokens = 0
        self.busy_s = 0.0
        self._wake: simpy.Event | None = None
        self.process = env.process(self._run())

    # ----- load signals the router reads ---------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + self.reserved

    @property
    def kv_load(self) -> float:
        return self.kv.used / self.kv.total if self.kv.total else 1.0

    # ----- inputs ----------------------------------------------------------------------
    def enqueue(self, req: Request) -> None:
        """A new (or re-routed) request waits here for prefill."""
        self.waiting.append(req)
        self.queued_tokens += req.prefill_target
        self.wake()

    def try_reserve(self, req: Request) -> bool:
        """Decode role: reserve KV for an incoming request's prompt, if there is room."""
        if len(self.running) + self.reserved >= self.sched.max_num_seqs:
            return False
        need = self.kv.blocks_for(req.context_tokens + 1)
        if not self.kv.can_allocate(need):
            return False
        self.kv.allocate(need)
        req.blocks = need
        self.reserved += 1
        return True

    def admit_transferred(self, req: Request) -> None:
        """Decode role: the request's KV has arrived; it joins the decode batch."""
        self.reserved -= 1
        req.prefilled = req.prefill_target
        req.status = "decode"
        self.running.append(req)
        self.wake()

    def release_held(self, req: Request) -> None:
        """Prefill role: the request's KV has left; free its blocks."""
        self.kv.release(req.blocks)
        req.blocks = 0
        self.held -= 1
        self._on_kv_freed(self)
        self.wake()

    def wake(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ----- the loop ------------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            batch = self._schedule()
            if batch is None:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            shape = BatchShape.build(
                ((n, r.prefilled, r.prefilled + n >= r.prefill_target) for r, n in batch.chunks),
                (r.context_tokens for r in batch.decodes),
            )
            step = self.cost.step(shape)
            start = env.now
            yield env.timeout(step.seconds)
            self.busy_s += step.seconds
            self.recorder.step(
                self.index, start, step.seconds, shape.prefill_tokens, shape.prefill_seqs,
                shape.decode_seqs, shape.decode_ctx_tokens, self.kv.used, self.kv.total,
                len(self.waiting), len(self.running), step.bound,
            )
            self._finish(batch, start)

    # ----- scheduling ------------------------------------------------------------------
    def _schedule(self) -> Batch | None:
        if self.sched.chunked_prefill:
            return self._schedule_mixed()
        return self._schedule_prefill_first()

    def _grow_for_decode(self, req: Request) -> bool:
        """Make sure ``req`` has KV blocks for one more token, preempting if needed.

        Returns False if ``req`` itself had to be preempted.
        """
        need = self.kv.blocks_for(req.context_tokens) - req.blocks
        while need > 0 and not self.kv.can_allocate(need):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is req:
                return False
        if need > 0:
            self.kv.allocate(need)
            req.blocks += need
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.release(req.blocks)
        req.reset_for_recompute()
        req.status = "queued"
        self.waiting.appendleft(req)
        self.queued_tokens += req.prefill_target
        self.recorder.event(self.env.now, "preempt", f"{self.name} request {req.id}")

    def _decodes(self, budget: int) -> list[Request]:
        decodes: list[Request] = []
        for req in list(self.running):
            if budget <= 0:
                break
            if req.status != "decode":  # still prefilling, or preempted in this loop
                continue
            if self._grow_for_decode(req):
                decodes.append(req)
                budget -= 1
        return [r for r in decodes if r.status == "decode"]

    def _admit(self, req: Request) -> bool:
        """Move the head of the waiting queue into running if its prompt's KV fits."""
        need = self.kv.blocks_for(req.prefill_target + 1)
        if not self.kv.can_allocate(need):
            return False
        self.kv.allocate(need)
        req.blocks = need
        self.waiting.popleft()
        self.queued_tokens -= req.prefill_target
        self.running.append(req)
        if req.prefill_start_s != req.prefill_start_s:  # NaN: first admission
            req.prefill_start_s = self.env.now
        req.status = "prefill"
        return True

    def _schedule_mixed(self) -> Batch | None:
        """Decode-first continuous batching with chunked prefill (vLLM V1 default)."""
        budget = self.sched.max_num_batched_tokens
        decodes = self._decodes(budget) if self.role != "prefill" else []
        budget -= len(decodes)
        chunks: list[tuple[Request, int]] = []
        for req in self.running:
            if budget <= 0:
                break
            if req.in_prefill:
                n = min(req.prefill_target - req.prefilled, budget)
                chunks.append((req, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) + self.held < self.sched.max_num_seqs:
            req = self.waiting[0]
            if not self._admit(req):
                break
            n = min(req.prefill_target, budget)
            chunks.append((req, n))
            budget -= n
        if not chunks and not decodes:
            return None
        return Batch(chunks, decodes)

    def _schedule_prefill_first(self) -> Batch | None:
        """Without chunked prefill: whole prompts first, decode steps only when none fit."""
        budget = self.sched.max_num_batched_tokens
        chunks: list[tuple[Request, int]] = []
        while self.waiting and len(self.running) + self.held < self.sched.max_num_seqs:
            req = self.waiting[0]
            n = req.prefill_target
            if n > budget and chunks:  # a prompt larger than the budget runs alone
                break
            if not self._admit(req):
                break
            chunks.append((req, n))
            budget -= n
        if chunks:
            return Batch(chunks, [])
        if self.role == "prefill":
            return None
        decodes = self._decodes(self.sched.max_num_seqs)
        return Batch([], decodes) if decodes else None

    # ----- results of a step -----------------------------------------------------------
    def _finish(self, batch: Batch, start: float) -> None:
        now = self.env.now
        for req in batch.decodes:
            if req.decode_start_s != req.decode_start_s:  # NaN: its first decode step
                req.decode_start_s = start
            req.generated += 1
            if req.done:
                self._complete(req)
        for req, n in batch.chunks:
            req.prefilled += n
            if req.prefilled < req.prefill_target:
                continue
            req.generated += 1
            if req.first_token_s != req.first_token_s:  # NaN: the very first prefill
                req.first_token_s = now
                req.prefill_end_s = now
                req.prefill_instance = self.index
            if req.done:
                self._complete(req)
            elif self.role == "prefill":
                self.running.remove(req)
                self.held += 1
                req.status = "transfer"
                self._on_prefilled(self, req)
            else:
                req.status = "decode"
                if req.decode_instance < 0:
                    req.decode_instance = self.index

    def _complete(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.release(req.blocks)
        req.blocks = 0
        req.completion_s = self.env.now
        req.status = "completed"
        if req.decode_instance < 0 and self.role != "prefill":
            req.decode_instance = self.index
        self._on_kv_freed(self)
        self._on_complete(self, req)
