"""What a step costs, and the accumulator the step model adds operators into."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeAlias

import numpy as np

from simulator.hardware.profiles import LinkProfile


@dataclass(frozen=True, slots=True)
class StepCost:
    """Seconds of one step, and where they went (summed over pipeline stages)."""

    seconds: float
    stage_seconds: tuple[float, ...]
    compute_s: float
    memory_s: float
    communication_s: float
    overhead_s: float

    @property
    def bound(self) -> str:
        parts = {
            "compute": self.compute_s,
            "memory": self.memory_s,
            "communication": self.communication_s,
            "overhead": self.overhead_s,
        }
        return max(parts, key=parts.__getitem__)

    @property
    def slowest_stage_s(self) -> float:
        return max(self.stage_seconds)


class SeriesStep(NamedTuple):
    """One decode-only step read from a priced :class:`DecodeSeries`: the parts of a
    :class:`StepCost` an instance and its recorder use, with the series' bound."""

    seconds: float
    stage_seconds: tuple[float, ...]
    compute_s: float
    memory_s: float
    bound: str


SeriesColumn: TypeAlias = "np.ndarray | array[Any]"
"""One column of a :class:`DecodeSeries`: numpy as priced, an ``array`` as an instance
keeps and reads it (``simulator.engine.step_prices``)."""


class DecodeSeries(NamedTuple):
    """Consecutive decode steps: seconds, bound codes, compute and memory seconds."""

    seconds: SeriesColumn
    bound: SeriesColumn
    compute_s: SeriesColumn
    memory_s: SeriesColumn


@dataclass(slots=True)
class _Acc:
    compute: float = 0.0
    memory: float = 0.0
    comm: float = 0.0
    launch: float = 0.0
    ops: dict[str, float] | None = None
    """Seconds per operator family, kept only when a breakdown is asked for."""
    launch_scale: float = 1.0
    """Share of launch cost the step keeps (CUDA graphs), applied to ``ops`` only."""

    def add_op(self, t_compute: float, t_memory: float, t_launch: float, times: float,
               label: str = "other") -> None:
        if t_compute >= t_memory:
            self.compute += t_compute * times
        else:
            self.memory += t_memory * times
        self.launch += t_launch * times
        if self.ops is not None:
            self.ops[label] = self.ops.get(label, 0.0) + (
                max(t_compute, t_memory) + t_launch * self.launch_scale) * times

    def add_comm(self, seconds: float, label: str) -> None:
        self.comm += seconds
        if self.ops is not None:
            self.ops[label] = self.ops.get(label, 0.0) + seconds

    @property
    def total(self) -> float:
        return self.compute + self.memory + self.comm + self.launch


@dataclass(frozen=True)
class LinkSet:
    """The links a step's collectives cross, as placement decided them."""

    tp: LinkProfile | None = None
    pp: LinkProfile | None = None
    ep: LinkProfile | None = None
