"""The gated members of an instance's life outside serving: liveness, power, draining,
straggler speed, the autoscaler's TTFT/TPOT signals, failure and recovery.

:class:`InstanceLife` is a base of :class:`~simulator.engine.instance.Instance`: like every
public member there, each of these passes the fast-forward gate (``@observes`` for reads,
``@mutates`` for writes, ``@unbooked`` for reads of liveness, power and draining, which a
jump never changes). The state they read and change is the instance's own
(:class:`~simulator.engine.lifecycle.Lifecycle`, its queues and KV).
"""

from __future__ import annotations

from simulator.engine.fast_forward import mutates, observes, unbooked
from simulator.engine.process import ServingProcess
from simulator.engine.request import Request, State


class InstanceLife(ServingProcess):
    """Faults, power, draining and autoscaling signals of one instance."""

    # Set by Instance.__init__.
    _reserved: dict[int, Request]

    # ----- what the router, the cluster and the autoscaler read ----------------------
    @property
    @unbooked
    def alive(self) -> bool:
        return self._life.alive

    @property
    @unbooked
    def active(self) -> bool:
        """Powered on and started (autoscaled instances may be off)."""
        return self._life.active

    @property
    @unbooked
    def accepting(self) -> bool:
        """Takes new work: alive, powered and not draining."""
        return self._life.accepting

    @property
    @unbooked
    def draining(self) -> bool:
        return self._life.draining

    @observes
    def take_signals(self, kind: str) -> list[float]:
        """The TTFT or TPOT samples since the last call (the autoscaler's signal)."""
        return self._life.take(kind)

    @observes
    def powered_until(self, end: float) -> float:
        """Seconds this instance was powered from t=0 to ``end``."""
        return self._life.powered_until(end)

    # ----- what they change ------------------------------------------------------------
    @mutates
    def collect_signals(self) -> None:
        """From now on keep TTFT/TPOT samples for :meth:`take_signals`."""
        self._life.collect = True

    @mutates
    def set_speed(self, factor: float) -> None:
        """Straggler: every step from the next one takes ``factor`` times longer."""
        self._life.speed = factor

    @mutates
    def power(self, on: bool) -> None:
        self._life.power(on, self.env.now)

    @mutates
    def switch_off(self) -> None:
        """Not serving and not powered (an autoscaled instance off, or drained)."""
        self._life.switch_off(self.env.now)

    @mutates
    def start_serving(self) -> None:
        """Powered and started: takes work."""
        self._life.start_serving()

    @mutates
    def drain(self) -> None:
        """Take no new work; finish what is here."""
        self._life.draining = True

    # ----- faults ---------------------------------------------------------------------
    @mutates
    def fail(self) -> tuple[list[Request], list[Request], list[Request]]:
        """Lose every request's KV and stop; return (to recompute, held, reserved).

        Requests waiting or running here must be prefilled again elsewhere; ``held`` ones
        (prefill role) lost the KV they were handing off; ``reserved`` ones (decode role)
        were being sent here and can be sent elsewhere from their prefill instance.
        """
        jump = self._jump
        if jump is not None:
            # Book the decode steps of the jump that finished before the failure; the
            # step running at the failure is lost, as it would be step by step.
            self._jump = None
            done = jump.steps_ended_by(self.env.now)
            if done:
                self._apply_jump(jump, done)
        lost = [r for r in (*self._waiting, *self._running) if r.status is not State.CANCELLED]
        self._aborts.clear()
        if self._swap is not None:
            lost += self._swap.lose_all()
        held = list(self._held.values())
        reserved = list(self._reserved.values())
        self._waiting.clear()
        self._running.clear()
        self._held.clear()
        self._reserved.clear()
        self._queued_tokens = 0
        self._pipe.reset(self.env.now)
        self._kv.reset()
        for req in lost + held + reserved:
            req.in_flight = False
            req.blocks = 0
            req.src_blocks = 0
            req.cache_pins = 0
        self._life.fail()
        if self.process.is_alive:
            self.process.interrupt("fail")
        return lost, held, reserved

    @mutates
    def recover(self) -> None:
        self._life.recover()
        revive = self._revive
        if revive is not None and not revive.triggered:
            revive.succeed()
