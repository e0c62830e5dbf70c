"""Sweeps: expansion and stable ids, bad files, resumable crash-safe results, executors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from simulator.cli import app, main
from simulator.errors import ConfigError
from simulator.runner.sweep import (
    ResultStore,
    aggregate,
    expand,
    load_sweep,
    run_sweep,
    stable_hash,
)
from simulator.scenario.schema import Scenario
from tests.conftest import REPO

BASE: dict[str, Any] = {
    "name": "sweep-base",
    "seed": 1,
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "poisson", "rate_per_s": 5.0},
        "input_tokens": {"kind": "uniform", "min_tokens": 50, "max_tokens": 400},
        "output_tokens": {"kind": "uniform", "min_tokens": 1, "max_tokens": 60},
        "num_requests": 40,
    },
    "cluster": {"pools": [
        {"name": "prefill", "role": "prefill", "device": "H100-SXM"},
        {"name": "decode", "role": "decode", "device": "H100-SXM"},
    ]},
    "slo": {"ttft_s": 0.5, "tpot_s": 0.05},
}


def write_sweep(tmp_path: Path, name: str = "sweep.yaml", **fields: Any) -> Path:
    data: dict[str, Any] = {"name": "t", "base": BASE, **fields}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    """Everything but the wall-clock column, which is the one thing allowed to differ."""
    return table.drop(columns=["wall_s"]).reset_index(drop=True)


# ----- expansion ------------------------------------------------------------------------
def test_grid_zip_and_seeds_expand_in_order(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(
        tmp_path,
        grid={"workload.arrival.rate_per_s": [2, 4, 8]},
        zip=[{"cluster.pools.prefill.instances": [1, 2],
              "cluster.pools.decode.parallelism.tp": [1, 2]}],
        seeds=[0, 5]))
    assert len(sweep.tasks) == 3 * 2 * 2
    assert sweep.axes == ["workload.arrival.rate_per_s", "cluster.pools.prefill.instances",
                          "cluster.pools.decode.parallelism.tp"]
    first, second, third = sweep.tasks[:3]
    assert first.point == {"workload.arrival.rate_per_s": 2, "cluster.pools.prefill.instances": 1,
                           "cluster.pools.decode.parallelism.tp": 1}
    assert (first.seed, second.seed) == (0, 5)
    assert first.config_id == second.config_id != third.config_id
    assert third.point["cluster.pools.prefill.instances"] == 2
    assert third.point["cluster.pools.decode.parallelism.tp"] == 2  # zipped together
    sc = Scenario.model_validate(third.scenario)
    assert sc.cluster.pools[0].instances == 2
    assert sc.cluster.pools[1].parallelism.tp == 2
    assert sc.seed == 0
    assert [t.index for t in sweep.tasks] == list(range(12))


def test_run_ids_are_hashes_of_the_resolved_scenario(tmp_path: Path) -> None:
    a = load_sweep(write_sweep(tmp_path, "a.yaml", grid={"workload.arrival.rate_per_s": [2, 4]}))
    b = load_sweep(write_sweep(tmp_path, "b.yaml", grid={"workload.arrival.rate_per_s": [4, 8]},
                               overrides={"name": "sweep-base"}))
    for task in a.tasks:
        assert task.run_id == stable_hash(task.scenario)
    # The same run in two different sweeps has the same id; a different one does not.
    assert a.tasks[1].run_id == b.tasks[0].run_id
    assert a.tasks[0].run_id not in {t.run_id for t in b.tasks}
    assert len({t.run_id for t in a.tasks}) == len(a.tasks)


def test_overrides_apply_to_every_run(tmp_path: Path) -> None:
    sweep = load_sweep(write_sweep(tmp_path, overrides={"workload.num_requests": 7},
                                   grid={"cluster.pools.decode.instances": [1, 2]}))
    assert all(t.scenario["workload"]["num_requests"] == 7 for t in sweep.tasks)
    assert sweep.tasks[0].seed == 1  # the base scenario's seed when `seeds` is absent


def test_base_scenario_path_relative_to_the_sweep_file(tmp_path: Path) -> None:
    (tmp_path / "scen").mkdir()
    (tmp_path / "scen" / "base.yaml").write_text(yaml.safe_dump(BASE))
    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / "s.yaml"
    path.write_text(yaml.safe_dump({"base": "../scen/base.yaml",
                                    "grid": {"workload.num_requests": [3]}}))
    sweep = load_sweep(path)
    assert sweep.base_dir == (tmp_path / "scen").resolve()
    assert sweep.tasks[0].scenario["workload"]["num_requests"] == 3


@pytest.mark.parametrize(("fields", "key", "message"), [
    ({"grid": {"workload.arival.rate_per_s": [1, 2]}}, "grid.workload.arival.rate_per_s",
     "unknown path 'workload.arival.rate_per_s': workload has no key 'arival'; "
     "keys there: arrival"),
    ({"grid": {"cluster.pools.prefil.instances": [1]}}, "grid.cluster.pools.prefil.instances",
     "no item named 'prefil'; names: ['prefill', 'decode']"),
    ({"grid": {"workload.arrival.rate_per_s.x": [1]}}, "grid.workload.arrival.rate_per_s.x",
     "is a value, not a section"),
    ({"grid": {"workload.arrival.rate_per_s": []}}, "grid.workload.arrival.rate_per_s",
     "empty axis"),
    ({"grid": {"workload.arrival.rate_per_s": 3}}, "grid.workload.arrival.rate_per_s",
     "an axis is a list of values, got int"),
    ({"zip": [{"cluster.pools.prefill.instances": [1, 2, 3],
               "cluster.pools.decode.instances": [1, 2]}]}, "zip[0]",
     "same length; got cluster.pools.prefill.instances: 3, cluster.pools.decode.instances: 2"),
    ({"zip": [{}]}, "zip[0]", "empty zip group"),
    ({"grid": {"seed": [1, 2]}}, "grid.seed", "seeds:"),
])
def test_bad_sweep_files_name_file_key_and_problem(tmp_path: Path, fields: dict[str, Any],
                                                   key: str, message: str) -> None:
    path = write_sweep(tmp_path, **fields)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.file == str(path)
    assert err.value.key == key
    assert message in err.value.message


@pytest.mark.parametrize(("fields", "message"), [
    ({"grid": {"cluster.pools.decode.parallelism.tp": [0]}}, "point 0"),
    ({"grid": {"workload.num_requests": [1, 1]}}, "resolve to the same run"),
    ({"grid": {"workload.num_requests": [1]}, "overrides": {"workload.num_requests": 3}},
     "one place only"),
    ({"grdi": {}}, "unknown key"),
    ({"base": "missing.yaml"}, "not found"),
    ({"seeds": []}, "at least 1"),
])
def test_more_bad_sweep_files(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    path = write_sweep(tmp_path, **fields)
    with pytest.raises(ConfigError, match=message) as err:
        load_sweep(path)
    assert err.value.file == str(path)


def test_cli_reports_a_bad_sweep_in_one_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = write_sweep(tmp_path, grid={"workload.arrival.rate_per_s": []})
    with pytest.raises(SystemExit) as exc:
        main(["sweep", str(path), "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {path}: grid.workload.arrival.rate_per_s: empty axis: give at "
                   "least one value")


def test_shipped_sweeps_expand() -> None:
    pd_ratio = load_sweep(REPO / "scenarios/sweeps/pd_ratio_llama70b.yaml")
    tp_size = load_sweep(REPO / "scenarios/sweeps/tp_size_llama70b.yaml")
    assert len(pd_ratio.tasks) == 4 * 4 * 3 * 2
    assert len(tp_size.tasks) == 11 * 3 * 3
    assert {Scenario.model_validate(t.scenario).cluster.pools[0].parallelism.tp
            for t in tp_size.tasks} == {2, 4, 8}


# ----- running and resuming ---------------------------------------------------------------
def test_run_sweep_rows_failures_and_resume(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, grid={"cluster.pools.decode.device": ["H100-SXM", "NoSuchGPU"],
                                       "workload.arrival.rate_per_s": [2, 4]})
    calls: list[tuple[int, int, int]] = []
    table = run_sweep(path, tmp_path / "out", workers=1, progress=lambda *a: calls.append(a))
    assert len(table) == 4
    assert calls[0] == (0, 0, 4)
    assert calls[-1] == (4, 2, 4)
    ok = table[table["status"] == "ok"]
    bad = table[table["status"] == "failed"]
    assert list(ok["cluster.pools.decode.device"]) == ["H100-SXM"] * 2
    assert len(bad) == 2
    assert all("unknown device profile 'NoSuchGPU'" in e for e in bad["error"])
    assert (ok["completed"] == 40).all()
    assert list(table["index"]) == [0, 1, 2, 3]
    saved = pd.read_parquet(tmp_path / "out" / "results.parquet")
    pd.testing.assert_frame_equal(saved, table)
    meta = json.loads((tmp_path / "out" / "sweep.json").read_text())
    assert meta["axes"] == ["cluster.pools.decode.device", "workload.arrival.rate_per_s"]

    # Second start: finished runs are skipped, failed ones retried (and fail again).
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out" / "runs").glob("*.json")}
    calls.clear()
    again = run_sweep(path, tmp_path / "out", workers=1, progress=lambda *a: calls.append(a))
    assert calls[0] == (2, 0, 4)
    after = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "out" / "runs").glob("*.json")}
    for run_id in ok["run_id"]:
        assert after[f"{run_id}.json"] == stamps[f"{run_id}.json"]
    pd.testing.assert_frame_equal(comparable(again), comparable(table))
    calls.clear()
    run_sweep(path, tmp_path / "out", workers=1, retry_failed=False,
              progress=lambda *a: calls.append(a))
    assert calls == [(4, 2, 4)]


def test_stale_temporary_files_are_ignored_and_removed(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    (store.runs / ".tmp-99-abc.json").write_text('{"run_id": "abc", "sta')  # torn write
    (store.runs / ".tmp-99-abc").mkdir()
    ResultStore(tmp_path)
    assert not list(store.runs.glob(".tmp-*"))


def test_a_row_being_written_is_not_listed_as_a_saved_row(tmp_path: Path) -> None:
    """A reader listing ``runs/*.json`` (pathlib and pandas match hidden names) while a row is
    being written, or after a SIGKILL left its temporary file, sees only whole rows."""
    store = ResultStore(tmp_path)
    seen: list[list[str]] = []
    real_replace = os.replace

    def listing_then_replace(src: object, dst: object) -> None:
        seen.append(sorted(p.name for p in store.runs.glob("*.json")))
        real_replace(src, dst)  # type: ignore[arg-type]

    with mock.patch("simulator.runner.store.os.replace", listing_then_replace):
        store.save({"run_id": "abc", "status": "ok"})
    assert seen == [[]]  # the temporary file exists here and is not a ``*.json``
    assert [p.name for p in store.runs.glob("*.json")] == ["abc.json"]


def test_frames_and_seed_aggregates(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, grid={"cluster.pools.decode.instances": [1, 2]},
                       seeds=[0, 1, 2], frames=True)
    table = run_sweep(path, tmp_path / "out", workers=1)
    run_id = table["run_id"].iloc[0]
    requests = pd.read_parquet(tmp_path / "out" / "runs" / run_id / "requests.parquet")
    assert len(requests) == 40
    by = aggregate(table, ["cluster.pools.decode.instances"])
    assert list(by["n_seeds"]) == [3, 3]
    first = table[table["cluster.pools.decode.instances"] == 1]
    assert by["ttft_p90_s_mean"].iloc[0] == pytest.approx(first["ttft_p90_s"].mean())
    assert by["ttft_p90_s_ci95"].iloc[0] > 0
    saved = pd.read_parquet(tmp_path / "out" / "aggregate.parquet")
    pd.testing.assert_frame_equal(saved, by)


def test_goodput_sweep_rows(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, grid={"cluster.pools.decode.instances": [1]},
                       goodput={"target": 0.9, "max_probes": 6, "rel_tol": 0.2})
    table = run_sweep(path, tmp_path / "out", workers=1)
    row = table.iloc[0]
    assert row["status"] == "ok"
    assert row["goodput_rate_per_s"] > 0
    assert row["goodput_rate_per_device"] == pytest.approx(row["goodput_rate_per_s"] / 2)
    assert row["slo_attainment"] >= 0.9
    plain = load_sweep(write_sweep(tmp_path, "p.yaml",
                                   grid={"cluster.pools.decode.instances": [1]}))
    assert plain.tasks[0].run_id != table["run_id"].iloc[0]  # the task is part of the id


KILL_SWEEP = {"grid": {"workload.arrival.rate_per_s": [2, 4, 6, 8, 10],
                       "cluster.pools.decode.instances": [1, 2]},
              "overrides": {"workload.num_requests": 250},
              "seeds": [0, 1]}


def test_killed_sweep_resumes_to_the_uninterrupted_table(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, **KILL_SWEEP)
    total = len(load_sweep(path).tasks)
    killed = tmp_path / "killed"
    code = ("import sys\nfrom simulator.runner.sweep import run_sweep\n"
            "if __name__ == '__main__':\n"
            f"    run_sweep({str(path)!r}, {str(killed)!r}, workers=2)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline:
            rows = list((killed / "runs").glob("*.json")) if (killed / "runs").is_dir() else []
            if len(rows) >= 4 or proc.poll() is not None:
                break
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its worker processes
        proc.wait(timeout=30)
    done_at_kill = len(list((killed / "runs").glob("*.json")))
    assert 0 < done_at_kill < total, "the sweep must be interrupted midway"
    assert not (killed / "results.parquet").exists()

    t0 = time.perf_counter()
    resumed = run_sweep(path, killed, workers=2)
    t1 = time.perf_counter()
    straight = run_sweep(path, tmp_path / "straight", workers=1)  # in-process, uninterrupted
    print(f"kill at {done_at_kill}/{total}; resume {t1 - t0:.1f} s, "
          f"straight {time.perf_counter() - t1:.1f} s")
    assert len(resumed) == total
    assert resumed["run_id"].is_unique
    assert (resumed["status"] == "ok").all()
    pd.testing.assert_frame_equal(comparable(resumed), comparable(straight))


def test_dask_executor_matches_local(tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    path = write_sweep(tmp_path, grid={"workload.arrival.rate_per_s": [2, 6],
                                       "cluster.pools.decode.instances": [1, 2]},
                       seeds=[0, 1])
    local = run_sweep(path, tmp_path / "local", workers=1)
    with distributed.LocalCluster(n_workers=2, processes=False, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        remote = run_sweep(path, tmp_path / "dask", executor="dask",
                           scheduler=cluster.scheduler_address)
    assert (remote["status"] == "ok").all()
    pd.testing.assert_frame_equal(comparable(remote), comparable(local))


def test_cli_sweep_prints_the_table_and_writes_results(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, grid={"cluster.pools.decode.instances": [1, 2]}, seeds=[0, 1])
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["sweep", str(path), "--out", str(out), "--workers", "1",
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "4 runs (2 points x 2 seeds)" in res.output
    assert "±" in res.output  # mean ± CI with two seeds
    assert len(pd.read_parquet(out / "results.parquet")) == 4


def test_executor_arguments_are_checked(tmp_path: Path) -> None:
    path = write_sweep(tmp_path, grid={"cluster.pools.decode.instances": [1, 2]})
    with pytest.raises(ConfigError, match="unknown executor"):
        run_sweep(path, tmp_path / "o", executor="slurm")
    with pytest.raises(ConfigError, match="--executor dask"):
        run_sweep(path, tmp_path / "o", scheduler="tcp://127.0.0.1:1")


@pytest.mark.slow
def test_shipped_100_run_sweep_runs_every_point(tmp_path: Path) -> None:
    """The shipped ~100-run study completes (its speed is measured in benchmarks/, (d))."""
    sweep = load_sweep(REPO / "scenarios/sweeps/tp_size_llama70b.yaml")
    table = run_sweep(sweep, tmp_path / "tp", workers=2)
    assert len(table) == 99
    assert (table["status"] == "ok").all()


def test_expand_from_code_without_a_file() -> None:
    from simulator.runner.sweep import SweepSpec

    sweep = expand(SweepSpec(base=BASE, grid={"cluster.pools.decode.instances": [1, 3]}))
    assert [t.point["cluster.pools.decode.instances"] for t in sweep.tasks] == [1, 3]
    assert sweep.tasks[0].file is None
