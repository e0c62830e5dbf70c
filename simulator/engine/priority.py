"""The waiting-queue disciplines of vLLM's scheduling policies, for queues outside an
instance (the router's central queue); an instance's scheduler orders its own queue by
the same key through ``SchedulerView.priority`` (scheduler/vllm_v1.py).

vLLM V1 (``vllm/v1/core/sched/request_queue.py`` and ``scheduler.py``, v0.10) has two
policies behind ``--scheduling-policy``:

* ``fcfs``: the waiting queue is a deque (arrival order; a preempted request goes back
  to its front), and when a running request cannot grow its KV the scheduler preempts
  the *last* running request (``self.running.pop()``);
* ``priority``: the waiting queue is a heap ordered by ``(priority, arrival_time)``
  (smaller first; a preempted request is pushed back, there is no "front"), and the
  victim is ``max(self.running, key=(priority, arrival_time))``: the least urgent,
  latest-arrived running request.

Ties beyond (priority, arrival) break by request id, so the order never depends on the
heap's insertion history. Both queues offer the deque operations the cluster uses
(``append``, ``appendleft``, ``popleft``, ``[0]``, ``remove``, ``clear``, iteration), so
swapping the policy changes nothing else.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Literal, Protocol

from simulator.engine.request import Request

Policy = Literal["fcfs", "priority"]


def priority_key(req: Request) -> tuple[int, float, int]:
    """vLLM's ``Request.__lt__`` under the priority policy: (priority, arrival, id)."""
    return (req.priority, req.arrival_s, req.id)


class WaitingQueue(Protocol):
    def append(self, req: Request) -> None: ...
    def appendleft(self, req: Request) -> None: ...
    def popleft(self) -> Request: ...
    def remove(self, req: Request) -> None: ...
    def clear(self) -> None: ...
    def __getitem__(self, index: int) -> Request: ...
    def __len__(self) -> int: ...
    def __iter__(self) -> Iterator[Request]: ...
    def __contains__(self, req: object) -> bool: ...


class PriorityQueue:
    """A heap of requests by :func:`priority_key` with the deque operations used here."""

    __slots__ = ("_heap",)

    def __init__(self, items: Iterable[Request] = ()) -> None:
        self._heap: list[tuple[tuple[int, float, int], Request]] = [
            (priority_key(r), r) for r in items]
        heapq.heapify(self._heap)

    def append(self, req: Request) -> None:
        heapq.heappush(self._heap, (priority_key(req), req))

    appendleft = append  # a preempted request re-enters by its key (vLLM prepend_request)

    def popleft(self) -> Request:
        if not self._heap:
            raise IndexError("pop from an empty queue")
        return heapq.heappop(self._heap)[1]

    def remove(self, req: Request) -> None:
        for i, (_, r) in enumerate(self._heap):
            if r is req:
                last = self._heap.pop()
                if i < len(self._heap):
                    self._heap[i] = last
                    heapq.heapify(self._heap)
                return
        raise ValueError(f"request {req.id} is not in the queue")

    def clear(self) -> None:
        self._heap.clear()

    def __getitem__(self, index: int) -> Request:
        if index != 0:
            raise IndexError("a priority queue exposes only its head")
        if not self._heap:
            raise IndexError("empty queue")
        return self._heap[0][1]

    def __len__(self) -> int:
        return len(self._heap)

    def __bool__(self) -> bool:
        return bool(self._heap)

    def __contains__(self, req: object) -> bool:
        return any(r is req for _, r in self._heap)

    def __iter__(self) -> Iterator[Request]:
        """In service order (sorted copy; the heap itself is untouched)."""
        return (r for _, r in sorted(self._heap, key=lambda e: e[0]))


def make_queue(policy: Policy, items: Iterable[Request] = ()) -> WaitingQueue:
    """The waiting queue of ``policy``: a deque (fcfs) or a priority heap."""
    if policy == "priority":
        return PriorityQueue(items)
    return deque(items)
