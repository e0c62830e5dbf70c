"""Unbounded work is refused before it starts, with the estimate and the setting to change.

Before, 10^7 requests grew for half an hour into an out-of-memory kill, `duration_s: 1e15`
and a 1e-9 s monitoring interval never ended, a 2.56 M-point sweep grid or a YAML alias
bomb expanded without limit, and a tiny MTBF scheduled failures without end.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.errors import EXIT_BAD_INPUT, ConfigError
from simulator.runner.budget import BYTES_PER_REQUEST, check_budget, estimate_run
from tests.conftest import make_scenario
from tests.test_exit_codes import SMALL, exit_code, scenario


def test_estimate_grows_with_the_request_count() -> None:
    small = estimate_run(make_scenario(**{"workload.num_requests": 1_000}), {"main": 1})
    large = estimate_run(make_scenario(**{"workload.num_requests": 1_000_000}), {"main": 1})
    assert large.parts["requests"][0] == 1_000_000 * BYTES_PER_REQUEST
    assert large.bytes > 900 * small.bytes


def test_refuses_what_does_not_fit_and_names_the_knob() -> None:
    est = estimate_run(make_scenario(**{"workload.num_requests": 10_000_000}), {"main": 1})
    check_budget(est, "s.yaml", free=100 * est.bytes)  # fits: no error
    with pytest.raises(ConfigError) as info:
        check_budget(est, "s.yaml", free=est.bytes / 2)
    assert info.value.key == "workload.num_requests"
    assert "GiB" in info.value.message
    assert "10,000,000 requests" in info.value.message


@pytest.mark.parametrize(("updates", "key"), [
    ({"workload.num_requests": 10**11, "workload.arrival.rate_per_s": 1000},
     "workload.num_requests"),
    ({"workload.num_requests": None, "workload.duration_s": 1e15}, "workload"),
    ({"workload.arrival.rate_per_s": 1e-300}, "workload"),
    ({"simulation": {"monitor_interval_s": 1e-9}, "workload.num_requests": 100_000},
     "simulation.monitor_interval_s"),
])
def test_cli_refuses_before_simulating(tmp_path: Path, updates: dict[str, Any], key: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.perf_counter()
    code, err = exit_code(["run", str(scenario(tmp_path, **updates))], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert f": {key}: " in err
    assert time.perf_counter() - t0 < 60  # refused up front, not after running


def test_timers_without_end_are_refused() -> None:
    sc = make_scenario(**{"workload.duration_s": 3600.0, "faults": [
        {"kind": "random_failures", "pool": "main", "mtbf_s": 1e-6, "mttr_s": 1.0}]})
    with pytest.raises(ConfigError) as info:
        check_budget(estimate_run(sc, {"main": 1}), None, free=float("inf"))
    assert info.value.key == "faults[0].mtbf_s"
    sc = make_scenario(**{"workload.duration_s": 3600.0, "cluster.pools.main.autoscale": {
        "max_instances": 2, "signal": "queue_length", "scale_out_above": 4,
        "scale_in_below": 1, "interval_s": 1e-6}})
    with pytest.raises(ConfigError) as info:
        check_budget(estimate_run(sc, {"main": 2}), None, free=float("inf"))
    assert info.value.key == "cluster.pools[0].autoscale.interval_s"


def test_huge_sweep_grid_is_refused_before_expanding(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    axis = list(range(1, 1601))
    spec = {"base": SMALL, "grid": {"workload.arrival.rate_per_s": axis,
                                    "workload.num_requests": axis}}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    t0 = time.perf_counter()
    code, err = exit_code(["sweep", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "2,560,000 runs" in err
    assert time.perf_counter() - t0 < 30


def test_yaml_alias_bomb_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["name: bomb", "base: x.yaml", "a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 10)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    code, err = exit_code(["sweep", str(path), "--out", str(tmp_path / "out")], capsys)
    assert code == EXIT_BAD_INPUT, err
    assert "aliases" in err
