"""An instance's life outside serving: faults, power, draining and autoscaling signals.

Plain state, no SimPy: the instance keeps one :class:`Lifecycle` and passes the clock in.
A failed instance (``alive`` false) has lost its KV and its work; an inactive one is
powered off; a draining one takes no new work. ``epoch`` counts failures, so that a
pipeline micro-batch that was in flight at a failure is dropped when it would leave.
"""

from __future__ import annotations


class Lifecycle:
    __slots__ = ("active", "alive", "collect", "draining", "epoch", "powered_s",
                 "powered_since", "speed", "tpot", "ttft")

    def __init__(self) -> None:
        self.alive = True
        self.active = True
        self.draining = False
        self.epoch = 0
        self.powered_s = 0.0
        self.powered_since: float | None = 0.0
        self.speed = 1.0  # > 1 slows every step (a straggler); set by fault injection
        self.collect = False  # an autoscaler reads recent TTFT/TPOT samples
        self.ttft: list[float] = []
        self.tpot: list[float] = []

    @property
    def accepting(self) -> bool:
        """Takes new work: alive, powered and not draining."""
        return self.alive and self.active and not self.draining

    # ----- power -------------------------------------------------------------------------
    def power(self, on: bool, now: float) -> None:
        if on and self.powered_since is None:
            self.powered_since = now
        elif not on and self.powered_since is not None:
            self.powered_s += now - self.powered_since
            self.powered_since = None

    def powered_until(self, end: float) -> float:
        """Seconds powered from t=0 to ``end``."""
        extra = end - self.powered_since if self.powered_since is not None else 0.0
        return self.powered_s + max(0.0, extra)

    def switch_off(self, now: float) -> None:
        self.active = False
        self.draining = False
        self.power(False, now)

    def start_serving(self) -> None:
        self.active = True
        self.draining = False

    # ----- faults ----------------------------------------------------------------------
    def fail(self) -> None:
        self.alive = False
        self.epoch += 1

    def recover(self) -> None:
        self.alive = True
        self.speed = 1.0

    # ----- autoscaling signals ---------------------------------------------------------
    def take(self, kind: str) -> list[float]:
        """The TTFT or TPOT samples since the last call."""
        bucket = self.ttft if kind == "ttft" else self.tpot
        out = list(bucket)
        bucket.clear()
        return out
