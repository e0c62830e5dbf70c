"""Sweeps: a base scenario, axes and seeds, expanded into runs with stable ids, and run.

The sweep file and its expansion are :mod:`simulator.runner.sweep_grid`'s (its names are
importable from here too); this module runs the runs.

Results (``OUT/``): ``runs/<id>.json`` holds one finished run's row and is written by an
atomic rename, so it exists whole or not at all; a restarted sweep skips the runs whose
row is there (and retries failed ones). ``results.parquet`` (one row per run, in expansion
order) is rebuilt from those rows, again by atomic rename, when the sweep ends or stops;
``aggregate.parquet`` has one row per configuration with the mean and 95 % confidence
interval of every metric over the seeds. With ``frames: true`` each run's request, step
and transfer frames go to ``runs/<id>/``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from concurrent.futures import BrokenExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.errors import (
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    InterruptedRunError,
    SimulationError,
    SimulatorError,
)
from simulator.runner.executors import (
    check_executor,
    default_workers,
    make_executor,
    sigterm_interrupts,
)
from simulator.runner.goodput import GoodputSpec
from simulator.runner.store import (
    ResultStore,
    SweepLock,
    atomic_write,
    writable_folder,
    write_meta,
)
from simulator.runner.sweep_grid import (
    MAX_SWEEP_RUNS,
    RunTask,
    Sweep,
    SweepSpec,
    expand,
    load_sweep,
    stable_hash,
)
from simulator.scenario.schema import Scenario

__all__ = ["MAX_SWEEP_RUNS", "NOT_METRICS", "Progress", "RunTask", "Sweep", "SweepSpec",
           "aggregate", "execute_run", "expand", "load_sweep", "run_sweep", "stable_hash"]

Progress = Callable[[int, int, int], None]
"""``progress(done, failed, total)``: called once before the first run and after each."""


# ----- one run (in a worker) --------------------------------------------------------
def _scalar(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


def execute_run(task: RunTask) -> tuple[dict[str, Any], Any]:
    """Run one task; never raises for a failed run: the row carries the error instead.

    Returns ``(row, RunResult or None)``; the result travels back only when frames are
    to be saved.
    """
    from simulator.runner.goodput import search_goodput
    from simulator.runner.run import run

    t0 = time.perf_counter()
    row = task.head()
    result = None
    try:
        scenario = Scenario.model_validate(task.scenario)
        base_dir = Path(task.base_dir)
        if task.goodput is not None:
            found = search_goodput(scenario, GoodputSpec.model_validate(task.goodput),
                                   base_dir=base_dir, file=task.file)
            row.update(found.as_row())
            result = found.result
        else:
            result = run(scenario, base_dir=base_dir, file=task.file)
        row["wall_s"] = time.perf_counter() - t0
        if result is not None:
            row.update({k: _scalar(v) for k, v in result.summary.items()})
    except Exception as exc:
        row["status"] = "failed"
        row["error"] = str(exc) if isinstance(exc, SimulatorError) else (
            f"{type(exc).__name__}: {exc}")
        row["wall_s"] = time.perf_counter() - t0
    return row, (result if task.frames else None)


NOT_METRICS = frozenset({"run_id", "config_id", "index", "seed", "status", "error", "wall_s",
                         "scenario_json"})


def aggregate(table: pd.DataFrame, axes: list[str]) -> pd.DataFrame:
    """One row per configuration (seeds pooled): ``<metric>_mean``, ``<metric>_ci95``.

    Only successful runs count; ``n_seeds`` says how many. See :mod:`simulator.metrics.stats`
    for the interval.
    """
    from simulator.metrics.stats import aggregate_seeds

    if table.empty or "status" not in table:
        return pd.DataFrame()
    ok = table[table["status"] == "ok"]
    by = ["config_id", *[a for a in axes if a in ok]]
    metrics = [c for c in ok.columns if c not in NOT_METRICS and c not in by
               and pd.api.types.is_numeric_dtype(ok[c]) and not pd.api.types.is_bool_dtype(ok[c])]
    return aggregate_seeds(ok, by, metrics)


def run_sweep(sweep: Sweep | str | Path, out: str | Path, *, executor: str = "local",
              workers: int | None = None, scheduler: str | None = None,
              retry_failed: bool = True, progress: Progress | None = None) -> pd.DataFrame:
    """Run every task not already finished in ``out`` and return the full results table.

    One sweep at a time writes to ``out`` (:class:`SweepLock`). On Ctrl-C or SIGTERM the
    workers are stopped, the finished runs are kept and tabled, and :class:`InterruptedRunError`
    says how to resume.
    """
    if not isinstance(sweep, Sweep):
        sweep = load_sweep(sweep)
    check_executor(executor, workers, scheduler)
    writable_folder(Path(out))
    with SweepLock(Path(out)), sigterm_interrupts():
        return _run_locked(sweep, out, executor, workers, scheduler, retry_failed, progress)


def _run_locked(sweep: Sweep, out: str | Path, executor: str, workers: int | None,
                scheduler: str | None, retry_failed: bool, progress: Progress | None
                ) -> pd.DataFrame:
    store = ResultStore(out)
    write_meta(store, sweep)
    pending, done, failed = [], 0, 0
    for task in sweep.tasks:
        row = store.row(task.run_id)
        if row is None or (retry_failed and row.get("status") != "ok"):
            pending.append(task)
        else:
            done += 1
            failed += row.get("status") != "ok"
    total = len(sweep.tasks)
    if progress:
        progress(done, failed, total)
    try:
        if pending:
            n = min(workers or default_workers(), len(pending))
            pool = make_executor(executor, n, scheduler)
            try:
                for task, outcome in pool.map_unordered(execute_run, pending):
                    if isinstance(outcome, BrokenExecutor):
                        raise SimulationError(
                            f"the worker processes died ({outcome}) while running run "
                            f"{task.run_id}; finished runs are kept, rerun to resume. (Running "
                            "a sweep from a script? Put it under `if __name__ == '__main__':`.)")
                    if isinstance(outcome, BaseException):
                        row, result = task.head(), None
                        row.update(status="failed", wall_s=math.nan,
                                   error=f"worker error: {type(outcome).__name__}: {outcome}")
                    else:
                        row, result = outcome
                    store.save(row, result)
                    done += 1
                    failed += row["status"] != "ok"
                    if progress:
                        progress(done, failed, total)
            except KeyboardInterrupt as exc:
                pool.terminate()
                code = getattr(exc, "exit_code", EXIT_INTERRUPTED)
                raise InterruptedRunError(
                    f"{'terminated' if code == EXIT_TERMINATED else 'interrupted'}: {done} of "
                    f"{total} runs done and kept in {store.out}; rerun the same command to "
                    "resume", code) from None
            finally:
                pool.close()
    finally:
        table = store.table(sweep.tasks)
        store.write_table(table)
        by_config = aggregate(table, sweep.axes)
        atomic_write(store.out / "aggregate.parquet",
                      lambda p: by_config.to_parquet(p, index=False))
    return table
