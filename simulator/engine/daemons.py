"""Periodic processes that never keep a run alive, and the rule that ends a stalled run.

The autoscaler's ticks and drain polls and the up-times of random failures repeat for as
long as the workload has requests outstanding. If requests can never finish, those timers
alone would keep the clock going for ever. So they are *daemons*: each waits through
:meth:`Daemons.sleep`, and the run **stalls** (the clock stops, the requests still
outstanding are reported ``in_flight``) when a daemon wakes and

1. every event still scheduled is a daemon's sleep: no step, flow, arrival, cold start,
   repair or client timeout is pending, so nothing but a daemon could change anything; and
2. no daemon could rescue a waiting request: none waits at the router or for decode room,
   or every autoscaler whose pool has an instance that is off and could take one has since
   looked at its signal (outside its cooldown) and chosen not to scale.

A request queued, running or held on an instance, or in a transfer, moves only by an
event of that instance or flow, which condition 1 says there is none of. A request
waiting at the router or for decode room moves when an instance becomes available:
by a repair or a cold start (events, condition 1) or by a scale-out (condition 2). A
random failure that would have restarted a stuck request somewhere else is not waited
for. While the state is frozen like this, a daemon's only actions are scaling ones, and
each of them ends the quiet period (:meth:`Daemons.acted`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import simpy
from simpy.core import StopSimulation


class Rescuer(Protocol):
    """A daemon that can make room for waiting requests (an autoscaler)."""

    def could_rescue(self) -> bool:
        """Whether one of its instances that is off could take a waiting request."""
        ...


class Daemons:
    """The daemons of one run; see the module docstring.

    ``waiting`` says whether any request waits for an instance to become available.
    """

    def __init__(self, env: simpy.Environment, waiting: Callable[[], bool]) -> None:
        self.env = env
        self.waiting = waiting
        self.stalled_at: float | None = None
        """When the run stalled (None: it did not)."""
        self._sleeping = 0
        self._quiet_period = False
        self._rescuers: list[Rescuer] = []
        self._quiet: set[int] = set()

    def add_rescuer(self, rescuer: Rescuer) -> None:
        self._rescuers.append(rescuer)

    def sleep(self, delay: float) -> simpy.Timeout:
        """A daemon's wait; if the run has stalled when it ends, the clock stops there."""
        timeout = self.env.timeout(delay)
        self._sleeping += 1
        timeout.callbacks.append(self._woke)  # runs before the daemon resumes
        return timeout

    def deadline(self, delay: float) -> simpy.Timeout:
        """The clock's limit (``simulation.max_time_s``): it does not keep a stalled run
        going either."""
        timeout = self.env.timeout(delay)
        self._sleeping += 1
        timeout.callbacks.append(self._expired)
        return timeout

    def _expired(self, _event: simpy.Event) -> None:
        self._sleeping -= 1

    def acted(self) -> None:
        """A daemon changed the cluster (scaled out or in): the state is not frozen."""
        self._quiet_period = False
        self._quiet.clear()

    def quiet(self, rescuer: Rescuer) -> None:
        """``rescuer`` looked (outside its cooldown) and chose not to act."""
        if self._quiet_period:
            self._quiet.add(id(rescuer))

    def _woke(self, _event: simpy.Event) -> None:
        self._sleeping -= 1
        # SimPy keeps every scheduled event in one queue; what is not a daemon's sleep
        # there could still move a request.
        if len(self.env._queue) > self._sleeping:  # type: ignore[attr-defined]
            self.acted()
            return
        if not self._quiet_period:
            self._quiet_period = True
            self._quiet.clear()
        if self.waiting() and any(id(r) not in self._quiet and r.could_rescue()
                                  for r in self._rescuers):
            return
        self.stalled_at = self.env.now
        raise StopSimulation(self.env.now)
