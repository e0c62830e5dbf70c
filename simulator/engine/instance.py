"""One serving instance: a TP x PP group of devices with a scheduler and a KV cache.

Its SimPy process loops: form a batch (continuous batching), ask the cost model how long
the step takes, ``yield env.timeout(seconds)``, then apply the step's results. The role
decides what happens when a prompt is prefilled: a colocated instance keeps decoding it,
a prefill instance hands it to the cluster for a KV transfer.

Two refinements keep this fast and faithful:

* **Pipeline parallelism** (``pp > 1``, GPU stages or LPU chip groups): micro-batches
  flow through the stages; a new one enters stage 0 as soon as it is free, so up to
  ``pp`` batches are in flight (as vLLM's virtual engines do). A batch's exit time follows
  from the stage recurrence ``finish[s] = max(finish[s-1], free[s]) + stage[s]`` — no
  event per stage.
* **Decode fast-forward** (``pp == 1``): when the batch is decode-only and cannot change
  until a known step (the first completion, or the first step whose KV growth would not
  fit), the steps are priced in one vectorised call and the clock jumps to the end. An
  arrival during the jump cuts it at the end of the step then running; the results are
  those of step-by-step simulation.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from simulator.cost.batch import BatchShape
from simulator.cost.step import InstanceCostModel, StepCost
from simulator.engine.config import SchedulerSpec
from simulator.engine.kv import BlockManager
from simulator.engine.prefix_cache import PrefixCache
from simulator.engine.request import Request

if TYPE_CHECKING:
    from simulator.engine.recorder import Recorder

_MIN_JUMP = 3


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
        fast_forward: bool = True,
        prefix_block_tokens: int = 512,
        first_token: str = "decode_recompute",
    ) -> None:
        self.env = env
        self.index = index
        self.name = name
        self.pool = pool
        self.role = role
        self.cost = cost
        cache = None
        if scheduler.prefix_caching and role != "decode":
            cache = PrefixCache(prefix_block_tokens, block_size)
        self.cache = cache
        self.kv = BlockManager(kv_blocks, block_size, cache)
        self.sched = scheduler
        # A prefill instance under vLLM's decode_recompute emits no client token: the
        # decode side recomputes the last prompt token and emits token 1.
        self.emits_first_token = role != "prefill" or first_token == "forwarded_after_transfer"
        self.recorder = recorder
        self._on_prefilled = on_prefilled
        self._on_complete = on_complete
        self._on_kv_freed = on_kv_freed
        # Called when a request's prefill first starts (a layer-wise KV stream opens).
        self.on_prefill_start: Callable[[Instance, Request], None] | None = None
        self.pp = cost.parallelism.pp
        self.fast_forward = fast_forward and self.pp == 1
        # With pp micro-batches in flight, each carries up to max_num_seqs sequences.
        self.max_running = scheduler.max_num_seqs * self.pp
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Requests whose KV waits for a transfer out (prefill role) / is reserved for a
        # transfer in (decode role), by request id.
        self.held_reqs: dict[int, Request] = {}
        self.reserved_reqs: dict[int, Request] = {}
        # Fault and scaling state: a failed instance loses its KV and its work; an
        # inactive one is powered off; a draining one takes no new work.
        self.alive = True
        self.active = True
        self.draining = False
        self.epoch = 0
        self.powered_s = 0.0
        self.powered_since: float | None = 0.0
        self.collect_signals = False  # an autoscaler reads recent TTFT/TPOT samples
        self.signal_ttft: list[float] = []
        self.signal_tpot: list[float] = []
        self.queued_tokens = 0
        self.in_flight_batches = 0
        self.speed_factor = 1.0  # > 1 slows every step (a straggler); set by fault injection
        self._wake: simpy.Event | None = None
        self._jumping = False
        self._jump_kv: list[Any] | None = None  # see _jump
        self._jump_ctx: tuple[Any, ...] | None = None
        self._stage_free = [0.0] * self.pp
        self.process = env.process(self._run())

    # ----- load signals the router reads ---------------------------------------------
    @property
    def held(self) -> int:
        return len(self.held_reqs)

    @property
    def reserved(self) -> int:
        return len(self.reserved_reqs)

    @property
    def accepting(self) -> bool:
        """Takes new work: alive, powered and not draining."""
        return self.alive and self.active and not self.draining

    @property
    def idle(self) -> bool:
        return not (self.waiting or self.running or self.held_reqs or self.reserved_reqs
                    or self.in_flight_batches)

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running) + self.reserved

    @property
    def kv_load(self) -> float:
        self._sync_jump_kv()
        return self.kv.used / self.kv.total if self.kv.total else 1.0

    def _sync_jump_kv(self) -> None:
        """During a jump, book the KV growth of the steps that have started by now.

        Step-by-step simulation allocates a step's blocks when the step starts; a jump
        books them lazily, so anyone reading this instance's KV first brings it up to date.
        """
        state = self._jump_kv
        if state is None:
            return
        now = self.env.now
        if now == state[3]:  # already booked at this instant (routers ask many times)
            return
        state[3] = now
        ends, extra, committed = state[0], state[1], state[2]
        j = min(bisect_right(ends, now), len(extra) - 1)
        target = extra[j]
        if target > committed:
            self.kv.allocate(target - committed)
            state[2] = target

    # ----- inputs ----------------------------------------------------------------------
    def enqueue(self, req: Request) -> None:
        """A new (or re-routed) request waits here for prefill."""
        self.waiting.append(req)
        self.queued_tokens += req.prefill_target
        self.wake()

    def can_reserve(self, req: Request) -> bool:
        self._sync_jump_kv()
        if len(self.running) + self.reserved >= self.max_running:
            return False
        return self.kv.can_allocate(self.kv.blocks_for(req.context_tokens + 1))

    def try_reserve(self, req: Request) -> bool:
        """Decode role: reserve KV for an incoming request's prompt, if there is room."""
        if not self.can_reserve(req):
            return False
        need = self.kv.blocks_for(req.context_tokens + 1)
        self.kv.allocate(need)
        req.blocks = need
        self.reserved_reqs[req.id] = req
        if self._jumping:  # less KV for the steps ahead: re-plan at the next boundary
            self._jumping = False
            self.process.interrupt("cut")
        return True

    def cancel_reservation(self, req: Request) -> None:
        """Decode role: an incoming hand-off will not arrive; free what it reserved."""
        if self.reserved_reqs.pop(req.id, None) is not None:
            self.kv.release(req.blocks)
            req.blocks = 0
            self._on_kv_freed(self)

    def admit_transferred(self, req: Request) -> None:
        """Decode role: the request's KV has arrived; it joins the decode batch."""
        del self.reserved_reqs[req.id]
        req.prefilled = req.prefill_target
        req.status = "decode"
        if req.generated and req.first_token_s != req.first_token_s:
            req.first_token_s = self.env.now  # the prefill's token, forwarded with the KV
        self.running.append(req)
        self.wake()

    def release_held(self, req: Request) -> None:
        """Prefill role: the request's KV has left; free its blocks."""
        self._free_request_kv(req, req.src_blocks)
        req.src_blocks = 0
        del self.held_reqs[req.id]
        self._on_kv_freed(self)
        self.wake()

    def wake(self) -> None:
        if not self.alive:
            return
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        elif self._jumping:
            self._jumping = False  # one interrupt per jump
            self.process.interrupt("cut")

    # ----- the loop ------------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            try:
                yield from self._serve()
            except simpy.Interrupt as exc:
                if exc.cause != "fail":
                    raise
            # Failed: nothing runs until recover() revives the instance.
            self._jumping = False
            self._jump_kv = None
            self._wake = None
            self._revive = self.env.event()
            yield self._revive

    def _serve(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            if self.in_flight_batches >= self.pp:
                # Every pipeline slot holds a micro-batch: wait for one to leave.
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            batch = self._schedule()
            if batch is None:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if self.fast_forward and not batch.chunks:
                jump = self._plan_jump(batch.decodes)
                if jump is not None:
                    yield from self._jump(batch.decodes, *jump)
                    continue
            shape = BatchShape.build(
                ((n, r.prefilled, r.prefilled + n >= r.prefill_target) for r, n in batch.chunks),
                (r.context_tokens for r in batch.decodes),
            )
            step = self.cost.step(shape)
            start = env.now
            if self.pp == 1:
                seconds = step.seconds * self.speed_factor
                yield env.timeout(seconds)
                self._record(start, seconds, shape, step)
                self._finish(batch, start)
                continue
            yield from self._pipeline(batch, shape, step)

    # ----- pipeline parallel ---------------------------------------------------------
    def _pipeline(self, batch: Batch, shape: BatchShape,
                  step: StepCost) -> Generator[simpy.Event, Any, None]:
        """Send ``batch`` through the stages; come back when stage 0 can take the next."""
        env = self.env
        stages = step.stage_seconds
        host_s = step.seconds - sum(stages)
        start = env.now
        for req, _ in batch.chunks:
            req.in_flight = True
        for req in batch.decodes:
            req.in_flight = True
        free = self._stage_free
        t = start + host_s * self.speed_factor
        first_stage_done = t
        for s, seconds in enumerate(stages):
            t = max(t, free[s]) + seconds * self.speed_factor
            free[s] = t
            if s == 0:
                first_stage_done = t
        exit_s = t
        self.in_flight_batches += 1
        epoch = self.epoch

        def done(_e: simpy.Event) -> None:
            if epoch != self.epoch:  # the instance failed while this batch was in flight
                return
            self.in_flight_batches -= 1
            for req, _ in batch.chunks:
                req.in_flight = False
            for req in batch.decodes:
                req.in_flight = False
            self._record(start, exit_s - start, shape, step)
            self._finish(batch, start)
            self.wake()

        env.timeout(exit_s - start).callbacks.append(done)
        # The next micro-batch may enter once stage 0 is free (and a slot is, see _serve).
        yield env.timeout(first_stage_done - start)

    # ----- decode fast-forward -------------------------------------------------------
    def _plan_jump(self, decodes: list[Request]) -> tuple[int, np.ndarray, np.ndarray, Any] | None:
        """Steps this decode-only batch can run unchanged, with their costs and bounds."""
        if len(decodes) != len(self.running) or self.speed_factor != 1.0:
            return None
        remaining = min([r.output_tokens - r.generated for r in decodes])
        if remaining < _MIN_JUMP:
            return None
        n = len(decodes)
        ctx = np.array([r.prompt_tokens + r.generated for r in decodes], dtype=np.int64)
        pinned = np.array([self._pinned_blocks(r) for r in decodes], dtype=np.int64)
        held = np.array([r.blocks for r in decodes], dtype=np.int64) + pinned
        bs = self.kv.block_size
        # Step j (0-based) needs ceil((ctx + j) / bs) blocks per sequence before it runs;
        # step 0's blocks were allocated when the batch was formed.
        steps = np.arange(remaining, dtype=np.int64)
        need = -(-(ctx[None, :] + steps[:, None]) // bs) - held[None, :]
        extra = np.maximum(need, 0).sum(axis=1)
        fits = extra <= self.kv.available
        k = int(remaining if fits[-1] else np.argmin(fits))
        if k < _MIN_JUMP:
            return None
        ctx_sums = int(ctx.sum()) + n * steps[:k]
        series = self.cost.decode_series(n, ctx_sums)
        return k, series.seconds, series.bound, (ctx, held, extra[:k], series, pinned)

    def _jump(self, decodes: list[Request], k: int, seconds: np.ndarray,
              bounds: np.ndarray, kv: Any) -> Generator[simpy.Event, Any, None]:
        env = self.env
        start = env.now
        ends = np.cumsum(np.concatenate(([start], seconds)))[1:]
        self._jumping = True
        # [step ends, cumulative extra blocks per step, blocks booked, last booking time]
        self._jump_kv = [ends.tolist(), kv[2].tolist(), 0, -1.0]
        self._jump_ctx = (decodes, start, ends, seconds, bounds, kv)
        done = k
        try:
            yield env.timeout(float(ends[-1]) - start)
        except simpy.Interrupt as exc:
            if exc.cause == "fail":
                raise
            # Something arrived: finish the step that is running, then re-plan.
            done = min(int(np.searchsorted(ends, env.now, side="left")) + 1, k)
            if float(ends[done - 1]) > env.now:
                yield env.timeout(float(ends[done - 1]) - env.now)
        finally:
            self._jumping = False
            self._jump_ctx = None
        committed = self._jump_kv[2]
        self._jump_kv = None
        self._apply_jump(decodes, done, start, ends, seconds, bounds, kv, committed)

    def _apply_jump(self, decodes: list[Request], done: int, start: float, ends: np.ndarray,
                    seconds: np.ndarray, bounds: np.ndarray, kv: Any, committed: int) -> None:
        ctx, held, extra, series, pinned = kv
        bs = self.kv.block_size
        starts = np.concatenate(([start], ends[: done - 1]))
        n = len(decodes)
        kv_used = self.kv.used - committed + extra[:done]
        rest = int(extra[done - 1]) - committed
        if rest >= 0:
            self.kv.allocate(rest)
        else:  # a reader booked the step that starts exactly at the cut: give it back
            self.kv.release(-rest)
        blocks = (np.maximum(held, -(-(ctx + done - 1) // bs)) - pinned).tolist()
        self.recorder.steps_bulk(
            self.index, starts, seconds[:done], n, int(ctx.sum()) + n * np.arange(done),
            kv_used, self.kv.total, len(self.waiting), len(self.running), bounds[:done],
            series.compute_s[:done], series.memory_s[:done],
        )
        finished = []
        for r, b in zip(decodes, blocks, strict=True):
            r.blocks = b
            if r.decode_start_s != r.decode_start_s:
                r.decode_start_s = start
            g = r.generated
            if g == 0 and r.first_token_s != r.first_token_s:
                r.first_token_s = float(ends[0])
            if g <= 1 and g + done >= 2 and r.second_token_s != r.second_token_s:
                r.second_token_s = float(ends[1 - g])
            r.generated += done
            if r.generated >= r.output_tokens:
                finished.append(r)
        for r in finished:
            r.generated = r.output_tokens
            self._complete(r)

    # ----- scheduling ------------------------------------------------------------------
    def _schedule(self) -> Batch | None:
        if self.sched.chunked_prefill:
            return self._schedule_mixed()
        return self._schedule_prefill_first()

    def _grow_for_decode(self, req: Request) -> bool:
        """Make sure ``req`` has KV blocks for one more token, preempting if needed.

        Returns False if ``req`` cannot decode this step (it was preempted, or every
        possible victim is in flight in another micro-batch).
        """
        need = self.kv.blocks_for(req.context_tokens) - req.blocks - self._pinned_blocks(req)
        while need > 0 and not self.kv.can_allocate(need):
            victim = next((r for r in reversed(self.running) if not r.in_flight), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is req:
                return False
        if need > 0:
            self.kv.allocate(need)
            req.blocks += need
        return True

    def _free_request_kv(self, req: Request, owned: int) -> None:
        """Give back a request's KV; with a prefix cache its full prompt blocks stay cached."""
        cache = self.cache
        if cache is None or not req.block_hashes:
            self.kv.release(owned)
            return
        pins = req.cache_pins
        full = min(len(req.block_hashes), req.prompt_tokens // cache.block_tokens)
        computed = req.block_hashes[pins:full]
        kept = cache.insert(computed) * cache.blocks_per_entry
        kept = min(kept, owned)
        self.kv.release(owned - kept)
        cache.unpin(req.block_hashes[:pins])
        req.cache_pins = 0

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._free_request_kv(req, req.blocks)
        req.reset_for_recompute()
        req.status = "queued"
        self.waiting.appendleft(req)
        self.queued_tokens += req.prefill_target
        self.recorder.event(self.env.now, "preempt", f"{self.name} request {req.id}")

    def _decodes(self, budget: int) -> list[Request]:
        decodes: list[Request] = []
        limit = min(budget, self.sched.max_num_seqs)
        for req in list(self.running):
            if len(decodes) >= limit:
                break
            if req.status != "decode" or req.in_flight:
                continue
            if self._grow_for_decode(req):
                decodes.append(req)
        return [r for r in decodes if r.status == "decode"]

    def _usable_hashes(self, req: Request) -> list[int]:
        """Hash blocks of the prompt a cache hit may cover (at least one token is computed)."""
        cache = self.cache
        if cache is None or not req.block_hashes:
            return []
        limit = min(len(req.block_hashes), (req.prompt_tokens - 1) // cache.block_tokens)
        return req.block_hashes[:limit]

    def _pinned_blocks(self, req: Request) -> int:
        """KV blocks of ``req`` that the prefix cache owns (its pinned leading blocks)."""
        return req.cache_pins * self.cache.blocks_per_entry if self.cache is not None else 0

    def prefix_match_tokens(self, req: Request) -> int:
        """Prompt tokens this instance's prefix cache would spare ``req`` now."""
        if self.cache is None:
            return 0
        return self.cache.match(self._usable_hashes(req)) * self.cache.block_tokens

    def _admit(self, req: Request) -> bool:
        """Move the head of the waiting queue into running if its prompt's KV fits."""
        hit = 0
        cache = self.cache
        if cache is not None:
            usable = self._usable_hashes(req)
            hit = cache.match(usable)
            cache.pin(usable[:hit])
        need = self.kv.blocks_for(req.prefill_target + 1)
        if hit:
            need = max(0, need - hit * cache.blocks_per_entry)  # type: ignore[union-attr]
        if not self.kv.can_allocate(need):
            if hit:
                cache.unpin(req.block_hashes[:hit])  # type: ignore[union-attr, index]
            return False
        self.kv.allocate(need)
        req.blocks = need
        if cache is not None:
            req.cache_pins = hit
            tokens = hit * cache.block_tokens
            if req.prefill_start_s != req.prefill_start_s:  # first admission: record the hit
                req.cached_tokens = tokens
                if tokens:
                    full = self.cost.step(BatchShape.prefill(req.prompt_tokens)).seconds
                    rest = self.cost.step(BatchShape.prefill(req.prompt_tokens, tokens)).seconds
                    req.prefill_saved_s = full - rest
            req.prefilled = tokens
        self.waiting.popleft()
        self.queued_tokens -= req.prefill_target
        self.running.append(req)
        req.status = "prefill"
        if req.prefill_start_s != req.prefill_start_s:  # NaN: first admission
            req.prefill_start_s = self.env.now
            if self.on_prefill_start is not None:
                self.on_prefill_start(self, req)
        return True

    def _room(self) -> bool:
        return len(self.running) + self.held < self.max_running

    def _schedule_mixed(self) -> Batch | None:
        """Decode-first continuous batching with chunked prefill (vLLM V1 default)."""
        budget = self.sched.max_num_batched_tokens
        decodes = self._decodes(budget) if self.role != "prefill" else []
        budget -= len(decodes)
        seqs = len(decodes)
        chunks: list[tuple[Request, int]] = []
        for req in self.running:
            if budget <= 0 or seqs >= self.sched.max_num_seqs:
                break
            if req.in_prefill and not req.in_flight:
                n = min(req.prefill_target - req.prefilled, budget)
                chunks.append((req, n))
                budget -= n
                seqs += 1
        while (self.waiting and budget > 0 and self._room()
               and seqs < self.sched.max_num_seqs):
            req = self.waiting[0]
            if not self._admit(req):
                break
            n = min(req.prefill_target - req.prefilled, budget)
            chunks.append((req, n))
            budget -= n
            seqs += 1
        if not chunks and not decodes:
            return None
        return Batch(chunks, decodes)

    def _schedule_prefill_first(self) -> Batch | None:
        """Without chunked prefill: whole prompts first, decode steps only when none fit."""
        budget = self.sched.max_num_batched_tokens
        chunks: list[tuple[Request, int]] = []
        while self.waiting and self._room() and len(chunks) < self.sched.max_num_seqs:
            req = self.waiting[0]
            if req.prefill_target > budget and chunks:  # a prompt larger than the budget runs alone
                break
            if not self._admit(req):
                break
            n = req.prefill_target - req.prefilled  # cached prefix blocks are skipped
            chunks.append((req, n))
            budget -= n
        if chunks:
            return Batch(chunks, [])
        if self.role == "prefill":
            return None
        decodes = self._decodes(self.sched.max_num_seqs)
        return Batch([], decodes) if decodes else None

    # ----- results of a step -----------------------------------------------------------
    def _record(self, start: float, seconds: float, shape: BatchShape, step: StepCost) -> None:
        # Compute and memory seconds per device: a pipeline's stages run on different GPUs.
        self.recorder.step(
            self.index, start, seconds, shape.prefill_tokens, shape.prefill_seqs,
            shape.decode_seqs, shape.decode_ctx_tokens, self.kv.used, self.kv.total,
            len(self.waiting), len(self.running), step.bound, step.compute_s / self.pp,
            step.memory_s / self.pp,
        )

    # ----- faults and scaling ------------------------------------------------------
    def fail(self) -> tuple[list[Request], list[Request], list[Request]]:
        """Lose every request's KV and stop; return (to recompute, held, reserved).

        Requests waiting or running here must be prefilled again elsewhere; ``held`` ones
        (prefill role) lost the KV they were handing off; ``reserved`` ones (decode role)
        were being sent here and can be sent elsewhere from their prefill instance.
        """
        if self._jump_ctx is not None and self._jump_kv is not None:
            # Book the decode steps of the jump that finished before the failure; the
            # step running at the failure is lost, as it would be step by step.
            decodes, start, ends, seconds, bounds, kv = self._jump_ctx
            done = int(np.searchsorted(ends, self.env.now, side="right"))
            committed = self._jump_kv[2]
            self._jump_kv = None
            self._jump_ctx = None
            if done:
                self._apply_jump(decodes, done, start, ends, seconds, bounds, kv, committed)
        self._sync_jump_kv()
        lost = list(self.waiting) + list(self.running)
        held = list(self.held_reqs.values())
        reserved = list(self.reserved_reqs.values())
        self.waiting.clear()
        self.running.clear()
        self.held_reqs.clear()
        self.reserved_reqs.clear()
        self.queued_tokens = 0
        self.in_flight_batches = 0
        self._stage_free = [self.env.now] * self.pp
        self.kv.reset()
        for req in lost + held + reserved:
            req.in_flight = False
            req.blocks = 0
            req.src_blocks = 0
            req.cache_pins = 0
        self.alive = False
        self.epoch += 1
        if self.process.is_alive:
            self.process.interrupt("fail")
        return lost, held, reserved

    def recover(self) -> None:
        self.alive = True
        self.speed_factor = 1.0
        revive = getattr(self, "_revive", None)
        if revive is not None and not revive.triggered:
            revive.succeed()

    def set_speed(self, factor: float) -> None:
        """Straggler: every step from the next one takes ``factor`` times longer."""
        self.speed_factor = factor
        if self._jumping:
            self._jumping = False
            self.process.interrupt("cut")

    def power(self, on: bool) -> None:
        now = self.env.now
        if on and self.powered_since is None:
            self.powered_since = now
        elif not on and self.powered_since is not None:
            self.powered_s += now - self.powered_since
            self.powered_since = None

    def powered_until(self, end: float) -> float:
        """Seconds this instance was powered from t=0 to ``end``."""
        extra = end - self.powered_since if self.powered_since is not None else 0.0
        return self.powered_s + max(0.0, extra)

    def _finish(self, batch: Batch, start: float) -> None:
        now = self.env.now
        for req in batch.decodes:
            if req.status != "decode":
                continue
            if req.decode_start_s != req.decode_start_s:  # NaN: its first decode step
                req.decode_start_s = start
            req.generated += 1
            if req.generated == 1 and req.first_token_s != req.first_token_s:
                req.first_token_s = now  # decode_recompute: the decode side's first token
            elif req.generated == 2 and req.second_token_s != req.second_token_s:
                req.second_token_s = now
            if req.done:
                self._complete(req)
        for req, n in batch.chunks:
            if req.status != "prefill":
                continue
            req.prefilled += n
            if req.prefilled < req.prefill_target:
                continue
            if req.prefill_end_s != req.prefill_end_s:  # NaN: the very first prefill
                req.prefill_end_s = now
                req.prefill_instance = self.index
                if self.collect_signals:
                    self.signal_ttft.append(now - req.arrival_s)
            if self.emits_first_token:
                req.generated += 1
                # A colocated instance streams the token now; a prefill instance's token
                # reaches the client with the KV (admit_transferred), or now if it was the
                # only one.
                if req.first_token_s != req.first_token_s and (
                        self.role != "prefill" or req.done):
                    req.first_token_s = now
            if req.done:
                self._complete(req)
            elif self.role == "prefill":
                self.running.remove(req)
                self.held_reqs[req.id] = req
                req.src_blocks, req.blocks = req.blocks, 0
                req.status = "transfer"
                self._on_prefilled(self, req)
            else:
                req.status = "decode"
                if req.decode_instance < 0:
                    req.decode_instance = self.index

    def _complete(self, req: Request) -> None:
        if self.collect_signals and req.generated > 1:
            self.signal_tpot.append((self.env.now - req.first_token_s) / (req.generated - 1))
        self.running.remove(req)
        self._free_request_kv(req, req.blocks)
        req.blocks = 0
        req.completion_s = self.env.now
        req.status = "completed"
        if req.decode_instance < 0 and self.role != "prefill":
            req.decode_instance = self.index
        self._on_kv_freed(self)
        self._on_complete(self, req)
