"""The summary computed from steps as a run keeps them (stretches, never expanded).

Two properties: the weighted percentile of a (value, count) multiset is numpy's default
``linear`` percentile of the repeated values, bit for bit, by either way of finding the
order statistics; and every step figure of the summary (ITL gaps and their weights,
device seconds per pool, the last step's end, the warm-up cut) computed from compact
records equals the one computed from the expanded steps frame, bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.engine.recorder import Recorder
from simulator.metrics import percentile
from simulator.metrics.summary import itl_gaps, summarize, weighted_percentiles
from tests.test_record_steps import _scenario

QS = (0, 1, 25, 50, 90, 99, 100)


def _numpy(values: np.ndarray, weights: np.ndarray, q: int) -> float:
    return float(np.percentile(np.repeat(values, weights), q))


def test_the_90th_percentile_of_two_values_is_numpys_to_the_last_bit() -> None:
    # (n - 1) * 90 / 100 and (n - 1) * 0.9 round differently, and numpy interpolates
    # from the upper value above t = 0.5: 0.27999999999999997, not 0.28.
    values, weights = np.array([0.1, 0.3]), np.array([1, 1])
    assert weighted_percentiles(values, weights, (90,))[90] == _numpy(values, weights, 90)


magnitudes = st.sampled_from([1e-6, 1e-3, 0.02, 1.0, 1e3])


@settings(max_examples=300, deadline=None)
@given(data=st.data(), scale=magnitudes, negative=st.booleans())
def test_weighted_percentile_is_numpys_on_the_repeated_values(data: Any, scale: float,
                                                             negative: bool) -> None:
    n = data.draw(st.integers(1, 30))
    pool = data.draw(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=8))
    values = np.array([pool[data.draw(st.integers(0, len(pool) - 1))] for _ in range(n)])
    values = values * scale - (5 * scale if negative else 0.0)
    weights = np.array(data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n)))
    if weights.sum() == 0:
        weights[0] = 1
    expected = {q: _numpy(values, weights, q) for q in QS}
    assert weighted_percentiles(values, weights, QS) == expected
    n_total = int(weights.sum())
    ranks = sorted({r for q in QS for r in percentile._virtual_index(n_total, q)[:2]})
    by_sort = percentile.order_statistics_by_sort(values, weights, ranks)
    by_radix = percentile.order_statistics_by_radix(values, weights, ranks)
    assert by_sort == by_radix


def test_radix_selection_reads_values_chunk_by_chunk(monkeypatch: Any) -> None:
    rng = np.random.default_rng(7)
    values = np.round(rng.lognormal(-3.5, 0.4, 5000), 5)
    weights = rng.integers(0, 40, 5000)
    monkeypatch.setattr(percentile, "CHUNK", 333)
    monkeypatch.setattr(percentile, "SORT_BELOW", 0)
    expected = {q: _numpy(values, weights, q) for q in QS}
    assert weighted_percentiles(values, weights, QS) == expected


def test_nothing_weighted_gives_nan() -> None:
    out = weighted_percentiles(np.array([1.0, 2.0]), np.array([0, 0]))
    assert all(math.isnan(v) for v in out.values())


# ----- compact records against the expanded frame -----------------------------------


def _record(draw: Any) -> Recorder:
    """Random ordinary steps and decode stretches on three instances of two pools.

    Steps of an instance mostly follow each other; some overlap (pipeline micro-batches)
    so that ends come out of order, with or without stretches on that instance.
    """
    rec = Recorder("stretches")
    clock = [0.0, 0.5, 0.25]
    for _ in range(draw(st.integers(0, 14))):
        inst = draw(st.integers(0, 2))
        gap = draw(st.sampled_from([0.0, 0.0, 0.01, 0.3, -0.05]))
        start = max(clock[inst] + gap, 0.0)
        if draw(st.booleans()):
            seqs = draw(st.integers(0, 4))
            dur = draw(st.floats(0.001, 0.2))
            tokens = seqs + draw(st.sampled_from([0, 0, 0, 2]))
            rec.step(inst, start, dur, dur / draw(st.sampled_from([1, 2])),
                     draw(st.integers(0, 64)), 1, seqs, 100 * seqs, 10, 99, 0, seqs,
                     "memory", dur / 2, dur / 3, tokens)
            clock[inst] = start + dur
        else:
            n = draw(st.integers(1, 6))
            seqs = draw(st.integers(1, 4))
            durs = [draw(st.floats(0.001, 0.05)) for _ in range(n)]
            starts, t = [], start
            for d in durs:
                starts.append(t)
                t = t + d
            rec.steps_bulk(inst, starts, np.array(durs), seqs,
                           [500 + seqs * j for j in range(n)], [10 + j for j in range(n)],
                           99, [0] * n, [seqs] * n, np.zeros(n, dtype=np.int8),
                           np.array(durs) / 2, np.array(durs) / 3)
            clock[inst] = t
    return rec


NAMES, POOLS = ["p/0", "d/0", "d/1"], ["p", "d", "d"]


def _requests(n: int) -> pd.DataFrame:
    arrival = np.linspace(0.0, 1.0, n)
    return pd.DataFrame({
        "request_id": np.arange(n), "status": ["completed"] * n, "arrival_s": arrival,
        "first_token_s": arrival + 0.2, "completion_s": arrival + 1.5,
        "prompt_tokens": np.full(n, 100), "generated_tokens": np.full(n, 20),
        "preemptions": np.zeros(n, dtype=int), "ttft_s": np.full(n, 0.2),
        "tpot_s": np.full(n, 0.05), "e2e_s": np.full(n, 1.5),
    })


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert list(a) == list(b)
    for k, v in a.items():
        assert (isinstance(v, float) and math.isnan(v) and math.isnan(b[k])) or v == b[k], k


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_step_figures_from_stretches_equal_those_of_the_expanded_frame(data: Any) -> None:
    rec = _record(data.draw)
    frame = rec.steps_frame(NAMES, POOLS)
    compact = rec.compact_steps(NAMES, POOLS)
    assert len(compact) == len(frame)
    gaps, seqs, burst = compact.itl()
    expected = itl_gaps(frame)
    n = len(frame)
    np.testing.assert_array_equal(gaps[:n], expected)
    np.testing.assert_array_equal(seqs[:n], frame["decode_seqs"].to_numpy())
    assert burst == int((frame["decode_tokens"] - frame["decode_seqs"]).sum())
    if len(frame):
        assert compact.last_end() == float((frame["start_s"] + frame["duration_s"]).max())
        busy, instances = compact.busy_by_pool()
        by_frame = frame.groupby("pool", observed=True)["busy_s"].sum()
        assert list(busy) == [str(p) for p in by_frame.index]
        assert list(busy.values()) == [float(v) for v in by_frame]
        assert instances == frame.groupby("pool", observed=True)["instance"].nunique().to_dict()
    reqs = _requests(5)
    _same(summarize(reqs, frame), summarize(reqs, compact))
    cut = data.draw(st.floats(0.0, 1.0))
    _same(summarize(reqs, frame[frame["start_s"] >= cut]), summarize(reqs, compact.since(cut)))


# ----- whole runs ---------------------------------------------------------------------


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(disagg=st.booleans(), fault=st.sampled_from(["none", "instance"]),
       seqs=st.integers(2, 32), max_out=st.integers(50, 400), seed=st.integers(0, 10_000))
def test_a_compact_run_gives_monitoring_and_step_count_without_its_steps_frame(
        disagg: bool, fault: str, seqs: int, max_out: int, seed: int) -> None:
    sc = _scenario(disagg, False, False, fault, seqs, max_out, 4.0, seed)
    full = run(sc.with_(**{"simulation.record_steps": "all"}))
    compact = run(sc.with_(**{"simulation.record_steps": "stretches"}))
    # Monitoring and the step count first: they must not need the expanded frame.
    for per_instance in (False, True):
        pd.testing.assert_frame_equal(full.monitoring(0.5, per_instance=per_instance),
                                      compact.monitoring(0.5, per_instance=per_instance),
                                      check_exact=True)
    assert compact.step_records._frame is None
    assert compact.num_steps == full.num_steps == len(full.steps)
    pd.testing.assert_frame_equal(full.steps, compact.steps, check_exact=True)
    assert compact.step_records._frame is not None


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(concurrency=st.integers(2, 12), warmup=st.integers(1, 12), cv=st.sampled_from([0.0, 0.5]),
       out=st.integers(20, 300), seed=st.integers(0, 1000))
def test_warm_ups_left_out_of_a_compact_summary_as_of_the_full_one(
        concurrency: int, warmup: int, cv: float, out: int, seed: int) -> None:
    from tests.conftest import make_scenario

    sc = make_scenario(**{
        "seed": seed,
        "workload.arrival": {"kind": "closed_loop", "concurrency": concurrency,
                             "turnaround_s": 0.01, "turnaround_cv": cv,
                             "warmup_requests": warmup},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": out},
        "workload.num_requests": 30,
    })
    runs = {m: run(sc.with_(**{"simulation.record_steps": m})) for m in ("all", "stretches")}
    assert len(runs["stretches"].stretches)  # the cut goes through kept stretches
    _same(runs["all"].summary, runs["stretches"].summary)
