"""The scheduler seam: a pure policy from a view of one instance to the step it runs.

``Scheduler.schedule(view) -> SchedulerOutput`` sees plain data — the waiting and running
requests (read, never changed), the engine's limits and a :class:`KVLedger` — and returns
the step: prefill chunks ``(request, tokens)``, decodes, preemptions and admissions. It
imports neither SimPy nor the cost model nor the recorder, so a policy is tested by
handing it requests and a :class:`PlainLedger`.

KV is booked through the ledger while the policy decides, because a decision depends on
what the decisions before it freed or took (a preemption frees blocks the next decode
may grow into; an admission pins prefix-cache blocks the next one may share). On an
instance the ledger is :class:`~simulator.engine.kv_manager.KVManager`, over the real
block manager and prefix cache; in a unit test it is :class:`PlainLedger`. Everything
else — moving requests between queues, changing their state, timestamps, events, the
prefill time a cache hit saved — the instance does when it applies the output.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from simulator.engine.request import Request


class KVLedger(Protocol):
    """KV booking a policy may do while it decides one step."""

    block_size: int

    @property
    def available(self) -> int:
        """Blocks an allocation can get now (free, or held only by the prefix cache)."""
        ...

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        ...

    def owned(self, req: Request) -> int:
        """Blocks ``req`` holds here, its cached prefix included."""
        ...

    def prefix_hit(self, req: Request) -> int:
        """Prompt tokens the prefix cache would spare ``req`` if admitted now."""
        ...

    def can_allocate(self, blocks: int) -> bool:
        """Whether ``blocks`` more blocks can be had now (free or evictable)."""
        ...

    def growth_need(self, req: Request, tokens: int) -> int:
        """Blocks ``req`` lacks to hold ``tokens`` tokens (<= 0: none)."""
        ...

    def decode_growth(self, reqs: Sequence[Request],
                      lookahead: int) -> list[tuple[Request, int]]:
        """Each of ``reqs`` that lacks blocks for its next decode token and ``lookahead``
        draft slots, with how many (``growth_need(r, r.context_tokens + lookahead)`` where
        it is positive), in order, in one call."""
        ...

    def grow(self, req: Request, blocks: int) -> None:
        """Give ``req`` ``blocks`` more blocks (``can_allocate`` said yes)."""
        ...

    def preempt(self, req: Request) -> None:
        """Free every block ``req`` holds (recompute preemption)."""
        ...

    def admit(self, req: Request, target_tokens: int,
              book_tokens: int | None = None) -> int | None:
        """Admit a prompt of ``target_tokens`` tokens: pin its prefix-cache hit and book
        KV for its first ``book_tokens`` tokens (default: the whole prompt and the first
        output token), less the cached blocks; return the cached prompt tokens, or None
        if it does not fit (nothing is booked then)."""
        ...


@dataclass(frozen=True, slots=True)
class EngineLimits:
    """What bounds one step of one instance."""

    max_num_seqs: int
    """Most sequences in one step's batch."""
    max_num_batched_tokens: int
    """Most tokens (prefill chunk tokens + one per decode) in one step."""
    max_running: int
    """Most requests admitted at once (running + prefilled ones whose KV waits to leave)."""
    lookahead: int = 0
    """Extra KV slots a decode needs (speculative draft tokens)."""
    decodes: bool = True
    """False on a prefill instance: it never decodes."""


@dataclass(slots=True)
class SchedulerView:
    """One instance as a policy sees it before a step (read-only: a policy changes
    neither the view nor the sequences in it)."""

    waiting: Sequence[Request]
    """Queued requests, head first."""
    running: Sequence[Request]
    """Admitted requests (prefilling or decoding), oldest admission first."""
    held: int
    """Prefilled requests whose KV waits to be sent (they count toward ``max_running``)."""
    kv: KVLedger
    limits: EngineLimits
    priority: Callable[[Request], float] | None = None
    """Lower first: orders the waiting queue (then arrival) and, where the engine does,
    picks preemption victims (highest value first). None = arrival order."""


def ordered_waiting(view: SchedulerView) -> Sequence[Request]:
    """The waiting queue in the order a policy considers it (the view's own queue, not a
    copy, when there is no priority key)."""
    if view.priority is None:
        return view.waiting
    key = view.priority
    return sorted(view.waiting, key=lambda r: (key(r), r.arrival_s))


@dataclass(frozen=True, slots=True)
class Admission:
    """A waiting request that joins the running set this step."""

    request: Request
    cached_tokens: int
    """Prompt tokens its prefix-cache hit spares (its prefill starts after them)."""


@dataclass(slots=True)
class SchedulerOutput:
    """The step a policy chose, in the order the instance applies it."""

    chunks: list[tuple[Request, int]] = field(default_factory=list)
    """Prefill chunks: (request, prompt tokens computed this step)."""
    decodes: list[Request] = field(default_factory=list)
    """Requests that decode this step."""
    preempted: list[Request] = field(default_factory=list)
    """Running requests whose KV was freed for recompute, in the order they were chosen."""
    admitted: list[Admission] = field(default_factory=list)
    """Waiting requests admitted. Preempted ones go back to the queue first, so an
    admission may be a request preempted in the same step."""
    preempted_to_front: bool = True
    """Preempted requests go back to the head of the queue (vLLM, TensorRT-LLM) or to
    its end (SGLang's retraction)."""

    @property
    def empty(self) -> bool:
        return not self.chunks and not self.decodes


class Scheduler(Protocol):
    """A serving engine's batching policy."""

    def schedule(self, view: SchedulerView) -> SchedulerOutput:
        """The next step of the instance ``view`` shows."""
        ...

    def stable(self, view: SchedulerView) -> bool:
        """Whether, over a stretch of decode-only steps with nothing arriving or leaving,
        the policy would decide the same each step (so the stretch may be jumped)."""
        ...

    def advance(self, steps: int) -> None:
        """``steps`` decode steps ran without being scheduled one by one (a jump)."""
        ...

    def joins(self, running: int, limits: EngineLimits) -> bool:
        """Whether a pass over ``running`` requests that all decode, with nothing waiting
        and their KV growth fitting, surely decodes every one of them (so requests that
        joined the batch since the last step may go on with it without a pass; False: the
        pass runs)."""
        ...


class Stateless:
    """A policy that keeps nothing between steps: every stretch of identical decode steps
    may be fast-forwarded, and there is nothing to advance."""

    def stable(self, view: SchedulerView) -> bool:
        return True

    def advance(self, steps: int) -> None:
        return None

    def joins(self, running: int, limits: EngineLimits) -> bool:
        return False


@dataclass(slots=True)
class PlainLedger:
    """A ledger over plain numbers, for tests and for reasoning about a policy.

    ``free`` blocks can be had; ``blocks`` maps a request id to the blocks it holds;
    ``hits`` maps a request id to the prompt tokens a prefix cache would spare it (whole
    blocks).
    """

    free: int
    block_size: int
    blocks: dict[int, int] = field(default_factory=dict)
    hits: dict[int, int] = field(default_factory=dict)

    @property
    def available(self) -> int:
        return self.free

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def owned(self, req: Request) -> int:
        return self.blocks.get(req.id, 0)

    def prefix_hit(self, req: Request) -> int:
        return self.hits.get(req.id, 0)

    def can_allocate(self, blocks: int) -> bool:
        return blocks <= self.free

    def growth_need(self, req: Request, tokens: int) -> int:
        return self.blocks_for(tokens) - self.blocks.get(req.id, 0)

    def decode_growth(self, reqs: Sequence[Request],
                      lookahead: int) -> list[tuple[Request, int]]:
        return [(r, n) for r in reqs
                if (n := self.growth_need(r, r.context_tokens + lookahead)) > 0]

    def grow(self, req: Request, blocks: int) -> None:
        if blocks > self.free:
            raise AssertionError(f"grow {blocks} with {self.free} free")
        self.free -= blocks
        self.blocks[req.id] = self.blocks.get(req.id, 0) + blocks

    def preempt(self, req: Request) -> None:
        self.free += self.blocks.pop(req.id, 0)

    def admit(self, req: Request, target_tokens: int,
              book_tokens: int | None = None) -> int | None:
        hit = self.hits.get(req.id, 0)
        book = target_tokens + 1 if book_tokens is None else book_tokens
        need = max(0, self.blocks_for(book) - hit // self.block_size)
        if need > self.free:
            return None
        self.free -= need
        self.blocks[req.id] = need
        return hit
