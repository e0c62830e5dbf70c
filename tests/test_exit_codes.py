"""CLI exit codes: 0 success, 2 bad input, 1 the simulation failed, 130 interrupted.

The codes live in ``simulator.errors`` and are documented in docs/RELIABILITY.md (checked
here against each other). Bad input prints one line naming the file and key; a failure of
the simulation itself prints one line too, never a traceback unless DISAGG_SIM_DEBUG is set.

The last section holds regression tests for bad inputs the fuzzing found escaping as a
crash, a hang, a silent success or a line that did not name the scenario.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.cli import main
from simulator.errors import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SIM_FAILURE,
    EXIT_TERMINATED,
    ConfigError,
    SimulationError,
)
from simulator.runner.run import Simulation
from tests.conftest import REPO

SMALL: dict[str, Any] = {
    "name": "exit-codes",
    "model": "Llama-3.1-8B",
    "workload": {"arrival": {"kind": "poisson", "rate_per_s": 4},
                 "input_tokens": {"kind": "fixed", "tokens": 128},
                 "output_tokens": {"kind": "fixed", "tokens": 4},
                 "num_requests": 5},
    "cluster": {"pools": [{"name": "main", "device": "H100-SXM"}]},
}


def scenario(tmp_path: Path, **updates: Any) -> Path:
    data = yaml.safe_load(yaml.safe_dump(SMALL))
    for dotted, value in updates.items():
        node = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[last] = value
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def exit_code(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        main(argv)
        code = EXIT_OK
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    return code, capsys.readouterr().err


def test_documented_codes_match_the_code() -> None:
    text = (REPO / "docs/RELIABILITY.md").read_text()
    table = dict(re.findall(r"^\| `(\d+)` \| ([^|]+) \|", text, flags=re.MULTILINE))
    assert table.keys() == {str(EXIT_OK), str(EXIT_SIM_FAILURE), str(EXIT_BAD_INPUT),
                            str(EXIT_INTERRUPTED), str(EXIT_TERMINATED)}
    assert "success" in table[str(EXIT_OK)]
    assert "bad input" in table[str(EXIT_BAD_INPUT)]
    assert "simulation failed" in table[str(EXIT_SIM_FAILURE)]
    assert EXIT_INTERRUPTED == 130
    assert EXIT_TERMINATED == 143
    assert len({EXIT_OK, EXIT_SIM_FAILURE, EXIT_BAD_INPUT, EXIT_INTERRUPTED,
                EXIT_TERMINATED}) == 5


def test_success_is_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = exit_code(["run", str(scenario(tmp_path))], capsys)
    assert code == EXIT_OK
    assert err == ""


@pytest.mark.parametrize(("updates", "says"), [
    ({"workload.arrival.rate_per_s": -1}, "workload.arrival.poisson.rate_per_s"),
    ({"cluster.pools.0.device": "H900"}, "cluster.pools[0].device"),
    ({"model": "Llama-3.1-405B"}, "does not fit"),
    ({"workload.num_requests": 1e400}, "workload.num_requests: number out of range"),
])
def test_bad_input_is_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                      updates: dict[str, Any], says: str) -> None:
    path = scenario(tmp_path, **updates)
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert err.count("\n") == 1
    assert err.startswith(f"error: {path}: ")
    assert says in err


@pytest.mark.parametrize("content", ["", "model: [", "- a list", "a: 1\na: 2\n"])
def test_unreadable_files_are_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                content: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert err.count("\n") == 1


def test_missing_file_and_folder_are_2(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["run", str(tmp_path / "nope.yaml")], capsys)[0] == EXIT_BAD_INPUT
    assert exit_code(["run", str(tmp_path)], capsys)[0] == EXIT_BAD_INPUT


@pytest.mark.parametrize("extra", [["--seed", "-1"], ["--seed", "abc"], ["--no-such-option"]])
def test_usage_errors_are_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                            extra: list[str]) -> None:
    """Command-line mistakes (click's usage errors) share the bad-input code."""
    code, err = exit_code(["run", str(scenario(tmp_path)), *extra], capsys)
    assert code == EXIT_BAD_INPUT
    assert "Traceback" not in err


def test_missing_argument_is_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["run"], capsys)[0] == EXIT_BAD_INPUT


def _raise(exc: BaseException) -> Any:
    def boom(*_args: Any, **_kwargs: Any) -> Any:
        raise exc
    return boom


def test_simulation_failure_is_1_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(Simulation, "run",
                        _raise(SimulationError("KV over-allocation: 5 + 3 > 7 blocks")))
    code, err = exit_code(["run", str(scenario(tmp_path))], capsys)
    assert code == EXIT_SIM_FAILURE
    assert err == "error: KV over-allocation: 5 + 3 > 7 blocks\n"


def test_a_bug_is_1_with_one_line_and_debug_shows_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(Simulation, "run", _raise(RuntimeError("first line\n  second line")))
    monkeypatch.delenv("DISAGG_SIM_DEBUG", raising=False)
    code, err = exit_code(["run", str(scenario(tmp_path))], capsys)
    assert code == EXIT_SIM_FAILURE
    assert err.count("\n") == 1
    assert err.startswith("internal error: RuntimeError: first line second line")
    assert "Traceback" not in err
    monkeypatch.setenv("DISAGG_SIM_DEBUG", "1")
    with pytest.raises(RuntimeError, match="first line"):
        main(["run", str(scenario(tmp_path))])


def test_interrupt_is_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(Simulation, "run", _raise(KeyboardInterrupt()))
    code, err = exit_code(["run", str(scenario(tmp_path))], capsys)
    assert code == 130
    assert "Traceback" not in err


@pytest.mark.parametrize(("command", "expect"), [
    (["compare"], EXIT_BAD_INPUT),
    (["plan"], EXIT_BAD_INPUT),
])
def test_other_commands_reading_a_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           command: list[str], expect: int) -> None:
    path = scenario(tmp_path, **{"cluster.pools.0.device": "H900"})
    code, err = exit_code([*command, str(path)], capsys)
    assert code == expect
    assert err.count("\n") == 1


def test_installed_command_exit_codes(tmp_path: Path) -> None:
    """The console script, in a fresh process: 0 for a good file, 2 for a bad one."""
    code = "import sys; from simulator.cli import main; main(sys.argv[1:])"
    good = subprocess.run([sys.executable, "-c", code, "run", str(scenario(tmp_path))],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert good.returncode == EXIT_OK, good.stderr
    bad_path = tmp_path / "bad.yaml"
    bad_path.write_text("model: x\nworkload: {}\ncluster: {pools: []}\n")
    bad = subprocess.run([sys.executable, "-c", code, "run", str(bad_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == EXIT_BAD_INPUT
    assert bad.stderr.count("\n") == 1
    assert str(bad_path) in bad.stderr


# ----- regressions: bad inputs that used to escape ----------------------------------------
def test_missing_model_config_names_the_scenario(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The error used to name the missing config.json instead of the scenario."""
    path = scenario(tmp_path, model="no_such_model.json")
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert err.startswith(f"error: {path}: model: ")


def test_missing_trace_names_the_scenario(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The error used to name the missing trace file instead of the scenario."""
    path = scenario(tmp_path, workload={"arrival": {"kind": "trace", "path": "nope.csv"},
                                        "num_requests": 5})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert err.startswith(f"error: {path}: workload.arrival.path: ")


def test_gamma_with_a_tiny_cv_is_not_a_crash(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """shape = 1 / cv**2 used to divide by zero when cv**2 underflowed."""
    path = scenario(tmp_path, **{"workload.arrival": {"kind": "gamma", "rate_per_s": 4.0,
                                                      "cv": 1e-300}})
    code, err = exit_code(["run", str(path)], capsys)
    assert code in {EXIT_OK, EXIT_BAD_INPUT}, err
    assert "internal error" not in err


def test_lognormal_min_above_max_is_rejected(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Lognormal lengths used to accept min_tokens > max_tokens (uniform ones did not)."""
    lengths = {"kind": "lognormal", "mean_tokens": 100, "cv": 1.0,
               "min_tokens": 500, "max_tokens": 100}
    path = scenario(tmp_path, **{"workload.input_tokens": lengths})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert f"{path}: workload.input_tokens" in err


def test_prefix_longer_than_kv_with_lognormal_prompts(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """Even the shortest prompt (a 10^8-token shared prefix on every request) cannot fit;
    every request used to be rejected and the run "succeeded" with nothing completed."""
    path = scenario(tmp_path, **{
        "workload.input_tokens": {"kind": "lognormal", "mean_tokens": 100, "cv": 1.0},
        "workload.shared_prefix": {"tokens": 10**8}})
    code, err = exit_code(["run", str(path)], capsys)
    assert code == EXIT_BAD_INPUT
    assert f"{path}: cluster.pools[0].parallelism" in err


def test_on_off_with_a_tiny_on_window_finishes(tmp_path: Path) -> None:
    """An ON window of 1 ns at 4 req/s needs ~10^8 empty windows per arrival; the arrival
    loop used to step through them one by one (a hang)."""
    path = scenario(tmp_path, **{"workload.arrival": {"kind": "on_off", "on_rate_per_s": 4.0,
                                                      "on_s": 1e-9, "off_s": 1.0}})
    code = "import sys; from simulator.cli import main; main(sys.argv[1:])"
    try:
        done = subprocess.run([sys.executable, "-c", code, "run", str(path)], cwd=REPO,
                              capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired:
        pytest.fail("a 1 ns ON window hangs the arrival process")
    assert done.returncode in {EXIT_OK, EXIT_BAD_INPUT}


def test_api_run_rejects_a_negative_seed() -> None:
    """run(seed=...) used model_copy, which skips validation."""
    from simulator.runner import run
    from tests.conftest import make_scenario

    with pytest.raises(ConfigError):
        run(make_scenario(), seed=-1)
