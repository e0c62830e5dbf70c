"""Decode fast-forward: a decode-only stretch priced in one call, exact by construction.

When an instance's batch is decode-only and cannot change until a known step (the first
completion, or the first step whose KV growth would not fit), its steps are priced in one
vectorised call and the clock jumps to the end. The result must be that of step-by-step
simulation, so one rule holds, enforced by the instance's gate (:func:`observes`,
:func:`mutates`):

* every outside **read** of the instance first brings the jump up to date: the KV blocks
  of the steps that have started by now are booked, as step-by-step simulation allocates
  a step's blocks when it starts (allocations may evict prefix-cache entries, so a cache
  lookup is a read too);
* every outside **write** cuts the jump: the step then running finishes and the instance
  schedules again, as it would after every step.

Step rows are those step-by-step simulation records: each step's KV after its own
allocation, and the queue and batch sizes of the jump's start for every step that ended
before the first outside write (the step running at that write records the values at
its end).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from functools import wraps
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from simulator.engine.request import State

if TYPE_CHECKING:
    from simulator.cost.step import DecodeSeries, InstanceCostModel
    from simulator.engine.kv import BlockManager
    from simulator.engine.recorder import Recorder
    from simulator.engine.request import Request

MIN_JUMP = 3
"""Shortest stretch worth a jump (shorter ones run step by step)."""

F = TypeVar("F", bound=Callable[..., Any])


def observes(fn: F) -> F:
    """Gate of an outside read: bring a running jump up to date first."""
    @wraps(fn)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._sync()
        return fn(self, *args, **kwargs)

    gated.__gate__ = "observes"  # type: ignore[attr-defined]
    return gated  # type: ignore[return-value]


def mutates(fn: F) -> F:
    """Gate of an outside write: bring a running jump up to date, then cut it; afterwards
    tell the routers' load index that the instance's load may have changed."""
    @wraps(fn)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._sync()
        self._cut()
        out = fn(self, *args, **kwargs)
        self._load_changed()  # a write may change what routers read
        return out

    gated.__gate__ = "mutates"  # type: ignore[attr-defined]
    return gated  # type: ignore[return-value]


class Jump:
    """The state of one jump: its steps, and the KV booked so far."""

    __slots__ = ("booked", "bounds", "ctx", "cut_at", "decodes", "ends", "extra", "held",
                 "k", "last_sync", "pinned", "queue_len", "running", "seconds", "series",
                 "start", "used")

    def __init__(self, decodes: list[Request], start: float, series: DecodeSeries,
                 ctx: np.ndarray, held: np.ndarray, pinned: np.ndarray, extra: np.ndarray,
                 kv_used: int, queue_len: int, running: int) -> None:
        self.decodes = decodes
        self.start = start
        self.series = series
        self.seconds = series.seconds
        self.bounds = series.bound
        self.k = len(series.seconds)
        self.ends: list[float] = np.cumsum(
            np.concatenate(([start], series.seconds)))[1:].tolist()
        self.ctx, self.held, self.pinned = ctx, held, pinned
        self.extra: list[int] = extra.tolist()  # cumulative extra KV blocks before step j
        self.booked = 1  # steps whose KV is booked (step 0's came with the batch)
        self.used = [kv_used]  # KV used after booking step j
        self.queue_len, self.running = queue_len, running  # at the jump's start
        self.cut_at: float | None = None  # time of the first outside write
        self.last_sync = -1.0

    # ----- booking -------------------------------------------------------------------
    def sync(self, kv: BlockManager, now: float) -> None:
        """Book the KV of every step that has started by ``now``."""
        if now == self.last_sync:  # routers ask many times in one instant
            return
        self.last_sync = now
        self.book_through(kv, min(bisect_right(self.ends, now), self.k - 1))

    def book_through(self, kv: BlockManager, j: int) -> None:
        """Book steps up to ``j`` (inclusive), each after the one before, as steps run."""
        if j < self.booked:
            return
        extra, lo = self.extra, self.booked
        total = extra[j] - extra[lo - 1]
        if kv.used + total <= kv.total:  # free blocks suffice: no cache entry is evicted
            base = kv.used - extra[lo - 1]
            kv.allocate(total)
            self.used.extend(base + e for e in extra[lo: j + 1])
        else:
            for i in range(lo, j + 1):
                kv.allocate(extra[i] - extra[i - 1])
                self.used.append(kv.used)
        self.booked = j + 1

    def settle(self, kv: BlockManager, done: int) -> None:
        """Book exactly ``done`` steps: give back a step a reader booked at the cut."""
        self.book_through(kv, done - 1)
        if self.booked > done:
            kv.release(self.extra[self.booked - 1] - self.extra[done - 1])
            del self.used[done:]
            self.booked = done

    # ----- ending ----------------------------------------------------------------------
    def cut(self, now: float) -> bool:
        """An outside write at ``now``; True if it is the first (the jump must stop)."""
        if self.cut_at is not None:
            return False
        self.cut_at = now
        return True

    def steps_done_at_cut(self, now: float) -> int:
        """Steps that run when cut at ``now``: those ended, plus the one running."""
        return min(int(np.searchsorted(self.ends, now, side="left")) + 1, self.k)

    def steps_ended_by(self, now: float) -> int:
        return int(np.searchsorted(self.ends, now, side="right"))

    def row_values(self, done: int, kv_used: int, queue_len: int,
                   running: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """KV used, queue length and running count of each of the first ``done`` steps.

        Steps that ended before the first outside write record the jump's own state; a
        step still running at that write records the state at its end (the arguments).
        """
        used = np.asarray(self.used[:done], dtype=np.int64)
        queue = np.full(done, self.queue_len, dtype=np.int64)
        run = np.full(done, self.running, dtype=np.int64)
        if self.cut_at is not None:
            late = np.asarray(self.ends[:done]) >= self.cut_at
            used[late] = kv_used
            queue[late] = queue_len
            run[late] = running
        return used, queue, run

    # ----- booking the result --------------------------------------------------------
    def apply(self, done: int, kv: BlockManager, recorder: Recorder, index: int,
              queue_len: int, running: int) -> list[Request]:
        """Record the first ``done`` steps and advance the sequences; return those that
        reached their output length (the instance caps and completes them)."""
        self.settle(kv, done)
        decodes, start, ends = self.decodes, self.start, self.ends
        n = len(decodes)
        starts = np.asarray([start, *ends[: done - 1]])
        used, queue, run = self.row_values(done, kv.used, queue_len, running)
        series = self.series
        recorder.steps_bulk(
            index, starts, self.seconds[:done], n, int(self.ctx.sum()) + n * np.arange(done),
            used, kv.total, queue, run, self.bounds[:done],
            series.compute_s[:done], series.memory_s[:done],
        )
        bs = kv.block_size
        blocks = (np.maximum(self.held, -(-(self.ctx + done - 1) // bs)) - self.pinned).tolist()
        finished = []
        for r, b in zip(decodes, blocks, strict=True):
            r.blocks = b
            if r.status is State.CANCELLED:
                continue  # its tokens were booked when its client gave up (book_cancelled)
            book_tokens(r, start, ends, done)
            if r.generated >= r.output_tokens:
                finished.append(r)
        return finished

    def book_cancelled(self, req: Request, now: float) -> None:
        """``req``'s client gave up at ``now``: it received the tokens of the steps that
        ended before (a step ending at ``now`` ends after the client's timer, which was
        set first); its KV stays booked with the others' until the jump is applied."""
        book_tokens(req, self.start, self.ends,
                    int(np.searchsorted(self.ends, now, side="left")))


def book_tokens(r: Request, start: float, ends: list[float], n: int) -> None:
    """Advance ``r`` by the first ``n`` steps of a jump that began at ``start``."""
    if not n:
        return
    if r.decode_start_s != r.decode_start_s:
        r.decode_start_s = start
    g = r.generated
    if g == 0 and r.first_token_s != r.first_token_s:
        r.first_token_s = ends[0]
    if g <= 1 and g + n >= 2 and r.second_token_s != r.second_token_s:
        r.second_token_s = ends[1 - g]
    r.generated += n


SMALL_GROWTH = 4096
"""Up to this many (step, sequence) pairs, :func:`growth_blocks` counts per pair."""


def growth_blocks(ctx: np.ndarray, held: np.ndarray, block_size: int,
                  steps: int) -> np.ndarray:
    """Extra KV blocks the batch holds before each of ``steps`` steps, beyond ``held``.

    Step j (0-based) needs ceil((ctx + j) / bs) blocks per sequence before it runs. A
    sequence holding h blocks first needs one more at step f = h*bs - ctx + 1 and then
    every bs steps, so the total is a running count of those crossings: O(n*steps/bs)
    work instead of an n x steps matrix.
    """
    bs = block_size
    first = held * bs - ctx + 1
    # Small batches and short stretches (most jumps): the matrix is fewer numpy calls; and
    # a sequence already short of blocks is counted directly.
    if steps * len(ctx) <= SMALL_GROWTH or first.min() < 1:
        j = np.arange(steps, dtype=np.int64)
        need = -(-(ctx[None, :] + j[:, None]) // bs) - held[None, :]
        return np.maximum(need, 0).sum(axis=1)
    first = first[first < steps]
    counts = (steps - 1 - first) // bs + 1  # crossings of each sequence before ``steps``
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts)
    at = np.repeat(first, counts) + offsets * bs
    return np.cumsum(np.bincount(at, minlength=steps))[:steps].astype(np.int64)


def plan_jump(decodes: list[Request], kv: BlockManager, cost: InstanceCostModel,
              pinned_blocks: Callable[[Request], int], start: float, queue_len: int,
              running: int) -> Jump | None:
    """The steps this decode-only batch can run unchanged, or None if too few."""
    remaining = min([r.output_tokens - r.generated for r in decodes])
    if remaining < MIN_JUMP:
        return None
    n = len(decodes)
    ctx = np.array([r.prompt_tokens + r.generated for r in decodes], dtype=np.int64)
    pinned = np.array([pinned_blocks(r) for r in decodes], dtype=np.int64)
    held = np.array([r.blocks for r in decodes], dtype=np.int64) + pinned
    extra = growth_blocks(ctx, held, kv.block_size, remaining)
    steps = np.arange(remaining, dtype=np.int64)
    fits = extra <= kv.available
    k = int(remaining if fits[-1] else np.argmin(fits))
    if k < MIN_JUMP:
        return None
    ctx_sums = int(ctx.sum()) + n * steps[:k]
    series = cost.decode_series(n, ctx_sums)
    return Jump(decodes, start, series, ctx, held, pinned, extra[:k], kv.used, queue_len,
                running)
