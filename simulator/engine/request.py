"""A request's state and timestamps as it moves through the cluster.

Its life is a small state machine. Every change of state goes through
:meth:`Request.move_to`, which checks it against :data:`TRANSITIONS`::

    QUEUED ──admit──▶ PREFILL ──last chunk──▶ DECODE ──last token──▶ COMPLETED
      ▲  │              │  └─prefill role─▶ TRANSFER ──KV arrived──▶ DECODE
      │  │              └──prompt was the whole answer──▶ COMPLETED
      │  └─▶ REJECTED (too long for the model or every instance's KV)
      └──── preempted (recompute) or restarted after a fault, from PREFILL / DECODE / TRANSFER
    DECODE ──preempted (swap)──▶ SWAPPED ──KV copied back──▶ DECODE   (SWAPPED ──fault──▶ QUEUED)
    any live state ──▶ FAILED (retries exhausted)   any live state ──▶ IN_FLIGHT (clock stopped)
    QUEUED ──▶ SHED (over its class's admission limit)
    any live state ──▶ CANCELLED (its client gave up: a request class's timeout)
"""

from __future__ import annotations

import math
from enum import StrEnum

from simulator.errors import SimulationError

NAN = math.nan


class State(StrEnum):
    """Where a request is. The values are the ``status`` column of the requests frame."""

    QUEUED = "queued"  # waiting for (re)prefill, at an instance or at the cluster
    PREFILL = "prefill"  # admitted: its prompt is being prefilled
    DECODE = "decode"  # generating tokens
    TRANSFER = "transfer"  # prefilled; its KV waits for or is on its way to a decode instance
    SWAPPED = "swapped"  # preempted with its KV copied to host memory (preemption: swap)
    COMPLETED = "completed"
    REJECTED = "rejected"
    FAILED = "failed"
    IN_FLIGHT = "in_flight"  # still live when the clock stopped
    SHED = "shed"  # turned away at arrival: its class had max_outstanding requests in
    CANCELLED = "cancelled"  # its client gave up (timeout) before it finished


_LIVE = (State.QUEUED, State.PREFILL, State.DECODE, State.TRANSFER, State.SWAPPED)
TRANSITIONS: dict[State, frozenset[State]] = {
    # Re-queueing a queued request (a cluster-level queue handing it on) is allowed.
    State.QUEUED: frozenset({State.QUEUED, State.PREFILL, State.REJECTED, State.FAILED,
                             State.IN_FLIGHT, State.SHED, State.CANCELLED}),
    State.PREFILL: frozenset({State.DECODE, State.TRANSFER, State.COMPLETED, State.QUEUED,
                              State.FAILED, State.IN_FLIGHT, State.CANCELLED}),
    State.DECODE: frozenset({State.COMPLETED, State.QUEUED, State.SWAPPED, State.FAILED,
                             State.IN_FLIGHT, State.CANCELLED}),
    State.SWAPPED: frozenset({State.DECODE, State.QUEUED, State.FAILED, State.IN_FLIGHT,
                              State.CANCELLED}),
    State.TRANSFER: frozenset({State.DECODE, State.QUEUED, State.FAILED, State.IN_FLIGHT,
                               State.CANCELLED}),
    State.COMPLETED: frozenset(),
    State.REJECTED: frozenset(),
    State.FAILED: frozenset(),
    State.IN_FLIGHT: frozenset(),
    State.SHED: frozenset(),
    State.CANCELLED: frozenset(),
}
"""Allowed moves: state -> the states it may move to."""

LIVE_STATES = frozenset(_LIVE)
ENDED = frozenset({State.COMPLETED, State.REJECTED, State.FAILED, State.SHED,
                   State.CANCELLED})
"""States after which nothing more happens to a request."""


class Request:
    """One inference request. Plain slots, no SimPy: it is data the processes update."""

    __slots__ = (
        "_state",
        "arrival_s",
        "attempt",
        "block_hashes",
        "blocks",
        "cache_pins",
        "cached_tokens",
        "cancel_s",
        "completion_s",
        "decode_admit_s",
        "decode_cached_tokens",
        "decode_instance",
        "decode_start_s",
        "dram_hit_tokens",
        "first_token_s",
        "generated",
        "id",
        "in_flight",
        "klass",
        "kv_load_s",
        "output_tokens",
        "preemptions",
        "prefill_end_s",
        "prefill_instance",
        "prefill_saved_s",
        "prefill_start_s",
        "prefill_target",
        "prefilled",
        "prefix_group",
        "prefix_tokens",
        "priority",
        "prompt_tokens",
        "reason",
        "remote_hit_tokens",
        "restarts",
        "root_id",
        "second_token_s",
        "session",
        "src_blocks",
        "ssd_hit_tokens",
        "swap_bytes",
        "swaps",
        "transfer_end_s",
        "transfer_start_s",
        "transfer_wait_s",
        "turn",
    )

    def __init__(self, rid: int, arrival_s: float, prompt_tokens: int, output_tokens: int,
                 prefix_group: int = -1, prefix_tokens: int = 0) -> None:
        self.id = rid
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.prefix_group = prefix_group
        self.prefix_tokens = prefix_tokens
        self.prefilled = 0
        self.prefill_target = prompt_tokens
        self.generated = 0
        self.blocks = 0
        self.in_flight = False  # part of a micro-batch still in the pipeline
        self.src_blocks = 0  # KV blocks still held on the prefill instance during a hand-off
        self.cache_pins = 0  # leading prefix-cache blocks this request pins where it is
        self.cached_tokens = 0  # prompt tokens its first prefill found in the prefix cache
        self.prefill_saved_s = 0.0  # estimated prefill time those cached tokens saved
        self.block_hashes: list[int] | None = None
        # KV tiers: prompt tokens loaded from each tier below HBM, and the load's seconds.
        self.dram_hit_tokens = 0
        self.ssd_hit_tokens = 0
        self.remote_hit_tokens = 0
        self.kv_load_s = 0.0
        self.decode_cached_tokens = 0  # prompt tokens a P/D hand-off did not move
        self.session = -1  # multi-turn: the conversation and the turn in it (from 1)
        self.turn = 0
        self.preemptions = 0
        self.swaps = 0  # of the preemptions, those that swapped its KV to host memory
        self.swap_bytes = 0.0  # KV bytes those swaps copied to host memory
        self.restarts = 0  # times a failure sent it back to be prefilled or placed again
        self._state = State.QUEUED
        self.reason = ""
        self.prefill_instance = -1
        self.decode_instance = -1
        self.prefill_start_s = NAN
        self.prefill_end_s = NAN
        self.first_token_s = NAN
        self.transfer_wait_s = NAN
        self.transfer_start_s = NAN
        self.transfer_end_s = NAN
        self.decode_admit_s = NAN
        self.decode_start_s = NAN
        self.second_token_s = NAN
        self.completion_s = NAN
        # Traffic class (tenant), its priority (smaller = sooner), and retries: attempt 0
        # is the client's first try; a retry is a new request whose root_id is the first's.
        self.klass = "default"  # tenants.DEFAULT_CLASS
        self.priority = 0
        self.attempt = 0
        self.root_id = rid
        self.cancel_s = NAN  # when the client gave up (status "cancelled")

    @property
    def status(self) -> State:
        """The current state (read-only: change it with :meth:`move_to`)."""
        return self._state

    def move_to(self, new: State) -> None:
        """Change state, refusing a move :data:`TRANSITIONS` does not allow."""
        if new not in TRANSITIONS[self._state]:
            raise SimulationError(f"request {self.id}: illegal state change "
                                  f"{self._state.value} -> {new.value}")
        self._state = new

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV a decode step attends over (prompt + generated so far)."""
        return self.prompt_tokens + self.generated

    @property
    def ended(self) -> bool:
        """Completed, or given up on for good (the client sees no more tokens)."""
        return self._state in ENDED

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < self.prefill_target

    @property
    def done(self) -> bool:
        return self.generated >= self.output_tokens

    def reset_for_recompute(self, *, preempted: bool = True) -> None:
        """Drop the KV: the next prefill recomputes prompt and generated tokens."""
        self.prefilled = 0
        self.prefill_target = self.prompt_tokens + self.generated
        self.blocks = 0
        if preempted:
            self.preemptions += 1
