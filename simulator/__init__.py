"""disagg-sim: a discrete-event simulator of LLM inference clusters.

The public Python API::

    import simulator
    scenario = simulator.load_scenario("scenarios/quickstart.yaml")
    result = simulator.run(scenario.with_(**{"workload.arrival.time_scale": 0.5}))
    result.summary, result.requests, result.steps, result.transfers
"""

from simulator.errors import ConfigError, SimulatorError
from simulator.runner.result import RunResult
from simulator.runner.run import Simulation, run
from simulator.scenario.load import load_scenario
from simulator.scenario.schema import Scenario

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "RunResult",
    "Scenario",
    "Simulation",
    "SimulatorError",
    "__version__",
    "load_scenario",
    "run",
]
