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

from collections import deque

from simulator.engine.request import Request, State
from simulator.engine.scheduler.base import (
    Admission,
    SchedulerOutput,
    SchedulerView,
)


class _Step:
    """The running set as the decisions of one step change it."""

    __slots__ = ("admitted", "out", "preempted", "running", "view", "waiting")

    def __init__(self, view: SchedulerView) -> None:
        self.view = view
        self.running = list(view.running)
        self.preempted: set[int] = set()
        self.waiting: deque[Request] = deque(view.waiting)
        self.admitted = 0
        self.out = SchedulerOutput()

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
        self.running.remove(req)
        self.view.kv.preempt(req)
        self.preempted.add(req.id)
        self.out.preempted.append(req)
        self.waiting.appendleft(req)

    def grow_for_decode(self, req: Request) -> bool:
        """Book KV for ``req``'s next token, preempting the most recently admitted running
        request not in flight while it does not fit. False if ``req`` cannot decode."""
        kv = self.view.kv
        need = kv.growth_need(req, req.context_tokens + self.view.limits.lookahead)
        while need > 0 and not kv.can_allocate(need):
            victim = next((r for r in reversed(self.running) if not r.in_flight), None)
            if victim is None:
                return False
            self.preempt(victim)
            if victim is req:
                return False
        if need > 0:
            kv.grow(req, need)
        return True

    def decodes(self, limit: int) -> list[Request]:
        chosen: list[Request] = []
        limit = min(limit, self.view.limits.max_num_seqs)
        for req in list(self.running):
            if len(chosen) >= limit:
                break
            if (req.status is not State.DECODE or req.in_flight
                    or req.id in self.preempted):
                continue
            if self.grow_for_decode(req):
                chosen.append(req)
        return [r for r in chosen if r.id not in self.preempted]

    def admit(self) -> tuple[Request, int] | None:
        """Admit the queue head if its KV fits: (request, prompt tokens still to compute)."""
        req = self.waiting[0]
        target = self.target(req)
        cached = self.view.kv.admit(req, target)
        if cached is None:
            return None
        self.waiting.popleft()
        self.running.append(req)
        self.admitted += 1
        self.out.admitted.append(Admission(req, cached))
        return req, target - cached


class DecodeFirstChunked:
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
        while step.waiting and budget > 0 and step.room() and seqs < lim.max_num_seqs:
            got = step.admit()
            if got is None:
                break
            req, left = got
            n = min(left, budget)
            out.chunks.append((req, n))
            budget -= n
            seqs += 1
        return out


class PrefillFirst:
    """Whole prompts first; decode steps only when no prompt is admitted."""

    def schedule(self, view: SchedulerView) -> SchedulerOutput:
        lim = view.limits
        step = _Step(view)
        out = step.out
        budget = lim.max_num_batched_tokens
        while step.waiting and step.room() and len(out.chunks) < lim.max_num_seqs:
            head = step.waiting[0]
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
