"""TensorRT-LLM's in-flight batching scheduler (PyTorch backend, ``tensorrt_llm/_torch/
pyexecutor/scheduler.py``: ``PyCapacityScheduler`` + ``PyMicroBatchScheduler``, the
Python mirror of ``cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp`` and
``microBatchScheduler.cpp``; TensorRT-LLM 1.0, the release the ``trtllm`` profile
describes).

Two passes per step:

1. **Capacity scheduler** — which requests hold KV, at most ``max_batch_size`` of them
   (``max_num_requests``):

   * ``GUARANTEED_NO_EVICT`` (the default): every running request keeps a reservation of
     the blocks it still needs to finish (prompt + ``max_tokens``, here the request's
     output length); a waiting request is admitted, first come first served, only if its
     own blocks to completion fit beside those reservations, and the first one that does
     not fit blocks the queue. Nothing is ever evicted, so nothing is preempted.
   * ``MAX_UTILIZATION``: requests (running first, then waiting) are packed while the
     blocks of their next step fit; when one does not, the most recently scheduled
     generation request is paused — its KV freed, to be recomputed — and the request
     retried. Pausing may make room for a new context, as the packing intends.

2. **Micro-batch scheduler** — what runs this step within ``max_num_tokens``:
   generation requests first (one token each, plus draft tokens), then context
   requests. Without context chunking (``enable_chunked_prefill`` off, the default) a
   context that does not fit the tokens left stops the pass; with it, contexts are
   chunked first come first served in multiples of the KV block size.

Both passes count a context still being chunked against ``max_batch_size`` exactly as
a generation request (the capacity scheduler's ``len(scheduled_requests)``, the
micro-batch scheduler's ``scheduled_req_count``), so running + chunking <= the cap.

A context's KV is booked for its whole prompt when it is admitted (the KV cache manager
adds the sequence with its prompt length); generation grows it block by block. Requests
in flight in another pipeline micro-batch are skipped (``inflight_request_ids``).
"""

from __future__ import annotations

from typing import Literal

from simulator.engine.request import Request, State
from simulator.engine.scheduler.base import (
    Admission,
    SchedulerOutput,
    SchedulerView,
    Stateless,
    ordered_waiting,
)

CapacityPolicy = Literal["guaranteed_no_evict", "max_utilization"]


class TrtllmInflight(Stateless):
    """TensorRT-LLM capacity + micro-batch scheduling."""

    def __init__(self, capacity: CapacityPolicy = "guaranteed_no_evict",
                 chunked: bool = False) -> None:
        self.capacity = capacity
        self.chunked = chunked

    def schedule(self, view: SchedulerView) -> SchedulerOutput:
        out = SchedulerOutput()
        if self.capacity == "guaranteed_no_evict":
            fitting = self._no_evict(view, out)
        else:
            fitting = self._max_utilization(view, out)
        self._micro_batch(view, fitting, out)
        return out

    # ----- capacity ------------------------------------------------------------------
    def _to_completion(self, view: SchedulerView, req: Request) -> int:
        """Blocks ``req`` still needs to finish here."""
        kv = view.kv
        total = kv.blocks_for(req.prompt_tokens + req.output_tokens)
        return max(0, total - kv.owned(req))

    def _no_evict(self, view: SchedulerView, out: SchedulerOutput) -> list[Request]:
        kv, lim = view.kv, view.limits
        fitting = list(view.running)[: lim.max_running]
        reserved = sum(self._to_completion(view, r) for r in fitting)
        room = kv.available - reserved
        count = len(fitting) + view.held
        for req in ordered_waiting(view):
            if count >= lim.max_running:
                break
            cached = kv.prefix_hit(req)
            blocks = kv.blocks_for(req.prompt_tokens + req.output_tokens) \
                - kv.blocks_for(cached)
            if blocks > room:
                break  # queue, never evict: the head blocks the queue
            got = kv.admit(req, req.prefill_target)
            if got is None:
                break
            room -= blocks
            out.admitted.append(Admission(req, got))
            fitting.append(req)
            count += 1
        return fitting

    def _max_utilization(self, view: SchedulerView, out: SchedulerOutput) -> list[Request]:
        kv, lim = view.kv, view.limits
        scheduled: list[Request] = []
        active: list[Request] = [*view.running, *ordered_waiting(view)]
        running = {r.id for r in view.running}
        gone: set[int] = set()
        idx = 0
        while idx < len(active):
            req = active[idx]
            if req.id in gone:
                idx += 1
                continue
            if len(scheduled) + view.held >= lim.max_running:
                break
            if req.id in running:
                if req.in_flight or req.status is not State.DECODE:
                    scheduled.append(req)  # in flight, or its prompt's KV is booked
                    idx += 1
                    continue
                need = kv.growth_need(req, req.context_tokens + lim.lookahead)
                if need <= 0 or kv.can_allocate(need):
                    if need > 0:
                        kv.grow(req, need)
                    scheduled.append(req)
                    idx += 1
                    continue
            else:
                got = kv.admit(req, req.prefill_target)
                if got is not None:
                    out.admitted.append(Admission(req, got))
                    scheduled.append(req)
                    idx += 1
                    continue
            victim = next((r for r in reversed(scheduled)
                           if r.status is State.DECODE and not r.in_flight), None)
            if victim is None and req.id in running:
                # Nothing scheduled to pause: pause the request started last among the
                # running ones not visited yet, or this one (TensorRT-LLM's
                # MaxUtilizationScheduler pauses the last started request, which may be the
                # request it could not fit; before, this case stopped scheduling for good
                # with the KV full: no step, no event, a stalled instance).
                later = [r for r in active[idx + 1:len(running)]
                         if r.id not in gone and r.status is State.DECODE and not r.in_flight]
                victim = later[-1] if later else req
                kv.preempt(victim)
                out.preempted.append(victim)
                gone.add(victim.id)
                if victim is req:
                    idx += 1
                continue
            if victim is None:
                break
            scheduled.remove(victim)
            kv.preempt(victim)
            out.preempted.append(victim)
            gone.add(victim.id)
        return scheduled

    # ----- micro-batch ---------------------------------------------------------------
    def _micro_batch(self, view: SchedulerView, fitting: list[Request],
                     out: SchedulerOutput) -> None:
        lim = view.limits
        left = lim.max_num_batched_tokens
        seqs = 0
        new = {a.request.id: a.cached_tokens for a in out.admitted}
        contexts: list[tuple[Request, int]] = []
        for req in fitting:
            if req.in_flight:
                continue
            if seqs >= lim.max_num_seqs:
                break
            if req.id in new:
                remaining = req.prefill_target - new[req.id]
            elif req.status is State.DECODE:
                if not lim.decodes:
                    continue
                n = 1 + lim.lookahead
                if n > left:
                    break
                need = view.kv.growth_need(req, req.context_tokens + lim.lookahead)
                if need > 0:  # (MAX_UTILIZATION booked it already)
                    if not view.kv.can_allocate(need):
                        continue  # no eviction: it waits for a later step
                    view.kv.grow(req, need)
                out.decodes.append(req)
                left -= n
                seqs += 1
                continue
            else:
                remaining = req.prefill_target - req.prefilled
            contexts.append((req, remaining))
            seqs += 1
        unit = view.kv.block_size
        for req, remaining in contexts:
            if left <= 0:
                break
            if remaining <= left:
                n = remaining
            elif not self.chunked:
                if out.chunks:
                    break
                n = remaining  # the only context: as if max_num_tokens held it
            else:
                n = left // unit * unit
                if n <= 0:
                    break
            out.chunks.append((req, n))
            left -= n
