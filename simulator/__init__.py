"""disagg-sim: a discrete-event simulator of LLM inference clusters.

The public Python API::

    import simulator
    scenario = simulator.load_scenario("scenarios/quickstart.yaml")
    result = simulator.run(scenario.with_(**{"workload.arrival.time_scale": 0.5}),
                           base_dir="scenarios")
    result.summary, result.requests, result.steps, result.transfers, result.monitoring()
    table = simulator.sweep("scenarios/sweeps/tp_size_llama70b.yaml", "runs/tp")
    best = simulator.search_goodput(scenario)          # highest rate meeting the SLO
    plan = simulator.plan(simulator.load_plan("scenarios/plans/llama8b_chat.yaml"))
    fig = simulator.plots.latency(table)   # as `disagg-sim plot --kind latency`
    simulator.write_report("runs/tp")      # as `disagg-sim report runs/tp`
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _dist_version
from pathlib import Path
from typing import Any

from simulator.errors import ConfigError, SimulatorError
from simulator.runner.goodput import GoodputResult, GoodputSpec, search_goodput
from simulator.runner.planner import PlanResult, PlanSpec, load_plan, plan
from simulator.runner.result import RunResult
from simulator.runner.run import Simulation, run
from simulator.runner.sweep import Sweep, SweepSpec, load_sweep
from simulator.runner.sweep import run_sweep as sweep
from simulator.scenario.load import load_scenario
from simulator.scenario.schema import Scenario

try:
    __version__ = _dist_version("disagg-sim")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0.1.0"


def write_report(results: str | Path, out: str | Path | None = None) -> Path:
    """The HTML report of a run, sweep or plan folder (``disagg-sim report``)."""
    from simulator.report import write_report as _write

    return _write(results, out)


def __getattr__(name: str) -> Any:
    # matplotlib loads only when plots are used (the CLI and workers start faster).
    if name == "plots":
        import importlib

        return importlib.import_module("simulator.plots")
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")


__all__ = [
    "ConfigError",
    "GoodputResult",
    "GoodputSpec",
    "PlanResult",
    "PlanSpec",
    "RunResult",
    "Scenario",
    "Simulation",
    "SimulatorError",
    "Sweep",
    "SweepSpec",
    "__version__",
    "load_plan",
    "load_scenario",
    "load_sweep",
    "plan",
    "plots",
    "run",
    "search_goodput",
    "sweep",
    "write_report",
]
