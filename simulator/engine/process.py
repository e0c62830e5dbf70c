"""The serving loop of one instance: schedule → predict → wait → apply.

Each turn asks the scheduler policy for a step (:mod:`simulator.engine.scheduler`),
applies its decisions (queues, states, events), asks the instance's step-time predictor
how long the step takes, ``yield env.timeout(seconds)``, then applies the step's results.
The role decides what happens when a prompt is prefilled: a colocated instance keeps
decoding it, a prefill instance hands it to the cluster for a KV transfer.

With ``pp > 1`` the step goes through the pipeline executor
(:mod:`simulator.engine.pipeline`): the loop comes back as soon as stage 0 is free, and the
batch's results are applied when it leaves the last stage. A decode-only batch that
nothing can change is priced in one call and the clock jumps to its end
(:mod:`simulator.engine.fast_forward`).

:class:`ServingProcess` is the private half of :class:`~simulator.engine.instance.Instance`;
the public, gated half (what the router, cluster and autoscaler read and change) is there.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from simulator.cost.accounting import SeriesStep
from simulator.cost.batch import BatchShape
from simulator.cost.speculative import Acceptance
from simulator.cost.step import InstanceCostModel, StepCost
from simulator.engine.fast_forward import Jump, plan_jump
from simulator.engine.kv_manager import KVManager
from simulator.engine.lifecycle import Lifecycle
from simulator.engine.pipeline import Pipeline
from simulator.engine.request import Request, State
from simulator.engine.scheduler import EngineLimits, Scheduler, SchedulerOutput, SchedulerView

if TYPE_CHECKING:
    from simulator.engine.recorder import Recorder
    from simulator.engine.step_prices import StepPrices
    from simulator.engine.swap import HostSwap


_NONE: frozenset[int] = frozenset()


@dataclass(slots=True)
class Batch:
    chunks: list[tuple[Request, int]]
    decodes: list[Request]
    tokens: list[int] | None = None
    """Tokens each decode advances (speculative decoding); None = one each."""
    stable: bool = True
    """The policy would schedule the same over a decode-only stretch (may be jumped)."""


class ServingProcess:
    """The loop and the application of steps; the state is the instance's own."""

    # Set by Instance.__init__.
    env: simpy.Environment
    index: int
    name: str
    role: str
    cost: InstanceCostModel
    recorder: Recorder
    scheduler: Scheduler
    pp: int
    fast_forward: bool
    emits_first_token: bool
    on_prefill_start: Callable[[Any, Request], None] | None
    on_load_change: Callable[[Any], None] | None
    process: simpy.Process
    _kv: KVManager
    _prices: StepPrices
    _life: Lifecycle
    _pipe: Pipeline
    _limits: EngineLimits
    _waiting: deque[Request]
    _priority: Callable[[Request], float] | None
    _running: list[Request]
    _aborts: list[Request]
    _held: dict[int, Request]
    _queued_tokens: int
    _accept: Acceptance | None
    _accept_rng: np.random.Generator
    _wake: simpy.Event | None
    _revive: simpy.Event | None
    _jump: Jump | None
    _swap: HostSwap | None
    _preempted_last: bool
    _swap_skipped: bool
    _on_prefilled: Callable[[Any, Request], None]
    _on_complete: Callable[[Any, Request], None]
    _on_kv_freed: Callable[[Any], None]
    swap_out_done: Callable[[], None]
    swapped_in: Callable[[Request], None]

    def _load_changed(self) -> None:
        """The routing load may have changed: tell the cluster's load index."""
        if self.on_load_change is not None:
            self.on_load_change(self)

    def _wake_up(self) -> None:
        if self._life.alive and self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ----- the loop ------------------------------------------------------------------
    def _run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            try:
                yield from self._serve()
            except simpy.Interrupt as exc:
                if exc.cause == "stop":  # the clock has stopped for good
                    return
                if exc.cause != "fail":
                    raise
            # Failed: nothing runs until recover() revives the instance.
            self._jump = None
            self._wake = None
            self._revive = self.env.event()
            yield self._revive

    def _serve(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        # One stage never holds a micro-batch between passes (only _pipeline enters it).
        staged = self.pp > 1
        while True:
            if staged and self._pipe.full:
                # Every pipeline slot holds a micro-batch: wait for one to leave.
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if self._aborts:
                self._apply_aborts()
            if self._waiting or self._running or self._swap is not None:
                batch = self._schedule()
            else:  # nothing to schedule: every policy returns an empty step, unchanged
                self._load_changed()
                batch = None
            if batch is None:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            speed = self._life.speed
            if (self.fast_forward and not batch.chunks and speed == 1.0 and batch.stable
                    and len(batch.decodes) == len(self._running)
                    and (self._swap is None or not self._swap_due())):
                kv = self._kv
                jump = plan_jump(batch.decodes, kv.blocks, self._prices,
                                 kv.pinned_blocks if kv.cache is not None else None, env.now,
                                 len(self._waiting), len(self._running))
                if jump is not None:
                    while jump is not None:  # a jump may go on across its completions
                        yield from self._jump_over(jump)
                        jump = self._jump_on(jump)
                    continue
            if batch.chunks:
                shape = BatchShape.build(
                    ((n, r.prefilled, r.prefilled + n >= r.prefill_target)
                     for r, n in batch.chunks),
                    (r.context_tokens for r in batch.decodes),
                )
            else:  # decode only (a refused jump plan, mostly): the shape build() gives
                ctx = [r.prompt_tokens + r.generated for r in batch.decodes]
                shape = BatchShape.decode(len(ctx), sum(ctx), max(ctx))
            if self._accept is not None and batch.decodes:
                drawn = self._accept.sample(self._accept_rng, len(batch.decodes))
                batch.tokens = [min(int(n), r.output_tokens - r.generated)
                                for n, r in zip(drawn, batch.decodes, strict=True)]
            step = self._prices.step(shape)
            start = env.now
            if self.pp == 1:
                seconds = step.seconds * speed
                yield env.timeout(seconds)
                self._record(start, seconds, seconds, shape, step,
                             sum(batch.tokens) if batch.tokens is not None else None)
                self._finish(batch, start)
                continue
            yield from self._pipeline(batch, shape, step)

    # ----- pipeline parallel ---------------------------------------------------------
    def _pipeline(self, batch: Batch, shape: BatchShape,
                  step: StepCost | SeriesStep) -> Generator[simpy.Event, Any, None]:
        """Send ``batch`` through the stages; come back when stage 0 can take the next."""
        env = self.env
        start = env.now
        for req, _ in batch.chunks:
            req.in_flight = True
        for req in batch.decodes:
            req.in_flight = True
        plan = self._pipe.enter(start, step.seconds, step.stage_seconds, self._life.speed)
        epoch = self._life.epoch

        def done(_e: simpy.Event) -> None:
            if epoch != self._life.epoch:  # the instance failed while this batch was in flight
                return
            self._pipe.leave()
            for req, _ in batch.chunks:
                req.in_flight = False
            for req in batch.decodes:
                req.in_flight = False
            self._record(start, plan.exit_s - start, plan.busy_s, shape, step)
            self._finish(batch, start)
            self._wake_up()

        env.timeout(plan.exit_s - start).callbacks.append(done)
        # The next micro-batch may enter once stage 0 is free (and a slot is, see _serve).
        yield env.timeout(plan.first_stage_done - start)

    # ----- decode fast-forward -------------------------------------------------------
    def _jump_over(self, jump: Jump) -> Generator[simpy.Event, Any, None]:
        env = self.env
        self._jump = jump
        done = jump.k
        try:
            yield env.timeout(jump.ends[-1] - jump.start)
        except simpy.Interrupt as exc:
            if exc.cause in ("fail", "stop"):
                raise
            # An outside write: finish the step that is running, then schedule again.
            done = jump.steps_done_at_cut(env.now)
            if jump.ends[done - 1] > env.now:
                yield env.timeout(jump.ends[done - 1] - env.now)
        self._jump = None
        self._apply_jump(jump, done)

    def _jump_on(self, ended: Jump) -> Jump | None:
        """The jump that goes on after ``ended`` over the requests still running, without a
        scheduling pass, or None: the loop schedules as usual. The rule, and why the pass
        would schedule those steps the same, is :mod:`simulator.engine.fast_forward`'s."""
        if (ended.needs_pass or self._waiting or self._aborts or not self._running
                or self._swap is not None or self._life.speed != 1.0):
            return None
        if ended.cut_at is not None and not self.scheduler.joins(len(self._running),
                                                                 self._limits):
            return None  # requests joined: the policy's pass may not decode them all
        kv = self._kv
        jump = plan_jump(list(self._running), kv.blocks, self._prices,
                         kv.pinned_blocks if kv.cache is not None else None, self.env.now,
                         0, len(self._running), scheduled=False)
        if jump is not None:
            self._load_changed()  # its first step's KV is booked, as a pass would
        return jump

    def _apply_jump(self, jump: Jump, done: int) -> None:
        """Record the first ``done`` steps of ``jump`` and advance its sequences."""
        finished = jump.apply(done, self._kv.blocks, self.recorder, self.index,
                              len(self._waiting), len(self._running))
        unscheduled = done - 1 if jump.scheduled else done
        self.scheduler.advance(unscheduled)  # steps no scheduling pass chose
        self._load_changed()  # settling may give back KV a reader booked
        if unscheduled:
            self._preempted_last = False  # the jumped steps preempted nothing
        for r in finished:
            r.generated = r.output_tokens
            self._complete(r)

    def _apply_aborts(self) -> None:
        """Free the KV of running requests whose client gave up (vLLM's engine core
        applies aborts between steps: a step in progress computes on)."""
        for req in self._aborts:
            self._running.remove(req)
            self._kv.free_request(req, req.blocks)  # its computed blocks stay cached
            req.blocks = 0
        self._aborts.clear()
        self._on_kv_freed(self)

    # ----- schedule: ask the policy, apply its decisions --------------------------------
    def _swap_in(self) -> None:
        """Book HBM for the oldest swapped-out requests that fit now and copy them back
        (vLLM V0 serves its swapped queue before new prompts)."""
        swap, kv = self._swap, self._kv
        assert swap is not None
        while (req := swap.next_ready()) is not None:
            if len(self._running) + len(self._held) + len(swap.incoming) >= self._limits.max_running:
                return
            need = kv.blocks_for(req.context_tokens + 1)
            if not kv.can_allocate(need):
                return
            kv.grow(req, need)
            swap.swap_in(req, self.swapped_in)
            self.recorder.event(self.env.now, "swap_in", f"{self.name} request {req.id}")

    def _swap_due(self) -> bool:
        """A swap-in held back by this step's preemption or the one before may fit within
        the next steps: run them one by one."""
        return (self._swap is not None and (self._swap_skipped or self._preempted_last)
                and self._swap.next_ready() is not None)

    def _schedule(self) -> Batch | None:
        swap = self._swap
        waiting: Any = self._waiting
        if swap is not None:
            self._swap_skipped = self._preempted_last
            if not self._preempted_last:
                self._swap_in()
            if swap.pending:
                waiting = ()  # vLLM V0: no new prompt while a request is swapped out
        view = SchedulerView(waiting, self._running, len(self._held), self._kv,
                             self._limits, self._priority)
        out = self.scheduler.schedule(view)
        self._load_changed()  # admissions and preemptions move queue, batch and KV
        self._preempted_last = bool(out.preempted)
        if out.preempted or out.admitted:  # most passes move nothing between queue and batch
            self._move(out)
        if out.empty:
            return None
        return Batch(out.chunks, out.decodes, stable=self.scheduler.stable(view))

    def _move(self, out: SchedulerOutput) -> None:
        """Apply a pass's preemptions (back to the queue, or swapped out) and admissions."""
        swap = self._swap
        now = self.env.now
        readmitted = {a.request.id for a in out.admitted} if out.preempted else _NONE
        for req in out.preempted:
            self._running.remove(req)
            if (swap is not None and req.status is State.DECODE and req.id not in readmitted
                    and swap.swap_out(req, self._kv.blocks_for(req.context_tokens),
                                      self.swap_out_done)):
                self.recorder.event(now, "swap_out", f"{self.name} request {req.id}")
                continue
            kept = req.blocks  # booked again if it was re-admitted in the same step
            req.reset_for_recompute()
            req.blocks = kept
            req.move_to(State.QUEUED)
            if out.preempted_to_front:
                self._waiting.appendleft(req)
            else:
                self._waiting.append(req)
            self._queued_tokens += req.prefill_target
            self.recorder.event(now, "preempt", f"{self.name} request {req.id}")
        for adm in out.admitted:
            req = adm.request
            if self._kv.cache is not None:
                tokens = adm.cached_tokens
                if req.prefill_start_s != req.prefill_start_s:  # first admission: the hit
                    req.cached_tokens = tokens
                    if tokens:
                        full = self._prices.step(BatchShape.prefill(req.prompt_tokens)).seconds
                        rest = self._prices.step(BatchShape.prefill(req.prompt_tokens, tokens))
                        req.prefill_saved_s = full - rest.seconds
                req.prefilled = tokens
            if self._waiting[0] is req:
                self._waiting.popleft()
            else:  # a policy that orders the queue (priority, longest prefix first)
                self._waiting.remove(req)
            self._queued_tokens -= req.prefill_target
            self._running.append(req)
            req.move_to(State.PREFILL)
            if req.prefill_start_s != req.prefill_start_s:  # NaN: first admission
                req.prefill_start_s = now
                if self.on_prefill_start is not None:
                    self.on_prefill_start(self, req)

    # ----- apply: results of a step ----------------------------------------------------
    def _record(self, start: float, seconds: float, busy_s: float, shape: BatchShape,
                step: StepCost | SeriesStep, decode_tokens: int | None = None) -> None:
        blocks = self._kv.blocks
        # Compute and memory seconds per device: a pipeline's stages run on different GPUs.
        self.recorder.step(
            self.index, start, seconds, busy_s, shape.prefill_tokens, shape.prefill_seqs,
            shape.decode_seqs, shape.decode_ctx_tokens, blocks.used, blocks.total,
            len(self._waiting), len(self._running), step.bound, step.compute_s / self.pp,
            step.memory_s / self.pp, decode_tokens,
        )

    def _finish(self, batch: Batch, start: float) -> None:
        now = self.env.now
        decode = State.DECODE
        for i, req in enumerate(batch.decodes):
            if req._state is not decode:  # the state without the property: every decode
                continue
            if req.decode_start_s != req.decode_start_s:  # NaN: its first decode step
                req.decode_start_s = start
            before = req.generated
            req.generated += batch.tokens[i] if batch.tokens is not None else 1
            if before == 0 and req.first_token_s != req.first_token_s:
                req.first_token_s = now  # decode_recompute: the decode side's first token
            if before < 2 <= req.generated and req.second_token_s != req.second_token_s:
                req.second_token_s = now  # (a speculative burst delivers both at once)
            if req.generated >= req.output_tokens:  # req.done
                self._complete(req)
        for req, n in batch.chunks:
            if req.status is not State.PREFILL:
                continue
            req.prefilled += n
            if req.prefilled < req.prefill_target:
                continue
            if req.prefill_end_s != req.prefill_end_s:  # NaN: the very first prefill
                req.prefill_end_s = now
                req.prefill_instance = self.index
                if self._life.collect:
                    self._life.ttft.append(now - req.arrival_s)
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
                req.move_to(State.TRANSFER)
                self._on_prefilled(self, req)
            else:
                req.move_to(State.DECODE)
                if req.decode_instance < 0:
                    req.decode_instance = self.index

    def _complete(self, req: Request) -> None:
        if self._life.collect and req.generated > 1:
            self._life.tpot.append((self.env.now - req.first_token_s) / (req.generated - 1))
        self._running.remove(req)
        self._kv.free_request(req, req.blocks)
        req.blocks = 0
        req.completion_s = self.env.now
        req.move_to(State.COMPLETED)
        if req.decode_instance < 0 and self.role != "prefill":
            req.decode_instance = self.index
        self._on_kv_freed(self)
        self._on_complete(self, req)
