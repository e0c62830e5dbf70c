"""A sweep's results folder: one JSON row per finished run, rebuilt into tables.

Every file is written by an atomic rename, so it exists whole or not at all, and one sweep
at a time writes to a folder (:class:`SweepLock`).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from simulator.errors import ConfigError

if TYPE_CHECKING:
    from simulator.runner.sweep import RunTask, Sweep


def temp_name(path: Path) -> Path:
    """Where ``path`` is written before its rename: a hidden ``.tmp-`` name in the same
    folder that keeps none of the final suffix, so a reader listing ``runs/*.json`` (pathlib
    and pandas match hidden names) never sees a half-written row, even one a killed sweep
    left behind."""
    return path.with_name(f".tmp-{os.getpid()}-{path.name}.part")


def atomic_write(path: Path, write: Callable[[Path], object]) -> None:
    tmp = temp_name(path)
    write(tmp)
    os.replace(tmp, path)


def writable_folder(path: Path, key: str = "--out") -> None:
    """Make the results folder (and its parents) or fail with one line naming it."""
    if path.exists() and not path.is_dir():
        raise ConfigError("is a file; give a folder (created if missing)", file=str(path),
                          key=key)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot write here ({exc.strerror or exc}); choose a writable "
                          "folder", file=str(path), key=key) from None


class ResultStore:
    """``OUT/runs/<id>.json`` per finished run; ``OUT/results.parquet`` rebuilt from them."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        self.runs = self.out / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        for stale in self.runs.glob(".tmp-*"):  # left by a killed sweep
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()

    def row(self, run_id: str) -> dict[str, Any] | None:
        path = self.runs / f"{run_id}.json"
        if not path.is_file():
            return None
        return json.loads(path.read_text())

    def save(self, row: dict[str, Any], result: Any = None) -> None:
        run_id = row["run_id"]
        if result is not None:
            final = self.runs / run_id
            tmp = temp_name(final)
            result.save(tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        text = json.dumps(row, allow_nan=True)
        atomic_write(self.runs / f"{run_id}.json", lambda p: p.write_text(text))

    def table(self, tasks: list[RunTask]) -> pd.DataFrame:
        rows = []
        for task in tasks:
            row = self.row(task.run_id)
            if row is not None:
                row["scenario_json"] = json.dumps(task.scenario, sort_keys=True)
                rows.append(row)
        return pd.DataFrame(rows)

    def write_table(self, frame: pd.DataFrame) -> Path:
        path = self.out / "results.parquet"
        atomic_write(path, lambda p: frame.to_parquet(p, index=False))
        return path


def write_meta(store: ResultStore, sweep: Sweep) -> None:
    meta = {"name": sweep.spec.name, "description": sweep.spec.description,
            "axes": sweep.axes, "seeds": sorted({t.seed for t in sweep.tasks}),
            "runs": len(sweep.tasks), "file": sweep.file, "base_dir": str(sweep.base_dir),
            "goodput": sweep.spec.goodput is not None}
    text = json.dumps(meta, indent=2) + "\n"
    atomic_write(store.out / "sweep.json", lambda p: p.write_text(text))


class SweepLock:
    """An exclusive lock on ``OUT/.lock`` for as long as a sweep writes there.

    ``flock`` locks belong to the open file, so the kernel drops them when the holder
    exits in any way (SIGKILL included): a lock is never left stale. Without ``fcntl``
    (Windows) there is no lock.
    """

    def __init__(self, out: Path) -> None:
        self.path = out / ".lock"
        self._fh: Any = None

    def __enter__(self) -> SweepLock:
        try:
            import fcntl
        except ImportError:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise ConfigError(f"another sweep ({holder}) is writing to this folder; wait for "
                              "it to end (then rerun to resume) or give another --out",
                              file=str(self.path.parent), key="--out") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._fh is not None:
            self._fh.close()  # releases the lock
            self._fh = None


