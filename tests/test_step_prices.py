"""Step and decode-series prices kept between steps equal a direct pricing call, bit for bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import Simulation
from simulator.cost.batch import BatchShape
from simulator.engine import step_prices
from simulator.engine.recorder import BOUNDS, STEP_COLUMNS
from simulator.engine.step_prices import (
    BLOCK,
    WINDOW,
    PriceTables,
    StepPrices,
    prices_elementwise,
    pure,
)
from simulator.scenario.load import load_scenario, scenario_dir
from tests.test_invariants import SHIPPED

RECORDED = dict(STEP_COLUMNS)


def _cost_models() -> list[Any]:
    """The cost model of every distinct pool of the shipped scenarios that fast-forwards
    (single-stage, no speculative decoding)."""
    out, seen = [], set()
    for path in SHIPPED:
        plan = Simulation(load_scenario(path), scenario_dir(path), str(path)).plan
        for spec in plan.instances:
            key = (path.name, spec.pool)
            if key not in seen and spec.cost.parallelism.pp == 1 and spec.speculative is None:
                seen.add(key)
                out.append(spec.cost)
    return out


COSTS = _cost_models()
TABLED = [c for c in COSTS if prices_elementwise(c)]


def test_shipped_layouts_are_priced_both_ways() -> None:
    assert TABLED, "no shipped layout uses kept prices"
    assert len(TABLED) < len(COSTS), "every shipped layout uses kept prices"


def assert_same_series(got: Any, want: Any) -> None:
    assert np.array_equal(got.seconds, want.seconds)  # step times: bit for bit
    assert np.array_equal(got.bound, want.bound)
    # compute and memory seconds, at the precision the step records keep them
    for name, a, b in (("compute_s", got.compute_s, want.compute_s),
                       ("memory_s", got.memory_s, want.memory_s)):
        dtype = np.dtype(RECORDED[name])
        assert np.array_equal(np.asarray(a, dtype=dtype), np.asarray(b, dtype=dtype)), name


@settings(max_examples=60, deadline=None)
@given(which=st.integers(0, 10**6),
       stretches=st.lists(st.one_of(
           # typical stretches (inside a block or across one edge), and long ones
           st.tuples(st.integers(1, 64), st.integers(0, 100_000), st.integers(1, 80)),
           st.tuples(st.integers(1, 300), st.integers(0, 400_000), st.integers(1, 400))),
           min_size=1, max_size=12),
       max_blocks=st.sampled_from([1, 2, 1024]))
def test_kept_prices_equal_a_direct_call(which: int, stretches: list[tuple[int, int, int]],
                                         max_blocks: int) -> None:
    """Any sequence of stretches (batch size, first context sum, steps), across block edges
    and with blocks dropped from a full table, reads the prices a direct call gives."""
    cost = COSTS[which % len(COSTS)]
    prices = StepPrices(cost)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_prices, "MAX_BLOCKS", max_blocks)
        for n, s0, k in stretches:
            first = max(s0, n)  # every sequence holds at least one token
            got = prices.series(n, first, k)
            want = cost.decode_series(n, first + n * np.arange(k, dtype=np.int64))
            assert_same_series(got, want)
        assert len(prices._blocks) <= max_blocks


def _counting(cost: Any, mp: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = cost.decode_series

    def counting(n: int, ctx: np.ndarray) -> Any:
        calls.append(len(ctx))
        return real(n, ctx)

    mp.setattr(cost, "decode_series", counting)
    return calls


def test_a_stretch_inside_one_window_reuses_it() -> None:
    cost = TABLED[0]
    prices = StepPrices(cost)
    with pytest.MonkeyPatch.context() as mp:
        calls = _counting(cost, mp)
        prices.series(8, 3 * BLOCK + 5, 20)
        prices.series(8, 3 * BLOCK + 6, 30)  # same window, another residue: no call
        prices.series(9, 3 * BLOCK + 6, 30)  # another batch size: its own window
    assert calls == [WINDOW, WINDOW]


def test_a_stretch_across_a_block_edge_reads_one_window() -> None:
    """Windows overlap by a block: a stretch starting near a block's end runs on into the
    next block inside the same window (one call, no join of two)."""
    cost = TABLED[0]
    prices = StepPrices(cost)
    with pytest.MonkeyPatch.context() as mp:
        calls = _counting(cost, mp)
        got = prices.series(16, 4 * BLOCK - 40, 20)  # sums 4*BLOCK-40 .. 4*BLOCK+264
        prices.series(16, 4 * BLOCK - 8, 30)
    assert calls == [WINDOW]
    want = cost.decode_series(16, 4 * BLOCK - 40 + 16 * np.arange(20, dtype=np.int64))
    assert_same_series(got, want)


@settings(max_examples=40, deadline=None)
@given(which=st.integers(0, 10**6),
       shapes=st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 4096),
                                 st.integers(0, 64), st.integers(0, 20_000)),
                       min_size=1, max_size=30),
       max_steps=st.sampled_from([1, 3, 8192]))
def test_kept_step_prices_equal_a_direct_call(which: int,
                                              shapes: list[tuple[int, int, int, int]],
                                              max_steps: int) -> None:
    """Prefill (of one prompt and of several), mixed and decode shapes, repeated and with
    entries dropped from a full table, price as ``cost.step`` does."""
    cost = COSTS[which % len(COSTS)]
    prices = StepPrices(cost)
    assert prices.kept == pure(cost)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_prices, "MAX_STEPS", max_steps)
        for new, cached, seqs, ctx in [*shapes, *shapes]:  # each shape at least twice
            shape = BatchShape.build([(new, cached, True)], [ctx // max(seqs, 1)] * seqs)
            assert prices.step(shape) == cost.step(shape)
            several = BatchShape.build([(new, cached, True), (1 + new // 2, 0, True)])
            assert prices.step(several) == cost.step(several)
        assert len(prices._steps) <= max_steps


@settings(max_examples=40, deadline=None)
@given(which=st.integers(0, 10**6),
       steps=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 400_000)),
                      min_size=1, max_size=20))
def test_a_decode_only_step_has_the_price_of_its_stretch(which: int,
                                                         steps: list[tuple[int, int]]) -> None:
    """A decode-only step priced alone reads the decode series a stretch through it reads,
    bit for bit (``cost.step`` and ``cost.decode_series`` add the same terms in another
    order, so they could differ in the last bit); other predictors are asked directly."""
    cost = COSTS[which % len(COSTS)]
    prices = StepPrices(cost)
    for n, drawn in steps:
        s = max(drawn, n)  # every sequence holds at least one token
        got = prices.step(BatchShape.decode(n, s))
        if not prices.tabled:
            assert got == cost.step(BatchShape.decode(n, s))
            continue
        want = cost.decode_series(n, np.array([s, s + n], dtype=np.int64))
        assert got.seconds == want.seconds[0]
        assert got.stage_seconds == (got.seconds,)
        assert got.bound == BOUNDS[int(want.bound[0])]
        direct = cost.step(BatchShape.decode(n, s))
        assert got.bound == direct.bound
        assert got.seconds == pytest.approx(direct.seconds, rel=1e-12)
        for name in ("compute_s", "memory_s"):
            dtype = np.dtype(RECORDED[name])
            assert dtype.type(getattr(got, name)) == np.asarray(
                getattr(want, name), dtype=dtype)[0], name


def _tables_by_pool(name: str) -> dict[str, set[int]]:
    path = next(p for p in SHIPPED if p.name == name)
    plan = Simulation(load_scenario(path), scenario_dir(path), str(path)).plan
    tables = PriceTables()
    by_pool: dict[str, set[int]] = {}
    for spec in plan.instances:
        by_pool.setdefault(spec.pool, set()).add(id(tables.for_cost(spec.cost)))
    return by_pool


def test_instances_priced_alike_share_one_table() -> None:
    # 1 prefill + 2 decode instances, all Llama-3.1-70B on H100 TP4: one cost model, one table
    by_pool = _tables_by_pool("1p2d_conv.yaml")
    assert len(by_pool) == 2
    assert len(set.union(*by_pool.values())) == 1, by_pool
    # H100 prefill, LPU decode: priced apart
    by_pool = _tables_by_pool("llama3170b_h100_prefill_lpu_decode.yaml")
    assert len(by_pool) == 2
    assert all(len(v) == 1 for v in by_pool.values()), by_pool
    assert len(set.union(*by_pool.values())) == 2, by_pool


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 2**40), min_size=1, max_size=64))
def test_a_decode_only_shape_is_the_shape_build_gives(contexts: list[int]) -> None:
    """The serving loop prices a decode-only step by ``BatchShape.decode`` of its batch size,
    context sum and longest context: the same shape, field for field and type for type, as
    ``build``."""
    built = BatchShape.build((), iter(contexts))
    direct = BatchShape.decode(len(contexts), sum(contexts), max(contexts))
    assert direct == built
    assert hash(direct) == hash(built)
    for name in BatchShape.__dataclass_fields__:
        assert type(getattr(direct, name)) is type(getattr(built, name)), name
