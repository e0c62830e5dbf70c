"""Step prices kept between steps: one instance's step times, by batch shape, and its
decode-stretch times by batch size and context sum, priced a window of consecutive
context sums at a time.

**Prefill steps.** The roofline cost model (:class:`~simulator.cost.step.InstanceCostModel`)
is a pure function of the batch shape, and prefill-only shapes repeat: a disaggregated
prefill instance mostly runs one prompt per step, and prompt lengths recur (on 1P1D
Llama-3.1-70B at 10k requests, 63 % of its steps). Their prices are kept by shape, least
recently used dropped beyond ``MAX_STEPS``. Mixed steps (prefill chunks and decodes) are
priced directly: their context sums almost never repeat (about 1 % on the same run). So
are prefill steps of several prompts: their combinations of lengths almost never repeat
either (on the 24-hour replay, benchmarks/README.md (e), 30,769 distinct ones in 30,890
such steps), and kept they would push out the one-prompt shapes that do (43,289 shapes
priced over that replay with them kept, 37,694 without).
A decode-only step that runs alone (a stretch too short to jump, or the step an admission
cuts) is read from the decode series below, so it costs a lookup and has the price it has
inside a stretch, bit for bit.

**Decode stretches.**
A decode step's price depends on the batch only through its size ``n`` and context sum
``S`` (:class:`~simulator.cost.batch.BatchShape`), and a stretch of ``k`` steps asks for
``S0, S0 + n, ..., S0 + n*(k-1)``. The roofline cost model prices such a series
elementwise (:meth:`~simulator.cost.step.InstanceCostModel.decode_series`: every
operation is per element, so a value does not depend on the array it is priced in), and
one call costs about the same for 12 elements as for a few hundred: the numpy calls, not
the elements, are the cost. So the prices of ``WINDOW`` consecutive context sums are
asked for once, kept, and later stretches of the same batch size read their steps from
them (strided slices). Windows start every ``BLOCK`` sums and are two blocks long, so a
stretch spanning up to a block of sums, wherever it starts, reads one window: with
windows of one block, 83 % of the stretches of 1P1D Llama-3.1-70B crossed a window edge
and were joined from two (four numpy joins each). A stretch spanning many blocks (large
batch, long stretch) is priced directly. Other predictors are always asked directly: the measured-kernel-table
predictor keeps count of what it priced (its provenance), and data-parallel attention and
two-batch overlap price a series step by step (a window would cost a step call per
element).

The prices are those of a direct call bit for bit (``tests/test_step_prices.py``).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any

import numpy as np

from simulator.cost.accounting import SeriesStep
from simulator.cost.batch import BatchShape
from simulator.cost.step import DecodeSeries, InstanceCostModel, StepCost
from simulator.engine.recorder import BOUNDS, STEP_COLUMNS

_RECORDED = dict(STEP_COLUMNS)
_CODES = ("d", _RECORDED["bound"], _RECORDED["compute_s"], _RECORDED["memory_s"])
"""Type codes of a series' columns as kept: step seconds in full, bound codes, compute and
memory seconds at the precision the step records store them in."""

BLOCK = 512
"""Kept windows start every ``BLOCK`` context sums."""
WINDOW = 2 * BLOCK
"""Consecutive context sums priced in one call (a window): windows overlap by ``BLOCK``,
so a stretch spanning up to ``BLOCK`` sums reads one window, wherever it starts."""
MAX_SPAN = 3
"""A stretch whose context sums span more blocks than this is priced directly."""
MAX_STEPS = 8192
"""Prefill step prices kept per table (about 1.6 KB each, so at most about 13 MB): one
per prompt length up to 8,192 tokens. On 1P1D Llama-3.1-70B at 50k requests (prompts
up to 8,192 tokens) 7,573 prompt shapes are priced with room for 8,192, 8,556 with room
for 4,096 (shapes dropped and priced again)."""
MAX_BLOCKS = 4096
"""Windows kept per table (17 bytes a context sum, so at most about 71 MB), least recently
used dropped first. On the 24-hour replay's Llama-3.1-70B decode instance at 100k requests
(benchmarks/README.md, (e)) 1,024 kept windows were priced 5.5 k times, 4,096 (or no limit)
2.1 k times."""


def pure(cost: Any) -> bool:
    """Whether ``cost`` is the roofline model, whose prices depend on the shape alone."""
    return type(cost) is InstanceCostModel


def prices_elementwise(cost: Any) -> bool:
    """Whether ``cost`` prices a decode series in one vectorised roofline call."""
    return (pure(cost) and cost.parallelism.pp == 1 and cost.parallelism.dp == 1
            and not cost.two_batch_overlap)


class StepPrices:
    """The step and decode-series prices of one instance's cost model."""

    __slots__ = ("_blocks", "_steps", "cost", "kept", "tabled")

    def __init__(self, cost: Any) -> None:
        self.cost = cost
        self.kept = pure(cost)
        # A step priced on its longest context is asked directly (its windows would need it).
        self.tabled = prices_elementwise(cost) and not cost.decode_needs_longest
        self._steps: OrderedDict[BatchShape, StepCost] = OrderedDict()
        self._blocks: OrderedDict[tuple[int, int], DecodeSeries] = OrderedDict()

    def step(self, shape: BatchShape) -> StepCost | SeriesStep:
        """The price of one step of ``shape``: kept for one-prompt prefill shapes; a decode-only
        step of a table-priced model is read from the decode series its stretches read, so
        a decode step has one price whether it runs alone or in a stretch."""
        if shape.decode_seqs:
            if (self.tabled and not shape.prefill_tokens
                    and shape.logits_seqs == shape.decode_seqs):
                return self.decode_step(shape.decode_seqs, shape.decode_ctx_tokens)
            return self.cost.step(shape)  # type: ignore[no-any-return]
        if not self.kept or shape.prefill_seqs > 1:
            return self.cost.step(shape)  # type: ignore[no-any-return]
        steps = self._steps
        price = steps.get(shape)
        if price is not None:
            steps.move_to_end(shape)
            return price
        price = steps[shape] = self.cost.step(shape)
        if len(steps) > MAX_STEPS:
            steps.popitem(last=False)
        return price

    def clear(self) -> None:
        """Drop what is kept (the clock has stopped: the memory goes back before the run's
        frames are built)."""
        self._steps.clear()
        self._blocks.clear()

    def decode_step(self, n: int, s: int) -> SeriesStep:
        """One decode-only step of ``n`` sequences at context sum ``s``: element ``s`` of
        the window :meth:`series` reads it from (``tabled`` models only)."""
        b = s // BLOCK
        sec, bound, comp, mem = self._window(n, b)
        j = s - b * BLOCK
        seconds = float(sec[j])
        return SeriesStep(seconds, (seconds,), float(comp[j]), float(mem[j]),
                          BOUNDS[int(bound[j])])

    def series(self, n: int, s0: int, k: int, longest: int = 0) -> DecodeSeries:
        """Prices of ``k`` decode steps of ``n`` sequences from context sum ``s0``, the
        longest sequence at ``longest`` tokens (0: not given) and one more each step."""
        last = s0 + n * (k - 1)
        b0 = s0 // BLOCK
        if not self.tabled or last // BLOCK - b0 >= MAX_SPAN:
            steps = np.arange(k, dtype=np.int64)
            return _kept(self.cost.decode_series(n, s0 + n * steps,
                                                 longest + steps if longest else None))
        if last < b0 * BLOCK + WINDOW:  # most stretches: a strided slice of one window
            lo = s0 - b0 * BLOCK
            hi = lo + n * k
            key = (n, b0)
            window = self._blocks.get(key)
            if window is None:
                window = self._window(n, b0)
            else:  # kept: the most recently used (as _window marks it)
                self._blocks.move_to_end(key)
            sec, bound, comp, mem = window
            return DecodeSeries(sec[lo:hi:n], bound[lo:hi:n], comp[lo:hi:n], mem[lo:hi:n])
        parts = []
        for b in range(b0, last // BLOCK + 1, WINDOW // BLOCK):
            # The stretch's context sums inside this window: s0 + n*j, strided by n.
            lo = max(s0, b * BLOCK)
            first = lo + (s0 - lo) % n - b * BLOCK
            stop = min(last, b * BLOCK + WINDOW - 1) - b * BLOCK + 1
            parts.append([column[first:stop:n] for column in self._window(n, b)])
        joined = [array(code) for code in _CODES]
        for columns in parts:
            for out, column in zip(joined, columns, strict=True):
                out.extend(column)
        return DecodeSeries(*joined)

    def _window(self, n: int, b: int) -> DecodeSeries:
        """The prices of context sums ``b*BLOCK .. b*BLOCK + WINDOW - 1`` at batch size ``n``."""
        key = (n, b)
        blocks = self._blocks
        block = blocks.get(key)
        if block is not None:
            blocks.move_to_end(key)
            return block
        block = _kept(self.cost.decode_series(n, b * BLOCK + np.arange(WINDOW, dtype=np.int64)))
        blocks[key] = block
        if len(blocks) > MAX_BLOCKS:
            blocks.popitem(last=False)
        return block


def _kept(series: DecodeSeries) -> DecodeSeries:
    """``series`` as kept and handed to a jump: each column an ``array`` of its
    :data:`_CODES` type (compute and memory seconds and bound codes at the precision the
    step records store them in, so the recorded values are unchanged), which a jump
    slices, sums and appends to the records without a numpy call."""
    return DecodeSeries(*(array(code, np.ascontiguousarray(column, dtype=code).tobytes())
                          for code, column in zip(_CODES, series, strict=True)))


class PriceTables:
    """A cluster's kept prices: instances whose roofline cost models are equal (same
    model, device, layout, links and engine constants, so the same prices) share one
    table, which also pools what they have priced."""

    __slots__ = ("_tables",)

    def __init__(self) -> None:
        self._tables: list[StepPrices] = []

    def for_cost(self, cost: Any) -> StepPrices:
        if pure(cost):
            for table in self._tables:
                if table.cost is cost or table.cost == cost:
                    return table
        table = StepPrices(cost)
        if table.kept:
            self._tables.append(table)
        return table
