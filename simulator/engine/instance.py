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
* **Decode fast-forward** (``pp == 1``, :mod:`simulator.engine.fast_forward`): a
  decode-only stretch is priced in one vectorised call and the clock jumps to its end.

Everything outside reaches an instance through its public methods and properties, and
each of them passes the fast-forward gate (``@observes`` for reads, ``@mutates`` for
writes), so a jump is brought up to date before it is read and cut before it is changed;
the instance's state itself is private.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from simulator.cost.batch import BatchShape
from simulator.cost.speculative import Acceptance
from simulator.cost.step import InstanceCostModel, StepCost
from simulator.engine.config import SchedulerSpec
from simulator.engine.fast_forward import Jump, mutates, observes, plan_jump
from simulator.engine.kv import BlockManager
from simulator.engine.prefix_cache import PrefixCache
from simulator.engine.request import Request

if TYPE_CHECKING:
    from simulator.engine.recorder import Recorder


@dataclass(slots=True)
class Batch:
    chunks: list[tuple[Request, int]]
    decodes: list[Request]
    tokens: list[int] | None = None
    """Tokens each decode advances (speculative decoding); None = one each."""


class Instance:
    """One replica. Public attributes are fixed at construction; all state is private and
    reached through gated methods (see the module docstring)."""

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
        max_num_seqs_per: str = "engine",
        speculative: Acceptance | None = None,
        speculation_rng: np.random.Generator | None = None,
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
        self._cache = cache
        self._kv = BlockManager(kv_blocks, block_size, cache)
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
        # Speculative decoding: each decode step advances a sequence by a drawn number of
        # tokens (1..k+1) and needs KV room for the k drafts (vLLM's lookahead slots).
        self._accept = speculative
        self._accept_rng = speculation_rng or np.random.default_rng(0)
        self._lookahead = speculative.draft_tokens if speculative is not None else 0
        self.fast_forward = fast_forward and self.pp == 1 and speculative is None
        # vLLM V1 caps the running requests of the whole engine at max_num_seqs, however
        # many micro-batches are in flight; V0's pp virtual engines each had the cap.
        self.max_running = scheduler.max_num_seqs * (
            self.pp if max_num_seqs_per == "virtual_engine" else 1)
        self.kv_capacity_tokens = kv_blocks * block_size
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        # Requests whose KV waits for a transfer out (prefill role) / is reserved for a
        # transfer in (decode role), by request id.
        self._held: dict[int, Request] = {}
        self._reserved: dict[int, Request] = {}
        # Fault and scaling state: a failed instance loses its KV and its work; an
        # inactive one is powered off; a draining one takes no new work.
        self._alive = True
        self._active = True
        self._draining = False
        self._epoch = 0
        self._powered_s = 0.0
        self._powered_since: float | None = 0.0
        self._collect = False  # an autoscaler reads recent TTFT/TPOT samples
        self._signal_ttft: list[float] = []
        self._signal_tpot: list[float] = []
        self._queued_tokens = 0
        self._in_flight = 0
        self._speed = 1.0  # > 1 slows every step (a straggler); set by fault injection
        self._wake: simpy.Event | None = None
        self._revive: simpy.Event | None = None
        self._jump: Jump | None = None
        self._stage_free = [0.0] * self.pp
        self.process = env.process(self._run())

    # ----- the fast-forward gate -----------------------------------------------------
    def _sync(self) -> None:
        if self._jump is not None:
            self._jump.sync(self._kv, self.env.now)

    def _cut(self) -> None:
        jump = self._jump
        if jump is not None and jump.cut(self.env.now):
            self.process.interrupt("cut")

    # ----- what the router, the cluster and the autoscaler read ----------------------
    @property
    @observes
    def held(self) -> int:
        return len(self._held)

    @property
    @observes
    def reserved(self) -> int:
        return len(self._reserved)

    @property
    @observes
    def alive(self) -> bool:
        return self._alive

    @property
    @observes
    def active(self) -> bool:
        """Powered on and started (autoscaled instances may be off)."""
        return self._active

    @property
    @observes
    def accepting(self) -> bool:
        """Takes new work: alive, powered and not draining."""
        return self._alive and self._active and not self._draining

    @property
    @observes
    def idle(self) -> bool:
        return not (self._waiting or self._running or self._held or self._reserved
                    or self._in_flight)

    @property
    @observes
    def outstanding(self) -> int:
        return len(self._waiting) + len(self._running) + len(self._reserved)

    @property
    @observes
    def queued_tokens(self) -> int:
        return self._queued_tokens

    @property
    @observes
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    @observes
    def num_running(self) -> int:
        return len(self._running)

    @property
    @observes
    def kv_load(self) -> float:
        kv = self._kv
        return kv.used / kv.total if kv.total else 1.0

    @observes
    def has_slot(self) -> bool:
        """Takes new work and has a free sequence slot now (central-queue dispatch)."""
        return (self._alive and self._active and not self._draining
                and len(self._waiting) + len(self._running) + len(self._held)
                < self.max_running)

    @observes
    def can_ever_hold(self, req: Request) -> bool:
        """Whether this instance's whole KV could hold ``req``: its prompt (and tokens
        generated before a restart) on a prefill instance, prompt + output otherwise."""
        if self.role == "prefill":
            return req.prefill_target + 1 <= self.kv_capacity_tokens
        return req.prompt_tokens + req.output_tokens <= self.kv_capacity_tokens - 1

    @observes
    def can_reserve(self, req: Request) -> bool:
        if len(self._running) + len(self._reserved) >= self.max_running:
            return False
        return self._kv.can_allocate(self._kv.blocks_for(req.context_tokens + 1))

    @observes
    def prefix_match_tokens(self, req: Request) -> int:
        """Prompt tokens this instance's prefix cache would spare ``req`` now."""
        if self._cache is None:
            return 0
        return self._cache.match(self._usable_hashes(req)) * self._cache.block_tokens

    @observes
    def take_signals(self, kind: str) -> list[float]:
        """The TTFT or TPOT samples since the last call (the autoscaler's signal)."""
        bucket = self._signal_ttft if kind == "ttft" else self._signal_tpot
        out = list(bucket)
        bucket.clear()
        return out

    @observes
    def powered_until(self, end: float) -> float:
        """Seconds this instance was powered from t=0 to ``end``."""
        extra = end - self._powered_since if self._powered_since is not None else 0.0
        return self._powered_s + max(0.0, extra)

    # ----- what they change ------------------------------------------------------------
    @mutates
    def enqueue(self, req: Request) -> None:
        """A new (or re-routed) request waits here for prefill."""
        self._waiting.append(req)
        self._queued_tokens += req.prefill_target
        self._wake_up()

    @mutates
    def try_reserve(self, req: Request) -> bool:
        """Decode role: reserve KV for an incoming request's prompt, if there is room."""
        if not (len(self._running) + len(self._reserved) < self.max_running
                and self._kv.can_allocate(self._kv.blocks_for(req.context_tokens + 1))):
            return False
        need = self._kv.blocks_for(req.context_tokens + 1)
        self._kv.allocate(need)
        req.blocks = need
        self._reserved[req.id] = req
        return True

    @mutates
    def cancel_reservation(self, req: Request) -> None:
        """Decode role: an incoming hand-off will not arrive; free what it reserved."""
        if self._reserved.pop(req.id, None) is not None:
            self._kv.release(req.blocks)
            req.blocks = 0
            self._on_kv_freed(self)
            self._wake_up()  # the freed KV may let a waiting recompute in

    @mutates
    def rebind_reservation(self, req: Request) -> None:
        """Layer-wise hand-off: the reservation booked on a stand-in (same id) while the
        prefill ran now belongs to ``req`` itself."""
        self._reserved[req.id] = req

    @mutates
    def admit_transferred(self, req: Request) -> None:
        """Decode role: the request's KV has arrived; it joins the decode batch."""
        del self._reserved[req.id]
        req.prefilled = req.prefill_target
        req.status = "decode"
        if req.generated and req.first_token_s != req.first_token_s:
            req.first_token_s = self.env.now  # the prefill's token, forwarded with the KV
        self._running.append(req)
        self._wake_up()

    @mutates
    def release_held(self, req: Request) -> None:
        """Prefill role: the request's KV has left; free its blocks."""
        self._free_request_kv(req, req.src_blocks)
        req.src_blocks = 0
        del self._held[req.id]
        self._on_kv_freed(self)
        self._wake_up()

    @mutates
    def collect_signals(self) -> None:
        """From now on keep TTFT/TPOT samples for :meth:`take_signals`."""
        self._collect = True

    @mutates
    def set_speed(self, factor: float) -> None:
        """Straggler: every step from the next one takes ``factor`` times longer."""
        self._speed = factor

    @mutates
    def power(self, on: bool) -> None:
        now = self.env.now
        if on and self._powered_since is None:
            self._powered_since = now
        elif not on and self._powered_since is not None:
            self._powered_s += now - self._powered_since
            self._powered_since = None

    @mutates
    def switch_off(self) -> None:
        """Not serving and not powered (an autoscaled instance off, or drained)."""
        self._active = False
        self._draining = False
        self.power(False)

    @mutates
    def start_serving(self) -> None:
        """Powered and started: takes work."""
        self._active = True
        self._draining = False

    @mutates
    def drain(self) -> None:
        """Take no new work; finish what is here."""
        self._draining = True

    @property
    @observes
    def draining(self) -> bool:
        return self._draining

    def _wake_up(self) -> None:
        if self._alive and self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ----- the loop ------------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            try:
                yield from self._serve()
            except simpy.Interrupt as exc:
                if exc.cause != "fail":
                    raise
            # Failed: nothing runs until recover() revives the instance.
            self._jump = None
            self._wake = None
            self._revive = self.env.event()
            yield self._revive

    def _serve(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        while True:
            if self._in_flight >= self.pp:
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
            if (self.fast_forward and not batch.chunks and self._speed == 1.0
                    and len(batch.decodes) == len(self._running)):
                jump = plan_jump(batch.decodes, self._kv, self.cost, self._pinned_blocks,
                                 env.now, len(self._waiting), len(self._running))
                if jump is not None:
                    yield from self._jump_over(jump)
                    continue
            shape = BatchShape.build(
                ((n, r.prefilled, r.prefilled + n >= r.prefill_target) for r, n in batch.chunks),
                (r.context_tokens for r in batch.decodes),
            )
            if self._accept is not None and batch.decodes:
                drawn = self._accept.sample(self._accept_rng, len(batch.decodes))
                batch.tokens = [min(int(n), r.output_tokens - r.generated)
                                for n, r in zip(drawn, batch.decodes, strict=True)]
            step = self.cost.step(shape)
            start = env.now
            if self.pp == 1:
                seconds = step.seconds * self._speed
                yield env.timeout(seconds)
                self._record(start, seconds, seconds, shape, step,
                             sum(batch.tokens) if batch.tokens is not None else None)
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
        t = start + host_s * self._speed
        first_stage_done = t
        for s, seconds in enumerate(stages):
            t = max(t, free[s]) + seconds * self._speed
            free[s] = t
            if s == 0:
                first_stage_done = t
        exit_s = t
        # Device time per device: the host work and every stage's compute, spread over
        # the pp stage groups (each stage's devices run only their own stage).
        busy_s = step.seconds * self._speed / self.pp
        self._in_flight += 1
        epoch = self._epoch

        def done(_e: simpy.Event) -> None:
            if epoch != self._epoch:  # the instance failed while this batch was in flight
                return
            self._in_flight -= 1
            for req, _ in batch.chunks:
                req.in_flight = False
            for req in batch.decodes:
                req.in_flight = False
            self._record(start, exit_s - start, busy_s, shape, step)
            self._finish(batch, start)
            self._wake_up()

        env.timeout(exit_s - start).callbacks.append(done)
        # The next micro-batch may enter once stage 0 is free (and a slot is, see _serve).
        yield env.timeout(first_stage_done - start)

    # ----- decode fast-forward -------------------------------------------------------
    def _jump_over(self, jump: Jump) -> Generator[simpy.Event, Any, None]:
        env = self.env
        self._jump = jump
        done = jump.k
        try:
            yield env.timeout(jump.ends[-1] - jump.start)
        except simpy.Interrupt as exc:
            if exc.cause == "fail":
                raise
            # An outside write: finish the step that is running, then schedule again.
            done = jump.steps_done_at_cut(env.now)
            if jump.ends[done - 1] > env.now:
                yield env.timeout(jump.ends[done - 1] - env.now)
        self._jump = None
        self._apply_jump(jump, done)

    def _apply_jump(self, jump: Jump, done: int) -> None:
        """Record the first ``done`` steps of ``jump`` and advance its sequences."""
        kv = self._kv
        jump.settle(kv, done)
        decodes, start, ends = jump.decodes, jump.start, jump.ends
        n = len(decodes)
        starts = np.asarray([start, *ends[: done - 1]])
        used, queue, running = jump.row_values(done, kv.used, len(self._waiting),
                                               len(self._running))
        series = jump.series
        self.recorder.steps_bulk(
            self.index, starts, jump.seconds[:done], n, int(jump.ctx.sum()) + n * np.arange(done),
            used, kv.total, queue, running, jump.bounds[:done],
            series.compute_s[:done], series.memory_s[:done],
        )
        bs = kv.block_size
        blocks = (np.maximum(jump.held, -(-(jump.ctx + done - 1) // bs)) - jump.pinned).tolist()
        finished = []
        for r, b in zip(decodes, blocks, strict=True):
            r.blocks = b
            if r.decode_start_s != r.decode_start_s:
                r.decode_start_s = start
            g = r.generated
            if g == 0 and r.first_token_s != r.first_token_s:
                r.first_token_s = ends[0]
            if g <= 1 and g + done >= 2 and r.second_token_s != r.second_token_s:
                r.second_token_s = ends[1 - g]
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
        need = (self._kv.blocks_for(req.context_tokens + self._lookahead) - req.blocks
                - self._pinned_blocks(req))
        while need > 0 and not self._kv.can_allocate(need):
            victim = next((r for r in reversed(self._running) if not r.in_flight), None)
            if victim is None:
                return False
            self._preempt(victim)
            if victim is req:
                return False
        if need > 0:
            self._kv.allocate(need)
            req.blocks += need
        return True

    def _free_request_kv(self, req: Request, owned: int) -> None:
        """Give back a request's KV; with a prefix cache its full prompt blocks stay cached."""
        cache = self._cache
        if cache is None or not req.block_hashes:
            self._kv.release(owned)
            return
        pins = req.cache_pins
        full = min(len(req.block_hashes), req.prompt_tokens // cache.block_tokens)
        computed = req.block_hashes[pins:full]
        kept = cache.insert(computed) * cache.blocks_per_entry
        kept = min(kept, owned)
        self._kv.release(owned - kept)
        cache.unpin(req.block_hashes[:pins])
        req.cache_pins = 0

    def _preempt(self, req: Request) -> None:
        self._running.remove(req)
        self._free_request_kv(req, req.blocks)
        req.reset_for_recompute()
        req.status = "queued"
        self._waiting.appendleft(req)
        self._queued_tokens += req.prefill_target
        self.recorder.event(self.env.now, "preempt", f"{self.name} request {req.id}")

    def _decodes(self, budget: int) -> list[Request]:
        decodes: list[Request] = []
        limit = min(budget, self.sched.max_num_seqs)
        for req in list(self._running):
            if len(decodes) >= limit:
                break
            if req.status != "decode" or req.in_flight:
                continue
            if self._grow_for_decode(req):
                decodes.append(req)
        return [r for r in decodes if r.status == "decode"]

    def _usable_hashes(self, req: Request) -> list[int]:
        """Hash blocks of the prompt a cache hit may cover (at least one token is computed)."""
        cache = self._cache
        if cache is None or not req.block_hashes:
            return []
        limit = min(len(req.block_hashes), (req.prompt_tokens - 1) // cache.block_tokens)
        return req.block_hashes[:limit]

    def _pinned_blocks(self, req: Request) -> int:
        """KV blocks of ``req`` that the prefix cache owns (its pinned leading blocks)."""
        return req.cache_pins * self._cache.blocks_per_entry if self._cache is not None else 0

    def _admit(self, req: Request) -> bool:
        """Move the head of the waiting queue into running if its prompt's KV fits."""
        hit = 0
        cache = self._cache
        if cache is not None:
            usable = self._usable_hashes(req)
            hit = cache.match(usable)
            cache.pin(usable[:hit])
        need = self._kv.blocks_for(req.prefill_target + 1)
        if hit:
            need = max(0, need - hit * cache.blocks_per_entry)  # type: ignore[union-attr]
        if not self._kv.can_allocate(need):
            if hit:
                cache.unpin(req.block_hashes[:hit])  # type: ignore[union-attr, index]
            return False
        self._kv.allocate(need)
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
        self._waiting.popleft()
        self._queued_tokens -= req.prefill_target
        self._running.append(req)
        req.status = "prefill"
        if req.prefill_start_s != req.prefill_start_s:  # NaN: first admission
            req.prefill_start_s = self.env.now
            if self.on_prefill_start is not None:
                self.on_prefill_start(self, req)
        return True

    def _room(self) -> bool:
        return len(self._running) + len(self._held) < self.max_running

    def _schedule_mixed(self) -> Batch | None:
        """Decode-first continuous batching with chunked prefill (vLLM V1 default)."""
        budget = self.sched.max_num_batched_tokens
        decodes = self._decodes(budget) if self.role != "prefill" else []
        budget -= len(decodes)
        seqs = len(decodes)
        chunks: list[tuple[Request, int]] = []
        for req in self._running:
            if budget <= 0 or seqs >= self.sched.max_num_seqs:
                break
            if req.in_prefill and not req.in_flight:
                n = min(req.prefill_target - req.prefilled, budget)
                chunks.append((req, n))
                budget -= n
                seqs += 1
        while (self._waiting and budget > 0 and self._room()
               and seqs < self.sched.max_num_seqs):
            req = self._waiting[0]
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
        while self._waiting and self._room() and len(chunks) < self.sched.max_num_seqs:
            req = self._waiting[0]
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
    def _record(self, start: float, seconds: float, busy_s: float, shape: BatchShape,
                step: StepCost, decode_tokens: int | None = None) -> None:
        # Compute and memory seconds per device: a pipeline's stages run on different GPUs.
        self.recorder.step(
            self.index, start, seconds, busy_s, shape.prefill_tokens, shape.prefill_seqs,
            shape.decode_seqs, shape.decode_ctx_tokens, self._kv.used, self._kv.total,
            len(self._waiting), len(self._running), step.bound, step.compute_s / self.pp,
            step.memory_s / self.pp, decode_tokens,
        )

    # ----- faults ---------------------------------------------------------------------
    @mutates
    def fail(self) -> tuple[list[Request], list[Request], list[Request]]:
        """Lose every request's KV and stop; return (to recompute, held, reserved).

        Requests waiting or running here must be prefilled again elsewhere; ``held`` ones
        (prefill role) lost the KV they were handing off; ``reserved`` ones (decode role)
        were being sent here and can be sent elsewhere from their prefill instance.
        """
        jump = self._jump
        if jump is not None:
            # Book the decode steps of the jump that finished before the failure; the
            # step running at the failure is lost, as it would be step by step.
            self._jump = None
            done = jump.steps_ended_by(self.env.now)
            if done:
                self._apply_jump(jump, done)
        lost = list(self._waiting) + list(self._running)
        held = list(self._held.values())
        reserved = list(self._reserved.values())
        self._waiting.clear()
        self._running.clear()
        self._held.clear()
        self._reserved.clear()
        self._queued_tokens = 0
        self._in_flight = 0
        self._stage_free = [self.env.now] * self.pp
        self._kv.reset()
        for req in lost + held + reserved:
            req.in_flight = False
            req.blocks = 0
            req.src_blocks = 0
            req.cache_pins = 0
        self._alive = False
        self._epoch += 1
        if self.process.is_alive:
            self.process.interrupt("fail")
        return lost, held, reserved

    @mutates
    def recover(self) -> None:
        self._alive = True
        self._speed = 1.0
        revive = self._revive
        if revive is not None and not revive.triggered:
            revive.succeed()

    def _finish(self, batch: Batch, start: float) -> None:
        now = self.env.now
        for i, req in enumerate(batch.decodes):
            if req.status != "decode":
                continue
            if req.decode_start_s != req.decode_start_s:  # NaN: its first decode step
                req.decode_start_s = start
            before = req.generated
            req.generated += batch.tokens[i] if batch.tokens is not None else 1
            if before == 0 and req.first_token_s != req.first_token_s:
                req.first_token_s = now  # decode_recompute: the decode side's first token
            if before < 2 <= req.generated and req.second_token_s != req.second_token_s:
                req.second_token_s = now  # (a speculative burst delivers both at once)
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
                if self._collect:
                    self._signal_ttft.append(now - req.arrival_s)
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
                self._running.remove(req)
                self._held[req.id] = req
                req.src_blocks, req.blocks = req.blocks, 0
                req.status = "transfer"
                self._on_prefilled(self, req)
            else:
                req.status = "decode"
                if req.decode_instance < 0:
                    req.decode_instance = self.index

    def _complete(self, req: Request) -> None:
        if self._collect and req.generated > 1:
            self._signal_tpot.append((self.env.now - req.first_token_s) / (req.generated - 1))
        self._running.remove(req)
        self._free_request_kv(req, req.blocks)
        req.blocks = 0
        req.completion_s = self.env.now
        req.status = "completed"
        if req.decode_instance < 0 and self.role != "prefill":
            req.decode_instance = self.index
        self._on_kv_freed(self)
        self._on_complete(self, req)
