"""Continuous batching as the simulator has run it so far (vLLM-like), as pure policies.

* :class:`DecodeFirstChunked` — ``chunked_prefill: true``: every running decode first
  (growing its KV by one token, preempting the most recently admitted running request
  when KV runs out), then the unfinished prompts already running, then new admissions
  from the queue head, all within ``max_num_batched_tokens`` and ``max_num_seqs``. The
  whole prompt's KV is booked at admission; a step that preempted may still admit
  (the preempted request goes back to the queue head and may be the one admitted).
* :class:`PrefillFirst` — ``chunked_prefill: false``: whole prompts from the queue head
  while they fit the token budget (a prompt larger than the budget runs alone); decode
  steps only when no prompt is admitted, so prefill and decode never share a step.

These reproduce the engine's behaviour before the scheduler became a separate policy,
bit for bit; the per-engine policies of ``vllm_v1``, ``trtllm`` and ``sglang`` refine it.
"""

from __future__ import annotations

from simulator.engine.request import Request, State
from simulator.engine.scheduler.base import (
    Admission,
    SchedulerOutput,
    SchedulerView,
    Stateless,
)


class _Step:
    """The running set as the decisions of one step change it."""

    __slots__ = ("out", "own", "preempted", "requeued", "running", "taken", "view")

    def __init__(self, view: SchedulerView) -> None:
        self.view = view
        # The instance's own list until this step changes it (copied on first write).
        self.running: list[Request] = view.running  # type: ignore[assignment]
        self.own = False
        self.preempted: set[int] = set()
        # The queue as this step changes it: the preempted requests (last one first) in
        # front of view.waiting, of which the first ``taken`` were admitted.
        self.requeued: list[Request] = []
        self.taken = 0
        self.out = SchedulerOutput()

    def head(self) -> Request | None:
        if self.requeued:
            return self.requeued[-1]
        waiting = self.view.waiting
        return waiting[self.taken] if self.taken < len(waiting) else None

    def _mine(self) -> list[Request]:
        if not self.own:
            self.running = list(self.running)
            self.own = True
        return self.running

    def room(self) -> bool:
        v = self.view
        return len(self.running) + v.held < v.limits.max_running

    def target(self, req: Request) -> int:
        """Prompt tokens ``req`` must prefill when admitted (a preempted one recomputes
        what it had generated too)."""
        if req.id in self.preempted:
            return req.prompt_tokens + req.generated
        return req.prefill_target

    def preempt(self, req: Request) -> None:
        self._mine().remove(req)
        self.view.kv.preempt(req)
        self.preempted.add(req.id)
        self.out.preempted.append(req)
        self.requeued.append(req)

    def grow_for_decode(self, req: Request, need: int) -> bool:
        """Book the ``need`` blocks ``req``'s next token lacks, preempting the most
        recently admitted running request not in flight while they do not fit. False if
        ``req`` cannot decode."""
        kv = self.view.kv
        while not kv.can_allocate(need):
            victim = next((r for r in reversed(self.running) if not r.in_flight), None)
            if victim is None:
                return False
            self.preempt(victim)
            if victim is req:
                return False
        kv.grow(req, need)
        return True

    def decodes(self, limit: int) -> list[Request]:
        chosen: list[Request] = []
        limit = min(limit, self.view.limits.max_num_seqs)
        kv, lookahead, preempted = self.view.kv, self.view.limits.lookahead, self.preempted
        items = list(self.running) if self.own else self.running  # preempt copies first
        for req in items:
            if len(chosen) >= limit:
                break
            if (req.status is not State.DECODE or req.in_flight
                    or (preempted and req.id in preempted)):
                continue
            need = kv.growth_need(req, req.context_tokens + lookahead)
            if need <= 0 or self.grow_for_decode(req, need):
                chosen.append(req)
        return [r for r in chosen if r.id not in preempted] if preempted else chosen

    def admit(self) -> tuple[Request, int] | None:
        """Admit the queue head if its KV fits: (request, prompt tokens still to compute)."""
        req = self.head()
        assert req is not None
        target = self.target(req)
        cached = self.view.kv.admit(req, target)
        if cached is None:
            return None
        if self.requeued:
            self.requeued.pop()
        else:
            self.taken += 1
        self._mine().append(req)
        self.out.admitted.append(Admission(req, cached))
        return req, target - cached


class DecodeFirstChunked(Stateless):
    """Decode-first continuous batching with chunked prefill."""

    def schedule(self, view: SchedulerView) -> SchedulerOutput:
        lim = view.limits
        step = _Step(view)
        out = step.out
        budget = lim.max_num_batched_tokens
        if lim.decodes:
            out.decodes = step.decodes(budget)
        budget -= len(out.decodes)
        seqs = len(out.decodes)
        for req in step.running:
            if budget <= 0 or seqs >= lim.max_num_seqs:
                break
            if req.in_prefill and not req.in_flight:
                n = min(req.prefill_target - req.prefilled, budget)
                out.chunks.append((req, n))
                budget -= n
                seqs += 1
        while (step.head() is not None and budget > 0 and step.room()
               and seqs < lim.max_num_seqs):
            got = step.admit()
            if got is None:
                break
            req, left = got
            n = min(left, budget)
            out.chunks.append((req, n))
            budget -= n
            seqs += 1
        return out


class PrefillFirst(Stateless):
    """Whole prompts first; decode steps only when no prompt is admitted."""

    def schedule(self, view: SchedulerView) -> SchedulerOutput:
        lim = view.limits
        step = _Step(view)
        out = step.out
        budget = lim.max_num_batched_tokens
        while step.room() and len(out.chunks) < lim.max_num_seqs:
            head = step.head()
            if head is None:
                break
            if step.target(head) > budget and out.chunks:  # a larger prompt runs alone
                break
            got = step.admit()
            if got is None:
                break
            req, left = got
            out.chunks.append((req, left))  # cached prefix blocks are skipped
            budget -= left
        if out.chunks or not lim.decodes:
            return out
        out.decodes = step.decodes(lim.max_num_seqs)
        return out
