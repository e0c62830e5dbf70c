"""What a run will cost in memory and timer events, estimated before it starts.

A run keeps one record per request and per engine step until its frames are built, and
the monitoring series has one row per interval and instance. The estimate counts those
from the scenario alone (request count, mean output length, batch limits, simulated time)
and is a lower bound: every step is assumed to run a full batch. A run whose lower bound
does not fit in the memory this machine has free is refused with the estimate and the
setting that bounds it, instead of running for an hour and then being killed.

Per-record sizes were measured as peak-RSS growth (frames included) on a colocated
Llama-3.1-8B / H100 run of 20,000 requests and 157,000 steps.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from simulator.engine.config import RandomFailures
from simulator.engine.workload_spec import (
    ConstantArrival,
    EmpiricalLength,
    FixedLength,
    GammaArrival,
    Length,
    LognormalLength,
    OnOffArrival,
    PoissonArrival,
    UniformLength,
)
from simulator.errors import ConfigError
from simulator.scenario.schema import Scenario

BYTES_PER_REQUEST = 1_200
BYTES_PER_STEP = 120
BYTES_PER_MONITOR_ROW = 150
FEWER_REQUESTS = ("workload.num_requests", "lower workload.num_requests (or "
                  "workload.duration_s)")
COARSER_MONITORING = ("simulation.monitor_interval_s", "raise simulation.monitor_interval_s")
MAX_SIM_TIME_S = 1e9
"""Longest simulated span (~32 years); beyond it the clock's resolution nears a step's
length and no study needs it."""
MAX_TIMER_EVENTS = 10**8
"""Periodic events (autoscaler looks, random failures and repairs) one run may schedule."""


@dataclass
class Estimate:
    requests: float | None
    sim_time_s: float | None
    parts: dict[str, tuple[float, tuple[str, str]]] = field(default_factory=dict)
    """name -> (bytes, (the setting that bounds it, what to do with it))."""
    timers: dict[str, tuple[float, str]] = field(default_factory=dict)
    """name -> (events, the setting that bounds it)."""

    @property
    def bytes(self) -> float:
        return sum(b for b, _ in self.parts.values())


def mean_tokens(spec: Length | None) -> float:
    if isinstance(spec, FixedLength):
        return float(spec.tokens)
    if isinstance(spec, UniformLength):
        return (spec.min_tokens + spec.max_tokens) / 2
    if isinstance(spec, LognormalLength):
        return min(max(spec.mean_tokens, spec.min_tokens), spec.max_tokens)
    if isinstance(spec, EmpiricalLength):
        weights = spec.weights or [1.0] * len(spec.values)
        return sum(v * w for v, w in zip(spec.values, weights, strict=True)) / sum(weights)
    return 1.0


def _rate(scenario: Scenario) -> float | None:
    rates = [arrival_rate(src.arrival) for src in scenario.workload.sources]
    return None if None in rates else sum(r for r in rates if r is not None)


def arrival_rate(a: object) -> float | None:
    """Mean requests per second of an open-loop arrival process (None: no rate)."""
    if isinstance(a, PoissonArrival | GammaArrival | ConstantArrival):
        return a.rate_per_s
    if isinstance(a, OnOffArrival):
        return (a.on_rate_per_s * a.on_s + a.off_rate_per_s * a.off_s) / (a.on_s + a.off_s)
    return None


def estimate_run(scenario: Scenario, instances_by_pool: dict[str, int],
                 max_num_seqs: int | None = None) -> Estimate:
    """Lower bounds of a run's records and periodic events (see the module docstring)."""
    w = scenario.workload
    rate = _rate(scenario)
    n: float | None = w.num_requests
    if rate is not None and w.duration_s is not None:
        n = min(n if n is not None else float("inf"), rate * w.duration_s)
    horizon = w.duration_s
    if horizon is None and rate is not None and n is not None:
        horizon = n / rate
    if scenario.simulation.max_time_s is not None:
        horizon = min(horizon or float("inf"), scenario.simulation.max_time_s)
    est = Estimate(n, horizon)
    instances = sum(instances_by_pool.values())
    if n is not None and not w.is_trace:
        # The largest running cap as the build resolved it; without one, the pools' own
        # (an unset limit counts as one sequence: more steps, a safer estimate).
        seqs = max_num_seqs or max(p.scheduler.max_num_seqs or 1
                                   for p in scenario.cluster.pools)
        output = sum(mean_tokens(src.output_tokens) for src in w.sources) / len(w.sources)
        steps = n * output / max(1, seqs)
        est.parts["requests"] = (n * BYTES_PER_REQUEST, FEWER_REQUESTS)
        est.parts["steps"] = (steps * BYTES_PER_STEP, FEWER_REQUESTS)
    if horizon is not None:
        rows = horizon / scenario.simulation.monitor_interval_s * max(1, instances)
        est.parts["monitoring"] = (rows * BYTES_PER_MONITOR_ROW, COARSER_MONITORING)
        for i, pool in enumerate(scenario.cluster.pools):
            if pool.autoscale is not None:
                est.timers[f"autoscaler of {pool.name}"] = (
                    horizon / pool.autoscale.interval_s,
                    f"cluster.pools[{i}].autoscale.interval_s")
        for i, fault in enumerate(scenario.faults):
            if isinstance(fault, RandomFailures):
                count = instances_by_pool.get(fault.pool, 1)
                est.timers[f"random failures of {fault.pool}"] = (
                    2 * horizon / fault.mtbf_s * count, f"faults[{i}].mtbf_s")
    return est


def available_bytes() -> float | None:
    """Memory this process may still use: MemAvailable, capped by a cgroup limit."""
    free: float | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                free = float(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None and hasattr(os, "sysconf"):
        try:
            free = float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError):
            free = None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
        if limit.isdigit() and used.isdigit():
            room = float(int(limit) - int(used))
            free = room if free is None else min(free, room)
    except OSError:
        pass
    return free


def _gib(x: float) -> str:
    gib = x / 2**30
    return f"{gib:,.1f} GiB" if gib < 1e6 else f"{gib:.3g} GiB"


def check_budget(est: Estimate, file: str | None, free: float | None = None) -> None:
    """Refuse a run whose lower-bound estimate exceeds the machine, naming the setting."""
    if est.sim_time_s is not None and est.sim_time_s > MAX_SIM_TIME_S:
        raise ConfigError(
            f"the workload spans about {est.sim_time_s:.3g} simulated seconds "
            f"({est.requests or 0:.3g} requests); at most {MAX_SIM_TIME_S:.0e} s: raise the "
            "arrival rate or lower num_requests / duration_s", file=file, key="workload")
    for what, (events, knob) in est.timers.items():
        if events > MAX_TIMER_EVENTS:
            raise ConfigError(
                f"the {what} would schedule about {events:,.3g} events over "
                f"{est.sim_time_s:,.3g} simulated seconds (at most {MAX_TIMER_EVENTS:,}); "
                f"raise it or shorten the run", file=file, key=knob)
    free = available_bytes() if free is None else free
    if free is None or est.bytes <= 0.8 * free:
        return
    _, (_, (knob, advice)) = max(est.parts.items(), key=lambda kv: kv[1][0])
    shown = ", ".join(f"{k} {_gib(b)}" for k, (b, _) in est.parts.items())
    raise ConfigError(
        f"this run needs at least {_gib(est.bytes)} of memory ({shown}; "
        f"{est.requests or 0:,.0f} requests), more than the {_gib(free)} free on this machine; "
        f"{advice}", file=file, key=knob)
