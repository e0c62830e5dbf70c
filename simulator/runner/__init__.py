"""Run scenarios (and, in sweep.py, grids of them)."""

from simulator.runner.result import RunResult
from simulator.runner.run import Simulation, run, spawn_rngs

__all__ = ["RunResult", "Simulation", "run", "spawn_rngs"]
