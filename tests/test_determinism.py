"""Same scenario and seed, same frames: in one process, and in a fresh one.

A run's fingerprint hashes every frame (requests, steps, transfers, events: values, column
names and dtypes) and the summary. Two runs in one process must match, a fresh Python
process with a different string-hash seed must match too (so nothing depends on set
order, object ids or state left behind by an earlier run), and a different seed must not.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from simulator.runner import RunResult, run
from tests.conftest import REPO

# A disaggregated cluster with every random stream in use: Gamma arrivals, lognormal and
# empirical lengths, shared prefixes, random routing, random failures.
SCENARIO: dict[str, Any] = {
    "name": "determinism",
    "seed": 11,
    "model": "Llama-3.1-8B",
    "workload": {
        "arrival": {"kind": "gamma", "rate_per_s": 30.0, "cv": 2.0},
        "input_tokens": {"kind": "lognormal", "mean_tokens": 600, "cv": 1.0,
                         "max_tokens": 4000},
        "output_tokens": {"kind": "empirical", "values": [1, 20, 80], "weights": [1, 3, 1]},
        "shared_prefix": {"tokens": 64, "groups": 3, "fraction": 0.5},
        "num_requests": 150,
    },
    "cluster": {
        "pools": [
            {"name": "prefill", "role": "prefill", "device": "H100-SXM", "instances": 2},
            {"name": "decode", "role": "decode", "device": "H100-SXM", "instances": 2,
             "parallelism": {"tp": 2}},
        ],
        "router": {"policy": "random", "decode_policy": "power_of_two"},
        "kv_transfer": {"mode": "layerwise"},
    },
    "faults": [{"kind": "random_failures", "pool": "decode", "mtbf_s": 1.0, "mttr_s": 0.3}],
    "simulation": {"max_time_s": 120.0},
}


def fingerprint(result: RunResult) -> str:
    digest = hashlib.sha256()
    for name in ("requests", "steps", "transfers", "events"):
        frame: pd.DataFrame = getattr(result, name)
        digest.update(name.encode())
        digest.update(json.dumps([[str(c), str(t)] for c, t in frame.dtypes.items()]).encode())
        digest.update(pd.util.hash_pandas_object(frame, index=True).to_numpy().tobytes())
    digest.update(json.dumps(result.summary, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def fingerprint_file(path: str, seed: int | None = None) -> str:
    """What the fresh process runs."""
    return fingerprint(run(path, seed=seed))


@pytest.fixture
def scenario_file(tmp_path: Path) -> Path:
    path = tmp_path / "determinism.yaml"
    path.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    return path


def test_the_scenario_exercises_the_random_streams(scenario_file: Path) -> None:
    res = run(scenario_file)
    assert len(res.transfers) > 0
    assert res.requests["prefix_tokens"].gt(0).any()
    assert res.requests["restarts"].gt(0).any()  # the random failures hit something
    assert res.requests["prefill_instance"].nunique() == 2


def test_same_seed_same_frames_in_one_process(scenario_file: Path) -> None:
    first = fingerprint_file(str(scenario_file))
    assert fingerprint_file(str(scenario_file)) == first
    assert fingerprint_file(str(scenario_file), seed=12) != first


def test_same_seed_same_frames_in_a_fresh_process(scenario_file: Path) -> None:
    here = fingerprint_file(str(scenario_file))
    code = ("import sys; from tests.test_determinism import fingerprint_file; "
            "print(fingerprint_file(sys.argv[1]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code, str(scenario_file)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == here


def test_shipped_trace_scenario_is_repeatable() -> None:
    path = REPO / "scenarios/quickstart.yaml"
    a = run(path).summary
    b = run(path).summary
    assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True,
                                                                   default=str)


def _sweep_frames(tmp_path: Path, name: str, **how: Any) -> dict[int, pd.DataFrame]:
    """Run the determinism scenario at two seeds as a sweep; its saved requests frames."""
    from simulator.runner.sweep import run_sweep

    sweep = {"name": "determinism-sweep", "base": SCENARIO, "seeds": [11, 12],
             "frames": True}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep))
    out = tmp_path / name
    table = run_sweep(path, out, **how)
    assert (table["status"] == "ok").all(), table["error"].tolist()
    return {int(row["seed"]): pd.read_parquet(out / "runs" / row["run_id"] / "requests.parquet")
            for _, row in table.iterrows()}


def test_local_pool_and_dask_give_the_direct_run_frames(tmp_path: Path) -> None:
    """A sweep run through the process pool or Dask gives the frames of a direct run."""
    distributed = pytest.importorskip("distributed")
    from simulator.scenario.schema import Scenario

    direct = {seed: run(Scenario.model_validate({**SCENARIO, "seed": seed})).requests
              for seed in (11, 12)}
    pooled = _sweep_frames(tmp_path, "pool", workers=2)
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None) as cluster:
        dasked = _sweep_frames(tmp_path, "dask", executor="dask",
                               scheduler=cluster.scheduler_address)
    for seed, frame in direct.items():
        expected = frame.reset_index(drop=True)
        pd.testing.assert_frame_equal(pooled[seed].reset_index(drop=True), expected,
                                      check_dtype=False, check_categorical=False,
                                      check_exact=True)
        pd.testing.assert_frame_equal(dasked[seed].reset_index(drop=True), expected,
                                      check_dtype=False, check_categorical=False,
                                      check_exact=True)
    assert not direct[11]["arrival_s"].equals(direct[12]["arrival_s"])
