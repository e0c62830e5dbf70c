"""Decode fast-forward: a decode-only stretch priced in one call, exact by construction.

When an instance's batch is decode-only and cannot change until a known step (the first
completion, or the first step whose KV growth would not fit), its steps are priced in one
vectorised call and the clock jumps to the end. The result must be that of step-by-step
simulation, so one rule holds, enforced by the instance's gate (:func:`observes`,
:func:`mutates`, :func:`absorbs`, :func:`joins`; :func:`unbooked` marks the reads a jump
cannot affect):

* every outside **read** of the instance first brings the jump up to date: the KV blocks
  of the steps that have started by now are booked, as step-by-step simulation allocates
  a step's blocks when it starts (allocations may evict prefix-cache entries, so a cache
  lookup is a read too);
* every outside **write** cuts the jump: the step then running finishes and the instance
  schedules again, as it would after every step;
* except a write the jump can **absorb**: one that changes only what a hand-off reserves
  here (a reservation takes KV blocks; a re-bound one takes none), which no scheduling
  policy reads but through the KV it leaves. Step by step, every later step of the jump
  would then be scheduled the same (the same batch, nothing preempted, nothing admitted)
  exactly when the KV that allocations can still get covers the growth of the jump's
  remaining steps, so the jump goes on when it does (:meth:`Jump.absorb`) and is cut as
  any write otherwise. The write is cut as any other where the policy reads more than the
  batch and its KV growth: something waits (an admission reads the KV left), or the
  instance swaps to a host tier (a swap-in does).

A jump also **goes on across its end** when step by step the next step would be scheduled
as the survivors of its batch (the batch minus the sequences it completed), nothing
admitted, nothing preempted: the instance wakes at the step that ends it (its last
sequences complete then, at their time, freeing their KV, as after any step), and plans
the next jump over the requests still running without a scheduling pass
(:meth:`~simulator.engine.process.ServingProcess._jump_on`) exactly when

* the jump ended uncut (no outside write cut it), and no write made while its completions
  were booked touched the queue, the aborts or a host swap: nothing waits, nothing is
  aborted, the instance swaps to no host tier (every policy then decodes every running
  request, as the step before, since a subset of a batch that fit fits), and it runs at
  full speed;
* or the only writes that cut it **joined** requests to the batch (:func:`joins`: a
  hand-off's KV arrived, and the request decodes from the next step), the same holds, and
  the policy says that a pass over that many running requests, all decoding and their
  growth fitting, decodes every one (``Scheduler.joins``: vLLM's token budget holds one
  token each; the other policies say no, and their passes run);
* the first step's KV growth and the following ones fit what allocations can get (the
  plan's own fit test; a step that does not fit would preempt), and the plan books that
  first step's blocks as the scheduling pass would, each request's growth;
* its steps are priced by the same call a fresh jump would make (``StepPrices.series``
  over the survivors), so each step's price and end are those of step-by-step simulation;
  shorter than :data:`MIN_JUMP` only where a step run alone is priced from that same
  series (``StepPrices.tabled``).

The policy's state moves as the skipped pass would move it (``Scheduler.advance``).
Anything else falls back to the scheduling pass.

Step rows are those step-by-step simulation records: each step's KV after its own
allocation and the KV absorbed writes took before it ended, and the queue and batch sizes
of the jump's start for every step that ended before the first outside write that cut it
(the step running at that write records the values at its end).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from functools import wraps
from itertools import accumulate
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from simulator.engine.request import State

if TYPE_CHECKING:
    from array import array

    from simulator.cost.step import DecodeSeries
    from simulator.engine.kv import BlockManager
    from simulator.engine.recorder import Recorder
    from simulator.engine.request import Request
    from simulator.engine.step_prices import StepPrices

MIN_JUMP = 3
"""Shortest stretch worth a jump (shorter ones run step by step)."""

F = TypeVar("F", bound=Callable[..., Any])


def observes(fn: F) -> F:
    """Gate of an outside read: bring a running jump up to date first."""
    @wraps(fn)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        jump = self._jump
        if jump is not None:
            now = self.env.now
            if now != jump.last_sync:  # routers read many times in one instant
                jump.sync(self._kv.blocks, now)
        return fn(self, *args, **kwargs)

    gated.__gate__ = "observes"  # type: ignore[attr-defined]
    return gated  # type: ignore[return-value]


def unbooked(fn: F) -> F:
    """Gate of an outside read of state a jump never changes (the instance's constants,
    its life: alive, powered, draining): nothing to bring up to date, so no wrapper.

    A jump changes the KV booked, the sequences' tokens and the step rows; a read of
    anything else returns the same whether the jump's steps are booked now or later
    (booking is a function of the clock, not of when it is done).
    """
    fn.__gate__ = "unbooked"  # type: ignore[attr-defined]
    return fn


def _cutting(fn: F, gate: str, needs_pass: bool) -> F:
    """A gate that brings a running jump up to date and cuts it before ``fn`` writes (the
    step running now ends it), ``needs_pass`` saying whether the scheduling pass must decide
    what follows; afterwards the routers' load index is told the load may have changed."""
    @wraps(fn)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        jump = self._jump
        if jump is not None:
            now = self.env.now
            jump.sync(self._kv.blocks, now)
            if needs_pass:
                jump.needs_pass = True
            if jump.cut(now):  # the first write: the step running now ends the jump
                self.process.interrupt("cut")
        out = fn(self, *args, **kwargs)
        if self.on_load_change is not None:  # a write may change what routers read
            self.on_load_change(self)
        return out

    gated.__gate__ = gate  # type: ignore[attr-defined]
    return gated  # type: ignore[return-value]


def mutates(fn: F) -> F:
    """Gate of an outside write: bring a running jump up to date, then cut it, what comes
    next being the scheduling pass's to decide; afterwards tell the routers' load index
    that the instance's load may have changed."""
    return _cutting(fn, "mutates", needs_pass=True)


def joins(fn: F) -> F:
    """Gate of an outside write that adds a request to the running batch (it decodes from
    the next step): bring a running jump up to date and cut it, as :func:`mutates`, but
    the next jump may go on over the batch with the joined request without a scheduling
    pass (see the module docstring); afterwards tell the routers' load index that the
    instance's load may have changed."""
    return _cutting(fn, "joins", needs_pass=False)


def absorbs(fn: F) -> F:
    """Gate of an outside write a jump can absorb (it changes only what a hand-off reserves
    here): bring a running jump up to date, write, then let the jump go on if its remaining
    steps are scheduled the same (see the module docstring), or cut it; afterwards tell the
    routers' load index that the instance's load may have changed."""
    @wraps(fn)
    def gated(self: Any, *args: Any, **kwargs: Any) -> Any:
        jump = self._jump
        if jump is None:
            out = fn(self, *args, **kwargs)
        else:
            now = self.env.now
            kv = self._kv.blocks
            jump.sync(kv, now)
            used = kv.used
            out = fn(self, *args, **kwargs)
            if jump.cut_at is None:  # (a jump already cut ends with the step running)
                # The policy reads only the batch and its KV growth, or more (see above).
                quiet = not self._waiting and self._swap is None
                if not (quiet and jump.absorb(kv, now, kv.used - used)):
                    jump.needs_pass = True
                    jump.cut(now)
                    self.process.interrupt("cut")
        if self.on_load_change is not None:
            self.on_load_change(self)
        return out

    gated.__gate__ = "absorbs"  # type: ignore[attr-defined]
    return gated  # type: ignore[return-value]


class Jump:
    """The state of one jump: its steps, and the KV booked so far.

    The batch's per-sequence state (context, blocks held and pinned) is read from the
    request objects once, when the jump is planned, as plain lists; everything else (step
    ends, KV booked per step, the step rows) is derived from those lists and the priced
    series with plain Python arithmetic, which is cheaper than numpy for the few sequences
    and steps of a typical jump (measured: benchmarks/README.md).
    """

    __slots__ = ("booked", "cancelled", "completes", "ctx", "ctx_sum", "cut_at", "decodes",
                 "ends", "extra", "held", "k", "last_sync", "needs_pass", "pinned", "queue_len",
                 "running", "scheduled", "series", "start", "used")

    def __init__(self, decodes: list[Request], start: float, series: DecodeSeries,
                 ctx: list[int], ctx_sum: int, held: list[int], pinned: list[int],
                 extra: list[int], kv_used: int, queue_len: int, running: int,
                 scheduled: bool = True, completes: bool = True) -> None:
        self.decodes = decodes
        # Its last step completes a sequence (it runs to the batch's fewest tokens left);
        # before that step none completes.
        self.completes = completes
        self.scheduled = scheduled  # its first step came from a scheduling pass
        self.start = start
        self.series = series
        self.k = len(series.seconds)
        # Sequential sums, as numpy's cumsum adds (bit for bit).
        ends = list(accumulate(series.seconds, initial=start))
        del ends[0]
        self.ends: list[float] = ends
        self.ctx, self.held, self.pinned = ctx, held, pinned
        self.ctx_sum = ctx_sum  # sum(ctx)
        self.extra = extra  # cumulative extra KV blocks before step j
        self.booked = 1  # steps whose KV is booked (step 0's came with the batch)
        self.used = [kv_used]  # KV used after booking step j
        self.queue_len, self.running = queue_len, running  # at the jump's start
        self.cut_at: float | None = None  # time of the first outside write
        self.needs_pass = False  # a write other than a join (:func:`joins`) cut it
        self.cancelled = False  # a client of the batch gave up during the jump
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
            self.used.extend([base + e for e in extra[lo: j + 1]])
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

    def absorb(self, kv: BlockManager, now: float, taken: int) -> bool:
        """An outside write at ``now`` took ``taken`` KV blocks (after :meth:`sync`): True if
        the remaining steps' growth still fits what allocations can get, so each is
        scheduled as planned; the booked steps ending at or after ``now`` (the one running)
        then record the blocks taken, as the steps booked later will."""
        if self.extra[-1] - self.extra[self.booked - 1] > kv.available:
            return False
        if taken:
            used = self.used
            for i in range(bisect_left(self.ends, now, 0, self.booked), self.booked):
                used[i] += taken
        return True

    # ----- ending ----------------------------------------------------------------------
    def cut(self, now: float) -> bool:
        """An outside write at ``now``; True if it is the first (the jump must stop)."""
        if self.cut_at is not None:
            return False
        self.cut_at = now
        return True

    def steps_done_at_cut(self, now: float) -> int:
        """Steps that run when cut at ``now``: those ended, plus the one running."""
        return min(bisect_left(self.ends, now) + 1, self.k)

    def steps_ended_by(self, now: float) -> int:
        return bisect_right(self.ends, now)

    def row_values(self, done: int, kv_used: int) -> tuple[list[int], int]:
        """KV used of each of the first ``done`` steps, and how many of them ended before
        the first outside write.

        Steps that ended before the first outside write record the jump's own state (its
        KV booked, the queue and batch of its start); the steps ending at or after it (the
        one running at that write) record the state at its end.
        """
        used = self.used[:done]
        late = done if self.cut_at is None else bisect_left(self.ends, self.cut_at, 0, done)
        if late < done:
            used[late:] = [kv_used] * (done - late)
        return used, late

    # ----- booking the result --------------------------------------------------------
    def apply(self, done: int, kv: BlockManager, recorder: Recorder, index: int,
              queue_len: int, running: int) -> list[Request]:
        """Record the first ``done`` steps and advance the sequences; return those that
        reached their output length (the instance caps and completes them)."""
        self.settle(kv, done)
        decodes, start, ends = self.decodes, self.start, self.ends
        n = len(decodes)
        used, late = self.row_values(done, kv.used)
        # A kept series' columns are ``array``s of the recorded types (StepPrices hands out
        # no other), which the recorder appends as they are.
        seconds, bounds, compute_s, memory_s = cast("tuple[array[Any], ...]", self.series)
        if done < self.k:  # cut short: its first ``done`` steps
            seconds, bounds = seconds[:done], bounds[:done]
            compute_s, memory_s = compute_s[:done], memory_s[:done]
        starts = [start, *ends[: done - 1]]
        q0, r0 = self.queue_len, self.running
        if recorder.record_steps == "all":
            rest = done - late
            recorder.steps_bulk(
                index, starts, seconds, n, range(self.ctx_sum, self.ctx_sum + n * done, n),
                used, kv.total, [q0] * late + [queue_len] * rest,
                [r0] * late + [running] * rest, bounds, compute_s, memory_s,
            )
        else:  # one stretch row: only the step running at a cut ends in the state after it
            assert done - late <= 1
            recorder.stretch(
                index, starts, seconds, n, self.ctx_sum, used, kv.total,
                q0 if late else queue_len, r0 if late else running,
                queue_len if late < done else q0, running if late < done else r0,
                bounds, compute_s, memory_s,
            )
        bs, last = kv.block_size, done - 1
        if self.cancelled:
            finished = []
            for r, c, h, p in zip(decodes, self.ctx, self.held, self.pinned, strict=True):
                need = -(-(c + last) // bs)
                r.blocks = (h if h > need else need) - p
                if r.status is State.CANCELLED:
                    continue  # its tokens were booked when its client gave up (book_cancelled)
                g = r.generated
                if g < 2 or r.decode_start_s != r.decode_start_s:
                    book_tokens(r, start, ends, done)  # its first decode steps: their times
                else:
                    r.generated = g + done
                if g + done >= r.output_tokens:
                    finished.append(r)
            return finished
        for r, c, h, p in zip(decodes, self.ctx, self.held, self.pinned, strict=True):
            need = -(-(c + last) // bs)
            r.blocks = (h if h > need else need) - p
            g = r.generated
            if g < 2 or r.decode_start_s != r.decode_start_s:
                book_tokens(r, start, ends, done)  # its first decode steps: their times
            else:
                r.generated = g + done
        if done < self.k or not self.completes:  # no sequence reached its length before
            return []
        return [r for r in decodes if r.generated >= r.output_tokens]

    def book_cancelled(self, req: Request, now: float) -> None:
        """``req``'s client gave up at ``now``: it received the tokens of the steps that
        ended before (a step ending at ``now`` ends after the client's timer, which was
        set first); its KV stays booked with the others' until the jump is applied."""
        self.cancelled = True
        book_tokens(req, self.start, self.ends, bisect_left(self.ends, now))


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
"""Up to this many (step, sequence) pairs, :func:`growth_blocks` counts in plain Python;
above, in numpy (fewer interpreted operations for large batches and long stretches)."""


def growth_blocks(ctx: Sequence[int], held: Sequence[int], block_size: int,
                  steps: int) -> list[int]:
    """Extra KV blocks the batch holds before each of ``steps`` steps, beyond ``held``.

    Step j (0-based) needs ceil((ctx + j) / bs) blocks per sequence before it runs. A
    sequence holding h >= ceil(ctx / bs) blocks first needs one more at step
    f = h*bs - ctx + 1 and then every bs steps; one already short of blocks needs its
    shortfall from step 0 and one more at each later block crossing. The total is a
    running count of those crossings: O(n*steps/bs) work instead of an n x steps matrix.
    """
    bs = block_size
    if steps * len(ctx) > SMALL_GROWTH:
        return _growth_blocks_np(np.asarray(ctx, dtype=np.int64),
                                 np.asarray(held, dtype=np.int64), bs, steps)
    at = [0] * steps  # new blocks needed at step j
    for c, h in zip(ctx, held, strict=True):
        first = h * bs - c + 1
        if first < 1:  # already short: its shortfall now, then at each crossing
            at[0] += -(-c // bs) - h
            first = (1 - c) % bs or bs
        if first < steps:  # most stretches cross a sequence's block edge once at most
            at[first] += 1
            if first + bs < steps:
                for j in range(first + bs, steps, bs):
                    at[j] += 1
    return list(accumulate(at))


def _growth_blocks_np(ctx: np.ndarray, held: np.ndarray, bs: int, steps: int) -> list[int]:
    """:func:`growth_blocks` of a large batch or long stretch, the crossings in numpy."""
    first = held * bs - ctx + 1
    short = first < 1
    base = int((-(-ctx[short] // bs) - held[short]).sum())
    first = np.where(short, (1 - ctx) % bs, first)
    first = np.where(first == 0, bs, first)
    first = first[first < steps]
    counts = (steps - 1 - first) // bs + 1  # crossings of each sequence before ``steps``
    offsets = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
        np.cumsum(counts) - counts, counts)
    at = np.bincount(np.repeat(first, counts) + offsets * bs, minlength=steps)[:steps]
    at[0] += base
    return np.cumsum(at).tolist()


def plan_jump(decodes: list[Request], kv: BlockManager, prices: StepPrices,
              pinned_blocks: Callable[[Request], int] | None, start: float, queue_len: int,
              running: int, scheduled: bool = True) -> Jump | None:
    """The steps this decode-only batch can run unchanged, or None if too few.

    ``pinned_blocks`` gives the leading blocks of a request the prefix cache owns (None:
    no prefix cache, nothing pinned). ``scheduled``: a scheduling pass chose the first
    step and booked its KV; otherwise (a jump going on, see the module docstring) the plan
    books it, each request's growth as the pass would, when the jump is taken.
    """
    remaining = min([r.output_tokens - r.generated for r in decodes])
    least = MIN_JUMP if scheduled or not prices.tabled else 1
    if remaining < least:
        return None
    n = len(decodes)
    ctx = [r.prompt_tokens + r.generated for r in decodes]
    if pinned_blocks is None:
        pinned = [0] * n
        held = [r.blocks for r in decodes]
    else:
        pinned = [pinned_blocks(r) for r in decodes]
        held = [r.blocks + p for r, p in zip(decodes, pinned, strict=True)]
    bs = kv.block_size
    extra = growth_blocks(ctx, held, bs, remaining)
    # ``extra`` never decreases: the steps that fit are those up to the first that does not.
    k = remaining if extra[-1] <= kv.available else bisect_right(extra, kv.available)
    if k < least:
        return None
    if extra[0]:  # the first step's growth, unbooked without a pass: book it as one would
        for r, c, h in zip(decodes, ctx, held, strict=True):
            need = -(-c // bs) - h
            if need > 0:
                r.blocks += need
        kv.allocate(extra[0])
    ctx_sum = sum(ctx)
    series = prices.series(n, ctx_sum, k, max(ctx))
    return Jump(decodes, start, series, ctx, ctx_sum, held, pinned,
                extra if k == remaining else extra[:k], kv.used, queue_len, running, scheduled,
                k == remaining)
