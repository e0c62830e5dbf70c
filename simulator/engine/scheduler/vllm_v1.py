"""vLLM V1's scheduler (``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``;
the loop below is that of v0.10 – v0.21, the releases the ``vllm`` profile describes).

One token budget (``max_num_batched_tokens``) per step, spent in this order:

1. **Running requests**, in the order they were admitted. Each asks for the tokens it
   lacks — one for a decode (plus speculative lookahead slots), the rest of its prompt
   for a chunked prefill, capped by what is left of the budget — and KV blocks for just
   those tokens (``KVCacheManager.allocate_slots``). When the blocks cannot be had, the
   most recently admitted running request is preempted (``self.running.pop()``; with
   ``--scheduling-policy priority`` the one of lowest priority, then latest arrival),
   its blocks freed for recompute, and the allocation retried; a request that ends up
   preempting itself stops the running pass.
2. **Waiting requests**, only if nothing was preempted in this step, while the budget
   lasts and fewer than ``max_num_seqs`` requests run (``max_num_running_reqs``, a cap
   on the whole engine, not per step). A request's prefix-cache hit is skipped; KV is
   allocated for its first chunk only (not its whole prompt); without chunked prefill a
   prompt larger than the budget left stops admission (unless it would be the step's only
   prefill: vLLM's config check makes the budget hold any prompt then, so here it runs).
   Admission stops at the first request that does not fit (FCFS).

There is no separate decode phase: decodes come first because running requests are
admitted before the ones still prefilling. Requests in flight in another pipeline
micro-batch are skipped (vLLM schedules nothing for them: ``num_new_tokens == 0``).
On a prefill instance, prefilled requests whose KV waits to be sent have left
``running`` (their blocks are freed when the connector reports the send), so they do
not count toward ``max_num_seqs``.

Defaults by device class (``vllm/engine/arg_utils.py``, ``get_batch_defaults``): 1024
sequences and 8192 tokens (OpenAI API server) or 16384 (``LLM`` class) on GPUs with at
least 70 GiB that are not A100s; 256 and 2048 / 8192 otherwise. A scenario that leaves
its limits unset gets them (``simulator/runner/scheduler_defaults.py``, rules in the
``vllm`` engine profile).
"""

from __future__ import annotations

from simulator.engine.request import Request, State
from simulator.engine.scheduler.base import (
    Admission,
    EngineLimits,
    KVLedger,
    SchedulerOutput,
    SchedulerView,
    ordered_waiting,
)


class VllmV1:
    """vLLM V1 token-budget scheduling (``chunked`` = ``--enable-chunked-prefill``)."""

    def __init__(self, chunked: bool = True) -> None:
        self.chunked = chunked
        self._preempted = False  # the last step preempted (and so admitted nothing)

    def stable(self, view: SchedulerView) -> bool:
        # After a preempting step the next one may admit what the freed KV now fits.
        return not (self._preempted and view.waiting)

    def advance(self, steps: int) -> None:
        if steps:  # steps that preempted nothing
            self._preempted = False

    def joins(self, running: int, limits: EngineLimits) -> bool:
        # The running pass books every decode, one token of the budget each, when their
        # blocks fit at once (_decode_prefix), and admits nothing with nothing waiting.
        return running <= limits.max_num_batched_tokens

    def schedule(self, view: SchedulerView) -> SchedulerOutput:
        lim, kv = view.limits, view.kv
        out = SchedulerOutput()
        decodes, chunks = out.decodes, out.chunks
        running: list[Request] = view.running  # type: ignore[assignment]
        own = False  # copied on the first preemption: the instance's list is read-only
        budget = lim.max_num_batched_tokens
        lookahead, growth_need, decode = lim.lookahead, kv.growth_need, State.DECODE
        i = 0
        i = self._decode_prefix(running, kv, budget, lookahead, decodes)
        budget -= i  # the leading decodes booked at once: the pass goes on after them
        while i < len(running) and budget > 0:
            req = running[i]
            if req.in_flight:
                i += 1
                continue
            if req.status is decode:
                n, tokens = 1, req.prompt_tokens + req.generated + lookahead
            else:
                n = min(req.prefill_target - req.prefilled, budget)
                tokens = req.prefilled + n
            need = growth_need(req, tokens)
            if need > 0 and not kv.can_allocate(need):
                if not own:
                    running, own = list(running), True
                ok = True
                while not kv.can_allocate(need):
                    victim = self._victim(view, running)
                    if victim is None:
                        ok = False
                        break
                    at = running.index(victim)
                    running.pop(at)
                    kv.preempt(victim)
                    out.preempted.append(victim)
                    if at < i:  # priority: one scheduled earlier in this step
                        i -= 1
                        budget += self._unschedule(out, victim)
                    if victim is req:
                        ok = False
                        break
                if not ok:
                    break
            if need > 0:
                kv.grow(req, need)
            if req.status is decode:
                decodes.append(req)
            else:
                chunks.append((req, n))
            budget -= n
            i += 1
        self._preempted = bool(out.preempted)
        if out.preempted:
            return out  # vLLM admits nothing new in a step that preempted
        if not view.waiting:  # nothing to admit (a decode instance, mostly)
            return out
        count = len(running)
        for req in ordered_waiting(view):
            if budget <= 0 or count >= lim.max_running:
                break
            cached = kv.prefix_hit(req)
            n = req.prefill_target - cached
            if not self.chunked and n > budget:
                # vLLM refuses max_num_batched_tokens < max_model_len without chunked
                # prefill; here a prompt larger than what is left runs as the step's
                # only prefill (beside the decodes), as if the budget had room for it.
                if out.chunks:
                    break
            else:
                n = min(n, budget)
            got = kv.admit(req, req.prefill_target, cached + n)
            if got is None:
                break
            out.admitted.append(Admission(req, got))
            out.chunks.append((req, n))
            budget -= n
            count += 1
        return out

    @staticmethod
    def _decode_prefix(running: list[Request], kv: KVLedger, budget: int, lookahead: int,
                       decodes: list[Request]) -> int:
        """The start of the running pass, where it cannot preempt: the leading running
        requests that decode (up to the first that prefills or is in flight, and at most
        one per token of the budget), if the blocks they all lack fit at once. Their turns
        of the pass one by one would each find its blocks (an allocation takes exactly
        what it books from what can be had, so the checks one by one pass when the sum
        fits): the pass is then their bookings in order, and goes on one by one after
        them. Returns how many were booked (0: none, the pass runs from the start)."""
        decode = State.DECODE
        m = 0
        for req in running:
            # The state read directly, not through the ``status`` property: this loop
            # runs over the whole batch at every step.
            if req._state is not decode or req.in_flight:
                break
            m += 1
        m = min(m, budget)
        if not m:
            return 0
        lead = running[:m] if m < len(running) else running
        grows = kv.decode_growth(lead, lookahead)
        if grows:
            if not kv.can_allocate(sum([n for _, n in grows])):
                return 0
            for req, n in grows:
                kv.grow(req, n)
        decodes.extend(lead)
        return m

    @staticmethod
    def _unschedule(out: SchedulerOutput, req: Request) -> int:
        """Take ``req`` out of this step; return the tokens it had."""
        if req in out.decodes:
            out.decodes.remove(req)
            return 1
        for k, (r, n) in enumerate(out.chunks):
            if r is req:
                del out.chunks[k]
                return n
        return 0

    @staticmethod
    def _victim(view: SchedulerView, running: list[Request]) -> Request | None:
        free = [r for r in running if not r.in_flight]
        if not free:
            return None
        if view.priority is None:
            return free[-1]
        key = view.priority
        return max(free, key=lambda r: (key(r), r.arrival_s))
