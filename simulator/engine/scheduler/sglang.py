"""SGLang's scheduler (``python/sglang/srt/managers/scheduler.py``,
``get_next_batch_to_run``; admission in ``schedule_policy.py``, ``PrefillAdder``;
SGLang 0.4, the release the ``sglang`` profile describes).

A step is either a prefill (extend) batch or a decode batch — SGLang does not mix them
unless ``--enable-mixed-chunk`` is set:

* **Prefill** whenever something can be admitted. The unfinished chunked request goes
  first; then the waiting queue, ordered longest-prefix-match first (``lpm``; SGLang
  falls back to arrival order when more than 128 wait, or with ``fcfs``). A request is
  admitted while ``max_running_requests`` is not reached and its uncached prompt plus
  its expected output fit the KV left: the free KV less, for every running request,
  ``new_token_ratio`` × the tokens it may still generate (at most 4096 counted,
  ``CLIP_MAX_NEW_TOKENS``). One prompt larger than what is left of
  ``chunked_prefill_size`` is cut to it and becomes the chunked request; admission
  stops there. The chunked request counts against ``max_running_requests`` like a
  running one (it is the first entry of the adder's ``can_run_list``, and admission stops
  at ``len(can_run_list) >= max_running_requests - running_bs``; SGLang 0.4–0.5).
  KV is allocated for the tokens computed this step.
* **Decode** otherwise: one token for every running request. If their KV does not fit,
  requests are retracted (fewest generated tokens first, longest prompt on ties) until
  it does; they go back to the end of the queue to be recomputed, and
  ``new_token_ratio`` is reset to the share of the retracted batch's budget it had used.
  Each decode step that retracts nothing lowers ``new_token_ratio`` by
  (``init`` − ``min``) / ``decay_steps``, down to ``min``.

Defaults (``sglang/global_config.py``): ``init_new_token_ratio`` 0.7,
``min_new_token_ratio`` 0.7 × 0.14, 600 decay steps; ``RETRACT_DECODE_STEPS`` 20.
``new_token_ratio`` is the only state a policy object keeps between steps; each
instance has its own.
"""

from __future__ import annotations

from typing import Literal

from simulator.engine.request import Request, State
from simulator.engine.scheduler.base import (
    Admission,
    EngineLimits,
    SchedulerOutput,
    SchedulerView,
    ordered_waiting,
)

CLIP_MAX_NEW_TOKENS = 4096
RETRACT_DECODE_STEPS = 20
LPM_QUEUE_LIMIT = 128


class SglangScheduler:
    """SGLang prefill-or-decode scheduling with new-token-ratio admission."""

    def __init__(self, schedule_policy: Literal["lpm", "fcfs"] = "lpm",
                 init_new_token_ratio: float = 0.7, min_ratio_factor: float = 0.14,
                 decay_steps: int = 600) -> None:
        self.schedule_policy = schedule_policy
        self.init_ratio = init_new_token_ratio
        self.min_ratio = init_new_token_ratio * min_ratio_factor
        self.decay = (init_new_token_ratio - self.min_ratio) / decay_steps
        self.new_token_ratio = init_new_token_ratio

    def stable(self, view: SchedulerView) -> bool:
        # The ratio decays every decode step, so a waiting request may fit later.
        return not view.waiting

    def advance(self, steps: int) -> None:
        """``steps`` more decode steps ran (a fast-forward jump) without retraction."""
        for _ in range(steps):
            self.new_token_ratio = max(self.new_token_ratio - self.decay, self.min_ratio)

    def joins(self, running: int, limits: EngineLimits) -> bool:
        return False

    # ----- one step ------------------------------------------------------------------
    def schedule(self, view: SchedulerView) -> SchedulerOutput:
        out = self._prefill(view)
        if out.chunks or not view.limits.decodes:
            return out
        return self._decode(view)

    def _order(self, view: SchedulerView) -> list[Request]:
        queue = list(ordered_waiting(view))
        if (self.schedule_policy == "lpm" and view.priority is None
                and len(queue) <= LPM_QUEUE_LIMIT):
            hits = {r.id: view.kv.prefix_hit(r) for r in queue}
            queue.sort(key=lambda r: -hits[r.id])  # stable: arrival order on ties
        return queue

    def _prefill(self, view: SchedulerView) -> SchedulerOutput:
        lim, kv = view.limits, view.kv
        out = SchedulerOutput()
        rem_chunk = lim.max_num_batched_tokens
        bs = kv.block_size
        running = list(view.running)
        rem_total = kv.available * bs - sum(
            min(r.output_tokens - r.generated, CLIP_MAX_NEW_TOKENS) * self.new_token_ratio
            for r in running if r.status is State.DECODE)
        for req in running:  # the chunked request continues first
            if req.in_prefill and not req.in_flight:
                n = min(req.prefill_target - req.prefilled, rem_chunk)
                need = kv.growth_need(req, req.prefilled + n)
                if n <= 0 or (need > 0 and not kv.can_allocate(need)):
                    return out
                if need > 0:
                    kv.grow(req, need)
                out.chunks.append((req, n))
                rem_chunk -= n
                rem_total -= n
                if req.prefilled + n < req.prefill_target:
                    return out  # still chunked: nothing else joins
        count = len(running) + view.held
        for req in self._order(view):
            if count >= lim.max_running or rem_chunk <= 0:
                break
            cached = kv.prefix_hit(req)
            extend = req.prefill_target - cached
            expect = min(req.output_tokens - req.generated, CLIP_MAX_NEW_TOKENS)
            if extend + expect >= rem_total:
                break
            n = min(extend, rem_chunk)
            got = kv.admit(req, req.prefill_target, cached + n)
            if got is None:
                break
            out.admitted.append(Admission(req, got))
            out.chunks.append((req, n))
            count += 1
            rem_chunk -= n
            rem_total -= n + (expect if n == extend else 0)
            if n < extend:
                break  # the new chunked request
        return out

    def _decode(self, view: SchedulerView) -> SchedulerOutput:
        lim, kv = view.limits, view.kv
        out = SchedulerOutput(preempted_to_front=False)
        batch = [r for r in view.running
                 if r.status is State.DECODE and not r.in_flight][: lim.max_num_seqs]
        need = {r.id: max(0, kv.growth_need(r, r.context_tokens + lim.lookahead))
                for r in batch}
        # Retract fewest-generated first (longest prompt on ties) until the step fits.
        order = sorted(batch, key=lambda r: (r.generated, -r.prompt_tokens))
        retracted: list[Request] = []
        while batch and not kv.can_allocate(sum(need[r.id] for r in batch)):
            victim = order.pop(0)
            batch.remove(victim)
            kv.preempt(victim)
            retracted.append(victim)
        for r in batch:
            if need[r.id] > 0:
                kv.grow(r, need[r.id])
        out.decodes = batch
        out.preempted = retracted
        if retracted:
            decoded = sum(r.generated for r in batch)
            budget = sum(r.output_tokens for r in batch)
            ratio = (decoded + RETRACT_DECODE_STEPS * len(batch)) / max(budget, 1)
            self.new_token_ratio = min(1.0, ratio)
        elif batch:
            self.advance(1)
        return out
