"""`simulation.record_steps`: every summary metric identical under every setting.

``stretches`` keeps a fast-forward stretch as one compact row and expands the steps frame
from it when read: the expanded frame must equal the per-step frame of ``all`` bit for
bit (so monitoring, ITL and utilisation are those of ``all``), and ``none`` keeps no steps
frame but the same summary.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.cli import main
from simulator.engine.recorder import Recorder
from simulator.runner.run import LARGE_RUN_REQUESTS, record_steps_mode
from tests.conftest import make_scenario

MODES = ("all", "stretches", "none")


def _runs(sc: Any) -> dict[str, Any]:
    return {m: run(sc.with_(**{"simulation.record_steps": m})) for m in MODES}


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def assert_same_everywhere(runs: dict[str, Any]) -> None:
    full, compact, none = runs["all"], runs["stretches"], runs["none"]
    assert full.summary.keys() == compact.summary.keys() == none.summary.keys()
    for key, value in full.summary.items():
        assert _same_value(value, compact.summary[key]), (key, value, compact.summary[key])
        assert _same_value(value, none.summary[key]), (key, value, none.summary[key])
    pd.testing.assert_frame_equal(full.steps, compact.steps, check_exact=True)
    pd.testing.assert_frame_equal(full.monitoring(0.5), compact.monitoring(0.5),
                                  check_exact=True)
    pd.testing.assert_frame_equal(full.requests, none.requests, check_exact=True)
    assert none.steps.empty
    assert list(none.steps.columns) == list(full.steps.columns)


def _scenario(disagg: bool, chunked: bool, prefix: bool, fault: str, seqs: int,
              max_out: int, rate: float, seed: int) -> Any:
    sched = {"max_num_seqs": seqs, "max_num_batched_tokens": 4096, "chunked_prefill": chunked,
             "prefix_caching": prefix, "memory_utilization": 0.45}
    entry: dict[str, Any] = {"name": "main", "device": "L40S", "scheduler": sched}
    pools = [entry]
    if disagg:
        entry["role"] = "prefill"
        pools.append({"name": "d", "role": "decode", "device": "L40S", "instances": 2,
                      "scheduler": {**sched, "prefix_caching": False}})
    faults: list[dict[str, Any]] = []
    if fault == "instance":
        faults.append({"kind": "instance_failure", "target": "d/0" if disagg else "main/0",
                       "at_s": 1.5, "duration_s": 2.0})
    elif fault == "straggler":
        faults.append({"kind": "straggler", "target": "main/0", "at_s": 0.7,
                       "duration_s": 1.5, "slowdown": 3.0})
    updates: dict[str, Any] = {
        "seed": seed,
        "workload.arrival": {"kind": "poisson", "rate_per_s": rate},
        "workload.input_tokens": {"kind": "uniform", "min_tokens": 16, "max_tokens": 1500},
        "workload.output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": max_out},
        "workload.num_requests": 40,
        "cluster.pools": pools,
        "faults": faults,
    }
    if prefix:
        updates["workload.shared_prefix"] = {"tokens": 1200, "groups": 3, "fraction": 0.9}
        updates["workload.prefix_block_tokens"] = 256
    return make_scenario(**updates)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    disagg=st.booleans(),
    chunked=st.booleans(),
    prefix=st.booleans(),
    fault=st.sampled_from(["none", "instance", "straggler"]),
    seqs=st.integers(1, 48),
    max_out=st.integers(1, 400),
    rate=st.floats(0.5, 30.0),
    seed=st.integers(0, 10_000),
)
def test_every_setting_gives_the_same_summary_and_frames(disagg, chunked, prefix, fault, seqs,
                                                         max_out, rate, seed) -> None:
    assert_same_everywhere(_runs(_scenario(disagg, chunked, prefix, fault, seqs, max_out,
                                           rate, seed)))


def test_a_long_decode_run_is_kept_as_few_stretches() -> None:
    # Long outputs at a low rate: decode-only stretches of many steps.
    sc = make_scenario(**{"workload.output_tokens": {"kind": "fixed", "tokens": 400},
                          "workload.arrival.rate_per_s": 1.0, "workload.num_requests": 20})
    runs = _runs(sc)
    assert_same_everywhere(runs)
    stretches = runs["stretches"].stretches
    steps = runs["all"].steps
    assert 0 < len(stretches) < len(steps) / 5
    # The stretch rows agree with the steps they stand for.
    in_stretches = int(stretches["steps"].sum())
    decode_only = steps[(steps["prefill_seqs"] == 0)]
    assert in_stretches <= len(decode_only)
    first = stretches.iloc[0]
    rows = steps[(steps["instance"] == first["instance"])
                 & (steps["start_s"] >= first["start_s"])].head(int(first["steps"]))
    assert float(rows["start_s"].iloc[0]) == first["start_s"]
    assert float(rows["end_s"].iloc[-1]) == first["end_s"]
    assert int(rows["kv_used_blocks"].iloc[0]) == first["kv_used_start"]
    assert int(rows["kv_used_blocks"].iloc[-1]) == first["kv_used_end"]
    assert int(rows["decode_ctx_tokens"].iloc[0]) == first["decode_ctx_start"]
    assert np.isclose(rows["duration_s"].sum(), first["busy_s"], rtol=1e-12)
    # Under `all` nothing is kept as stretches.
    assert runs["all"].stretches.empty


def test_none_has_no_monitoring_and_saves_no_steps(tmp_path) -> None:
    res = run(make_scenario(**{"simulation.record_steps": "none"}))
    with pytest.raises(ValueError, match="record_steps: none"):
        res.monitoring()
    out = res.save(tmp_path / "run")
    assert (out / "requests.parquet").exists()
    assert not (out / "steps.parquet").exists()


def test_auto_keeps_stretches_for_large_runs_only() -> None:
    small = make_scenario(**{"workload.num_requests": LARGE_RUN_REQUESTS})
    large = make_scenario(**{"workload.num_requests": LARGE_RUN_REQUESTS + 1})
    day = make_scenario(**{"workload.num_requests": None, "workload.duration_s": 86_400.0,
                           "workload.arrival.rate_per_s": 5.0})
    assert record_steps_mode(small) == "all"
    assert record_steps_mode(large) == "stretches"
    assert record_steps_mode(day) == "stretches"
    assert record_steps_mode(large.with_(**{"simulation.record_steps": "all"})) == "all"


def test_bad_record_steps_is_a_one_line_error(tmp_path, capsys) -> None:
    sc = make_scenario().model_dump(mode="json")
    sc["simulation"]["record_steps"] = "every"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(sc))
    with pytest.raises(SystemExit) as exc:
        main(["run", str(path)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err
    assert str(path) in err
    assert "simulation.record_steps" in err
    assert "stretches" in err


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 4), st.sampled_from(["stored", "wide", "list"]),
       st.data())
def test_bulk_rows_equal_the_rows_recorded_step_by_step(n, stride, kind, data) -> None:
    """A jump's rows appended at once (priced columns as numpy arrays of the stored types
    appended by their bytes, strided views of a window, other numpy types or lists value
    by value) equal the same steps recorded one by one, bit for bit, under ``all``."""
    floats = st.floats(allow_nan=True, allow_infinity=True, width=64)
    seconds = np.array(data.draw(st.lists(floats, min_size=n * stride, max_size=n * stride)))
    small = np.array(data.draw(st.lists(st.floats(-1e6, 1e6, width=32),
                                        min_size=n * stride, max_size=n * stride)))
    bounds = np.array(data.draw(st.lists(st.integers(0, 3), min_size=n * stride,
                                         max_size=n * stride)))
    starts = data.draw(st.lists(floats, min_size=n, max_size=n))
    used = data.draw(st.lists(st.integers(0, 10**6), min_size=n, max_size=n))
    queue = data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    running = data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    sec, bnd = seconds[::stride], bounds[::stride]
    comp, mem = small[::stride], small[::-stride][:n]
    if kind == "stored":  # the kept windows' types: float64, int8, float32
        cols = (sec, bnd.astype(np.int8), comp.astype(np.float32), mem.astype(np.float32))
    elif kind == "wide":  # a direct pricing call's types
        cols = (sec, bnd, comp, mem)
    else:
        cols = (sec.tolist(), bnd.tolist(), comp.tolist(), mem.tolist())
    bulk, one = Recorder("all"), Recorder("all")
    bulk.steps_bulk(3, starts, cols[0], 7, range(100, 100 + 7 * n, 7), used, 999, queue,
                    running, cols[1], cols[2], cols[3])
    names = ("compute", "memory", "communication", "overhead")
    for j in range(n):
        one.step(3, starts[j], float(sec[j]), float(sec[j]), 0, 0, 7, 100 + 7 * j, used[j], 999,
                 queue[j], running[j], names[int(bnd[j])], float(comp[j]), float(mem[j]))
    for name, col in one.steps.items():
        assert bulk.steps[name].tobytes() == col.tobytes(), name


@pytest.mark.parametrize("ctx", [range(100, 124, 6), [100, 106, 112, 118],
                                 range(100, 116, 4), [100, 106, 113, 118]])
def test_a_stretch_row_needs_its_steps_context_to_grow_by_the_batch(ctx) -> None:
    """A stretch row keeps only its first context sum: its steps' sums must grow by one
    token per sequence per step, given as a range or as a list; anything else is refused."""
    rec = Recorder("stretches")
    args = (0, [0.0, 1.0, 2.0, 3.0], np.ones(4), 6, ctx, [10, 11, 12, 13], 99, [0] * 4, [6] * 4,
            np.zeros(4, dtype=np.int8), np.ones(4, dtype=np.float32),
            np.ones(4, dtype=np.float32))
    uniform = all(c == 100 + 6 * j for j, c in enumerate(ctx))
    if uniform:
        rec.steps_bulk(*args)
        assert list(rec.stretches["decode_ctx_start"]) == [100]
        assert list(rec.stretches["steps"]) == [4]
    else:
        with pytest.raises(ValueError, match="context growth"):
            rec.steps_bulk(*args)
