"""A running sweep under SIGINT, SIGTERM and SIGKILL, and two sweeps on one folder.

Each test runs the real command in a child process with two worker processes, signals it
once at least one run is saved, and checks: the exit code, the message saying how to
resume, that every saved run is whole and appears once, that no process it started is
left running, and that rerunning the command finishes the rest without repeating a run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simulator.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED
from tests.conftest import REPO

# Enough runs, each long enough, that the sweep cannot finish between the first saved run
# and the signal even on a loaded machine (with 6 runs of 2,500 requests, about 0.4 s each,
# the last four could end before the signal arrived, and the sweep exited 0).
RUNS = 12
# Ctrl-C raises KeyboardInterrupt in the child, as in a command a shell runs in the
# foreground. A child inherits an ignored SIGINT (as a shell's background jobs do) and Python
# then leaves it ignored: started from a test process in which something had set SIGINT to be
# ignored, the sweep ran to the end and exited 0 under the signal.
CODE = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from simulator.cli import main; main(sys.argv[1:])")


def sweep_file(tmp_path: Path, requests: int = 5000) -> Path:
    base = {"model": "Llama-3.1-8B",
            "workload": {"arrival": {"kind": "poisson", "rate_per_s": 40},
                         "input_tokens": {"kind": "fixed", "tokens": 64},
                         "output_tokens": {"kind": "fixed", "tokens": 64},
                         "num_requests": requests},
            "cluster": {"pools": [{"name": "main", "device": "H100-SXM"}]}}
    spec = {"name": "signals", "base": base,
            "grid": {"workload.arrival.rate_per_s": [10 + i for i in range(RUNS)]}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def start(path: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CODE, "sweep", str(path), "--out", str(out), "--workers", "2",
         "--no-progress"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def saved(out: Path) -> list[Path]:
    runs = out / "runs"
    return sorted(runs.glob("*.json")) if runs.is_dir() else []


def children(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for_first_run(proc: subprocess.Popen[str], out: Path, timeout: float = 240) -> set[int]:
    """Wait until a run is saved; return the sweep's child processes at that moment."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.communicate()
        kids = children(proc.pid)
        if saved(out) and kids:
            return kids
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("no run finished in time")


def check_nothing_left(kids: set[int], within_s: float = 15) -> None:
    end = time.monotonic() + within_s
    while time.monotonic() < end and any(alive(k) for k in kids):
        time.sleep(0.1)
    assert not [k for k in kids if alive(k)], "processes outlived the sweep"


def check_rows(out: Path) -> set[str]:
    rows = [json.loads(p.read_text()) for p in saved(out)]
    ids = [r["run_id"] for r in rows]
    assert len(ids) == len(set(ids))
    assert all(r["status"] == "ok" for r in rows)
    return set(ids)


def resume_and_check(path: Path, out: Path, before: set[str]) -> None:
    again = subprocess.run([sys.executable, "-c", CODE, "sweep", str(path), "--out", str(out),
                            "--workers", "2", "--no-progress"], cwd=REPO, capture_output=True,
                           text=True, timeout=600, check=False)
    assert again.returncode == EXIT_OK, again.stderr
    table = pd.read_parquet(out / "results.parquet")
    assert len(table) == RUNS
    assert table["run_id"].is_unique
    assert before <= set(table["run_id"])
    assert not list((out / "runs").glob(".tmp-*"))


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, EXIT_INTERRUPTED),
                                           (signal.SIGTERM, EXIT_TERMINATED)])
def test_interrupt_keeps_done_runs_and_says_how_to_resume(
        tmp_path: Path, sig: signal.Signals, code: int) -> None:
    path, out = sweep_file(tmp_path), tmp_path / "out"
    proc = start(path, out)
    kids = wait_for_first_run(proc, out)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "rerun the same command to resume" in err
    assert "Traceback" not in err
    done = check_rows(out)
    table = pd.read_parquet(out / "results.parquet")  # what was done is tabled
    assert set(table["run_id"]) == done
    check_nothing_left(kids)
    resume_and_check(path, out, done)


def test_sigkill_of_the_parent_leaves_no_workers(tmp_path: Path) -> None:
    path, out = sweep_file(tmp_path), tmp_path / "out"
    proc = start(path, out)
    kids = wait_for_first_run(proc, out)
    proc.kill()
    proc.communicate(timeout=60)
    check_nothing_left(kids, within_s=5)  # the kernel ends them (PR_SET_PDEATHSIG)
    resume_and_check(path, out, check_rows(out))


def test_a_second_sweep_on_the_same_folder_is_refused(tmp_path: Path) -> None:
    path, out = sweep_file(tmp_path), tmp_path / "out"
    first = start(path, out)
    kids = wait_for_first_run(first, out)
    second = subprocess.run([sys.executable, "-c", CODE, "sweep", str(path), "--out", str(out),
                             "--workers", "1", "--no-progress"], cwd=REPO, capture_output=True,
                            text=True, timeout=120, check=False)
    assert second.returncode == EXIT_BAD_INPUT, second.stderr
    assert "another sweep" in second.stderr
    assert f"pid {first.pid}" in second.stderr
    assert len(second.stderr.splitlines()) == 1
    os.kill(first.pid, signal.SIGINT)
    first.communicate(timeout=60)
    check_nothing_left(kids)
    check_rows(out)
