"""The pipeline executor: when a micro-batch enters and leaves ``pp`` stages.

Micro-batches flow through the stages; a new one enters stage 0 as soon as it is free,
so up to ``pp`` batches are in flight (as vLLM's virtual engines do). A batch's exit time
follows from the stage recurrence ``finish[s] = max(finish[s-1], free[s]) + stage[s]`` —
no event per stage. Plain arithmetic: the instance turns the times into SimPy timeouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StagePlan:
    first_stage_done: float
    """When stage 0 is free for the next micro-batch."""
    exit_s: float
    """When this micro-batch leaves the last stage."""
    busy_s: float
    """Device-seconds per device: host work and every stage's compute over ``pp`` groups."""


class Pipeline:
    __slots__ = ("in_flight", "pp", "stage_free")

    def __init__(self, pp: int) -> None:
        self.pp = pp
        self.stage_free = [0.0] * pp
        self.in_flight = 0  # micro-batches between entering stage 0 and leaving the last

    @property
    def full(self) -> bool:
        return self.in_flight >= self.pp

    def enter(self, start: float, step_s: float, stages: Sequence[float],
              speed: float) -> StagePlan:
        """Book a micro-batch entering at ``start`` whose step takes ``step_s`` (host work
        plus ``stages``), every figure scaled by ``speed``."""
        host_s = step_s - sum(stages)
        free = self.stage_free
        t = start + host_s * speed
        first_stage_done = t
        for s, seconds in enumerate(stages):
            t = max(t, free[s]) + seconds * speed
            free[s] = t
            if s == 0:
                first_stage_done = t
        self.in_flight += 1
        return StagePlan(first_stage_done, t, step_s * speed / self.pp)

    def leave(self) -> None:
        self.in_flight -= 1

    def reset(self, now: float) -> None:
        """A failure: every micro-batch in flight is lost."""
        self.in_flight = 0
        self.stage_free = [now] * self.pp
