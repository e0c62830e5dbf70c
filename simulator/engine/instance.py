"""One serving instance: a TP x PP group of devices with a scheduler and a KV cache.

The instance is split by concern:

* this module — the public face: what the router, the cluster and the autoscaler read
  and change, every member behind the fast-forward gate;
* :mod:`~simulator.engine.instance_life` — the gated members of its life outside
  serving: liveness, power, draining, stragglers, autoscaling signals, failure and
  recovery;
* :mod:`~simulator.engine.process` — the SimPy loop (schedule → predict → wait → apply);
* :mod:`~simulator.engine.scheduler` — the batching policy, pure;
* :mod:`~simulator.engine.kv_manager` — KV blocks and the prefix cache;
* :mod:`~simulator.engine.pipeline` — pipeline-parallel micro-batch timing;
* :mod:`~simulator.engine.fast_forward` — decode jumps and the gate;
* :mod:`~simulator.engine.lifecycle` — faults, power, draining, autoscaling signals.

Everything outside reaches an instance through its public methods and properties, and
each of them passes the fast-forward gate (``@observes`` for reads, ``@mutates`` for
writes, ``@absorbs`` for a hand-off's reservation, ``@joins`` for a request joining the
batch), so a jump is brought up to date before it is read and cut before it is changed
(unless it can absorb the change); the instance's state itself is private.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import simpy

from simulator.cost.speculative import Acceptance
from simulator.cost.step import InstanceCostModel
from simulator.engine.config import SchedulerSpec
from simulator.engine.fast_forward import Jump, absorbs, joins, mutates, observes, unbooked
from simulator.engine.instance_life import InstanceLife
from simulator.engine.kv_manager import KVManager
from simulator.engine.lifecycle import Lifecycle
from simulator.engine.pipeline import Pipeline
from simulator.engine.prefix_cache import Below, PrefixCache
from simulator.engine.process import Batch
from simulator.engine.request import Request, State
from simulator.engine.scheduler import EngineLimits, make_scheduler
from simulator.engine.step_prices import StepPrices
from simulator.engine.swap import HostSwap
from simulator.engine.tier_io import TierIO

if TYPE_CHECKING:
    from simulator.engine.recorder import Recorder

__all__ = ["Batch", "Instance"]


class Instance(InstanceLife):
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
        prices: StepPrices | None = None,
    ) -> None:
        self.env = env
        self.index = index
        self.name = name
        self.pool = pool
        self.role = role
        self.cost = cost
        # Step and decode-stretch prices, kept (shared with instances priced the same).
        self._prices = prices if prices is not None else StepPrices(cost)
        cache = None
        if scheduler.prefix_caching:
            cache = PrefixCache(prefix_block_tokens, block_size)
        self._kv = KVManager(kv_blocks, block_size, cache)
        self.sched = scheduler
        self.scheduler = make_scheduler(scheduler)
        # A prefill instance under vLLM's decode_recompute emits no client token: the
        # decode side recomputes the last prompt token and emits token 1.
        self.emits_first_token = role != "prefill" or first_token == "forwarded_after_transfer"
        self.recorder = recorder
        self._on_prefilled = on_prefilled
        self._on_complete = on_complete
        self._on_kv_freed = on_kv_freed
        # Called when a request's prefill first starts (a layer-wise KV stream opens).
        self.on_prefill_start = None
        # Called when the instance's routing load (queue, batch, hand-offs, KV) may have
        # changed other than by a jump's lazily booked KV growth (engine/load_index.py).
        self.on_load_change = None
        self.pp = cost.parallelism.pp
        # Speculative decoding: each decode step advances a sequence by a drawn number of
        # tokens (1..k+1) and needs KV room for the k drafts (vLLM's lookahead slots).
        self._accept = speculative
        self._accept_rng = speculation_rng or np.random.default_rng(0)
        lookahead = speculative.draft_tokens if speculative is not None else 0
        self.fast_forward = fast_forward and self.pp == 1 and speculative is None
        # vLLM V1 caps the running requests of the whole engine at max_num_seqs, however
        # many micro-batches are in flight; V0's pp virtual engines each had the cap.
        max_seqs, max_tokens = scheduler.limits
        self.max_running = max_seqs * (self.pp if max_num_seqs_per == "virtual_engine" else 1)
        self._limits = EngineLimits(max_seqs, max_tokens, self.max_running, lookahead,
                                    role != "prefill")
        self.kv_capacity_tokens = kv_blocks * block_size
        self._waiting: deque[Request] = deque()
        # vLLM --scheduling-policy priority: the policy orders the queue by (class
        # priority, arrival) and preempts the largest first (scheduler/vllm_v1.py).
        self._priority = _class_priority if scheduler.scheduling_policy == "priority" else None
        self._running: list[Request] = []
        # Running requests whose client gave up: freed at the next scheduling point.
        self._aborts: list[Request] = []
        # Requests whose KV waits for a transfer out (prefill role) / is reserved for a
        # transfer in (decode role), by request id.
        self._held: dict[int, Request] = {}
        self._reserved: dict[int, Request] = {}
        self._life = Lifecycle()
        self._queued_tokens = 0
        self._pipe = Pipeline(self.pp)
        self._wake: simpy.Event | None = None
        self._revive: simpy.Event | None = None
        self._jump: Jump | None = None
        self._swap: HostSwap | None = None
        self._preempted_last = False  # the last step preempted (swap-ins wait a step)
        self._swap_skipped = False  # this step's swap-ins waited for that reason
        self._block_size = block_size
        self._prefix_block_tokens = prefix_block_tokens
        self.process = env.process(self._run())

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
    def idle(self) -> bool:
        return not (self._waiting or self._running or self._held or self._reserved
                    or self._pipe.in_flight or (self._swap is not None and self._swap.pending))

    @property
    @observes
    def outstanding(self) -> int:
        return self._outstanding()

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
        return self._kv_load()

    def _outstanding(self) -> int:
        swapped = self._swap.pending if self._swap is not None else 0
        return len(self._waiting) + len(self._running) + len(self._reserved) + swapped

    def _kv_load(self) -> float:
        blocks = self._kv.blocks
        return blocks.used / blocks.total if blocks.total else 1.0

    # The least-* routing keys (simulator.engine.router.MIN_KEYS) read in one gated call
    # each, for a pool's load index: the same tuples as the router's key functions over
    # the properties above (tests/test_load_index.py), at one gate per read, not two.
    @observes
    def outstanding_key(self) -> tuple[int, int]:
        return (self._outstanding(), self.index)

    @observes
    def tokens_key(self) -> tuple[int, int, int]:
        return (self._queued_tokens, self._outstanding(), self.index)

    @observes
    def kv_key(self) -> tuple[float, int, int]:
        return (self._kv_load(), self._outstanding(), self.index)

    @observes
    def has_slot(self) -> bool:
        """Takes new work and has a free sequence slot now (central-queue dispatch)."""
        return (self._life.accepting
                and len(self._waiting) + len(self._running) + len(self._held)
                < self.max_running)

    @unbooked
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
        return self._kv.can_reserve_for(req)

    @observes
    def holds(self, req: Request) -> bool:
        """Whether ``req`` waits, runs, is swapped out, or has KV held or reserved here."""
        return (req.id in self._held or req.id in self._reserved or req in self._running
                or req in self._waiting
                or (self._swap is not None and req.id in self._swap.lent))

    @observes
    def prefix_match_tokens(self, req: Request) -> int:
        """Prompt tokens this instance's prefix cache would spare ``req`` now."""
        return self._kv.prefix_match_tokens(req)

    # ----- what they change ------------------------------------------------------------
    @mutates
    def enqueue(self, req: Request) -> None:
        """A new (or re-routed) request waits here for prefill."""
        self._waiting.append(req)
        self._queued_tokens += req.prefill_target
        self._wake_up()

    @absorbs
    def try_reserve(self, req: Request) -> bool:
        """Decode role: reserve KV for an incoming request's prompt, if there is room (with
        a prefix cache here, the leading blocks it holds are pinned, not reserved)."""
        if not (len(self._running) + len(self._reserved) < self.max_running
                and self._kv.can_reserve_for(req)):
            return False
        self._kv.reserve(req)
        self._reserved[req.id] = req
        return True

    @mutates
    def cancel_reservation(self, req: Request) -> None:
        """Decode role: an incoming hand-off will not arrive; free what it reserved."""
        if self._reserved.pop(req.id, None) is not None:
            self._kv.cancel(req)
            self._on_kv_freed(self)
            self._wake_up()  # the freed KV may let a waiting recompute in

    @absorbs
    def rebind_reservation(self, req: Request) -> None:
        """Layer-wise hand-off: the reservation booked on a stand-in (same id) while the
        prefill ran now belongs to ``req`` itself."""
        self._reserved[req.id] = req

    @joins
    def admit_transferred(self, req: Request) -> None:
        """Decode role: the request's KV has arrived; it joins the decode batch."""
        del self._reserved[req.id]
        self._kv.take_reserved_pins(req)
        req.prefilled = req.prefill_target
        req.move_to(State.DECODE)
        if req.generated and req.first_token_s != req.first_token_s:
            req.first_token_s = self.env.now  # the prefill's token, forwarded with the KV
        self._running.append(req)
        self._wake_up()

    @mutates
    def attach_tiers(self, below: Below | None) -> None:
        """Put KV tiers under this instance's HBM prefix cache (evictions go down); with
        ``preemption: swap`` preempted requests swap to their DRAM tier."""
        self._kv.attach_below(below)
        if self.sched.preemption == "swap" and isinstance(below, TierIO):
            self._swap = HostSwap(self.env, below, self._block_size, self._prefix_block_tokens)

    @mutates
    def swap_out_done(self) -> None:
        """A swapped-out request's copy to the host finished: it may be swapped in."""
        self._wake_up()

    @mutates
    def swapped_in(self, req: Request) -> None:
        """A swapped request's KV is back in HBM: it decodes again."""
        req.move_to(State.DECODE)
        self._running.append(req)
        self._wake_up()

    @mutates
    def stage_prefix(self, head: list[int], loaded: list[int]) -> None:
        """Blocks loaded from a lower tier become HBM prefix-cache entries behind ``head``
        (the prompt's blocks already here)."""
        self._kv.stage(head, loaded)
        self._wake_up()

    @mutates
    def release_held(self, req: Request) -> None:
        """Prefill role: the request's KV has left; free its blocks."""
        self._kv.free_request(req, req.src_blocks)
        req.src_blocks = 0
        del self._held[req.id]
        self._on_kv_freed(self)
        self._wake_up()

    @mutates
    def cancel(self, req: Request) -> None:
        """The client gave up on ``req``: drop it from the queue, free the KV it holds for
        a hand-off now, and a running request's KV at the next scheduling point (a step
        running now finishes without it)."""
        if req in self._waiting:
            self._waiting.remove(req)
            self._queued_tokens -= req.prefill_target
        elif req.id in self._held:
            self.release_held(req)
        elif req.id in self._reserved:
            self.cancel_reservation(req)
        elif self._swap is not None and self._swap.drop(req):
            self._kv.cancel(req)  # the HBM booked for a copy back in flight, if any
            self._on_kv_freed(self)
            self._wake_up()
        elif req in self._running:
            jump = self._jump
            if jump is not None and req in jump.decodes:
                jump.book_cancelled(req, self.env.now)
            self._aborts.append(req)
            self._wake_up()

    @mutates
    def stop(self) -> None:
        """The clock has stopped for good: book the jump steps that have ended and the
        aborts still pending, so the frames are those of step-by-step simulation."""
        jump, self._jump = self._jump, None
        if jump is not None:
            done = jump.steps_ended_by(self.env.now)
            if done:
                self._apply_jump(jump, done)
        if self._aborts:
            self._apply_aborts()
        self._prices.clear()  # nothing is priced any more
        if self.process.is_alive:
            self.process.interrupt("stop")


def _class_priority(req: Request) -> float:
    return float(req.priority)
