"""Scenario schema, loading and dotted-path updates."""

from simulator.scenario.load import load_scenario
from simulator.scenario.schema import (
    ClusterSpec,
    KVTransferSpec,
    ParallelismSpec,
    PoolSpec,
    PrecisionSpec,
    Scenario,
    SimulationSpec,
    SLOSpec,
)

__all__ = [
    "ClusterSpec",
    "KVTransferSpec",
    "ParallelismSpec",
    "PoolSpec",
    "PrecisionSpec",
    "SLOSpec",
    "Scenario",
    "SimulationSpec",
    "load_scenario",
]
