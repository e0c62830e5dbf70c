"""Serving-engine schedulers as pure policies (see :mod:`.base` for the seam)."""

from __future__ import annotations

from simulator.engine.config import SchedulerSpec
from simulator.engine.scheduler.base import (
    Admission,
    EngineLimits,
    KVLedger,
    PlainLedger,
    Scheduler,
    SchedulerOutput,
    SchedulerView,
)
from simulator.engine.scheduler.continuous import DecodeFirstChunked, PrefillFirst

__all__ = ["Admission", "DecodeFirstChunked", "EngineLimits", "KVLedger", "PlainLedger",
           "PrefillFirst", "Scheduler", "SchedulerOutput", "SchedulerView", "make_scheduler"]


def make_scheduler(spec: SchedulerSpec) -> Scheduler:
    """The policy a scheduler spec selects."""
    if spec.chunked_prefill:
        return DecodeFirstChunked()
    return PrefillFirst()
