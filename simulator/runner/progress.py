"""Running the event loop with a progress callback (for a long single run's display).

The loop is SimPy's own (``Environment.run(until=event)``), stepped here so that a
callback sees the clock every few thousand events; it schedules nothing, so a run with a
callback is event for event the run without one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import simpy
from simpy.core import EmptySchedule, StopSimulation


@dataclass(frozen=True)
class RunProgress:
    sim_time_s: float
    finished_requests: int
    """Requests completed, failed or rejected so far."""
    total_requests: int | None
    """The workload's request count, when it has one."""
    end_time_s: float | None
    """Where the clock will stop at the latest (duration or max_time_s), when known."""


ProgressCallback = Callable[[RunProgress], None]

EVENTS_PER_CALL = 2_000


def run_until(env: simpy.Environment, until: simpy.Event,
              progress: Callable[[float], None] | None) -> None:
    """``env.run(until=until)``, calling ``progress(env.now)`` every
    :data:`EVENTS_PER_CALL` events when given."""
    if progress is None:
        env.run(until=until)
        return
    if until.callbacks is None:  # already processed
        return
    until.callbacks.append(StopSimulation.callback)
    count = 0
    try:
        while True:
            env.step()
            count += 1
            if count % EVENTS_PER_CALL == 0:
                progress(env.now)
    except StopSimulation:
        return
    except EmptySchedule:
        raise RuntimeError(f'No scheduled events left but "until" event was not '
                           f"triggered: {until}") from None
