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
    ordered_waiting,
)
from simulator.engine.scheduler.continuous import DecodeFirstChunked, PrefillFirst
from simulator.engine.scheduler.sglang import SglangScheduler
from simulator.engine.scheduler.trtllm import TrtllmInflight
from simulator.engine.scheduler.vllm_v1 import VllmV1

__all__ = ["Admission", "DecodeFirstChunked", "EngineLimits", "KVLedger", "PlainLedger",
           "PrefillFirst", "Scheduler", "SchedulerOutput", "SchedulerView", "SglangScheduler",
           "TrtllmInflight", "VllmV1", "make_scheduler", "ordered_waiting"]


def make_scheduler(spec: SchedulerSpec) -> Scheduler:
    """A fresh policy object for one instance, as ``spec`` selects (``engine`` not
    resolved against a serving-engine profile means ``continuous``)."""
    if spec.policy == "vllm_v1":
        return VllmV1(chunked=spec.chunked)
    if spec.policy == "trtllm":
        return TrtllmInflight(spec.capacity_scheduler_policy or "guaranteed_no_evict",
                              chunked=spec.chunked)
    if spec.policy == "sglang":
        return SglangScheduler(spec.schedule_policy or "lpm", spec.init_new_token_ratio or 0.7)
    if spec.chunked:
        return DecodeFirstChunked()
    return PrefillFirst()
