"""Every shipped scenario runs with --out and --trace, and every run plot draws from it.

The request count is cut (``--set workload.num_requests=...``) to keep the suite fast; the
long-run case that used to recurse in the monitoring series is pinned in
tests/test_busy_bins.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer

from simulator.cli import main
from simulator.cli.app import app
from simulator.errors import EXIT_OK
from tests.conftest import REPO
from tests.test_trace_events import is_scenario_file

SCENARIOS = [p for p in sorted((REPO / "scenarios").rglob("*.yaml")) if is_scenario_file(p)]
RUN_PLOTS = ("cdf", "timeline", "monitoring")


def _cli(argv: list[str], command: object) -> int:
    try:
        main(argv, command)  # type: ignore[arg-type]
    except SystemExit as exc:
        return int(exc.code or 0)
    return EXIT_OK


@pytest.fixture(scope="module")
def command() -> object:
    return typer.main.get_command(app)


def test_there_are_shipped_scenarios() -> None:
    assert len(SCENARIOS) >= 20


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: str(p.relative_to(REPO / "scenarios")))
def test_run_out_trace_and_plots(path: Path, tmp_path: Path, command: object,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    out, trace = tmp_path / "out", tmp_path / "trace.json"
    code = _cli(["run", str(path), "--out", str(out), "--trace", str(trace),
                 "--set", "workload.num_requests=12"], command)
    err = capsys.readouterr().err
    assert code == EXIT_OK, err
    assert err == ""
    assert json.loads((out / "summary.json").read_text())["completed"] >= 1
    assert json.loads(trace.read_text())["traceEvents"]
    for kind in RUN_PLOTS:
        code = _cli(["plot", str(out), "--kind", kind, "--format", "png"], command)
        err = capsys.readouterr().err
        assert code == EXIT_OK, f"{kind}: {err}"
        assert (out / "plots" / f"{kind}.png").stat().st_size > 0
