"""A link shared by concurrent transfers: each of ``n`` active transfers gets 1/n of it.

Fixed costs (set-up overhead and latency) are pure delays; only the byte stream shares
bandwidth (processor sharing). Every change in the set of active transfers re-plans the
next completion; stale wake-ups are ignored by a generation counter.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from simulator.hardware.profiles import LinkProfile

_EPS_BYTES = 1e-6


class SharedLink:
    def __init__(self, env: simpy.Environment, index: int, name: str, profile: LinkProfile,
                 streams: int = 1, bandwidth_factor: float = 1.0) -> None:
        self.env = env
        self.index = index
        self.name = name
        self.profile = profile
        self.streams = streams
        self.dead = False
        self.bandwidth = profile.effective_bandwidth * streams * bandwidth_factor
        self.fixed_s = (profile.per_transfer_overhead_us + profile.latency_us) * 1e-6
        self._active: dict[int, list[Any]] = {}
        self._ids = 0
        self._gen = 0
        self._last = env.now

    @property
    def active(self) -> int:
        return len(self._active)

    def send(self, nbytes: float) -> Generator[simpy.Event, Any, bool]:
        """Process body: wait the fixed cost, then stream ``nbytes`` sharing the link.

        Returns False if the link died for good before the bytes got through.
        """
        if self.dead:
            return False
        if self.fixed_s:
            yield self.env.timeout(self.fixed_s)
        if nbytes <= 0 or self.bandwidth == float("inf"):
            return not self.dead
        done = self.env.event()
        self._advance()
        self._ids += 1
        self._active[self._ids] = [float(nbytes), done]
        self._replan()
        delivered = yield done
        return bool(delivered)

    def _advance(self) -> None:
        now = self.env.now
        if self._active and now > self._last and self.bandwidth > 0:
            drained = (now - self._last) * self.bandwidth / len(self._active)
            for entry in self._active.values():
                entry[0] -= drained
        self._last = now

    def _replan(self) -> None:
        self._gen += 1
        if not self._active or self.bandwidth <= 0:  # down: transfers stall until repaired
            return
        rate = self.bandwidth / len(self._active)
        soonest = min(entry[0] for entry in self._active.values())
        wait = max(0.0, soonest / rate)
        gen = self._gen
        timer = self.env.timeout(wait)
        timer.callbacks.append(lambda _e: self._tick(gen))

    def _tick(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._advance()
        rate = self.bandwidth / max(1, len(self._active))
        finished = [k for k, e in self._active.items()
                    if e[0] <= _EPS_BYTES or e[0] / rate <= 1e-12]
        for key in finished:
            self._active.pop(key)[1].succeed(True)
        self._replan()

    def set_bandwidth_factor(self, factor: float, *, for_good: bool = False) -> None:
        """Change the link's speed from now on; factor 0 for good kills it."""
        self._advance()
        self.bandwidth = self.profile.effective_bandwidth * self.streams * factor
        if factor <= 0 and for_good:
            self.dead = True
            for _bytes, done in self._active.values():
                done.succeed(False)
            self._active.clear()
        self._replan()
