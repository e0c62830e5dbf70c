"""The network fabric: KV hand-offs as flows over shared resources, max-min fair.

A *resource* is one direction of something with a byte rate: a GPU's NVLink port, a NIC
(possibly shared by several GPUs), a host PCIe link, a node's spine uplink. A *flow* moves
bytes from one source rank to one destination rank over a tuple of resources, optionally
capped (a layer-wise stream cannot leave faster than the prefill produces it).

Rates are max-min fair with per-flow caps (progressive filling, Bertsekas & Gallager,
*Data Networks*, section 6.5.2): raise every unfrozen flow's rate together until a flow
reaches its cap or a resource is full, freeze those flows, repeat. The allocation is
re-planned on every flow arrival and departure and on every change of a resource's
speed (faults), the way SimPy's ``BaseResource`` re-runs ``_do_put`` / ``_do_get`` on
every put and get. Between two re-plans every rate is constant, so one timer per fabric
(for the soonest completion) is all the event list holds; stale timers are ignored by a
generation counter.

A flow completes at the time its last byte was planned to arrive. The timer that was
planned for it finishes it by identity, never by testing its remaining bytes against an
absolute tolerance: at large clock values one ulp of ``env.now`` is worth more bytes
than any fixed epsilon, and a residue left by rounding would re-plan a zero-length timer
forever.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from simulator.hardware.profiles import LinkProfile

INF = float("inf")


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """What a flow crosses: a key naming the physical thing, and its byte rate."""

    key: str
    bandwidth: float
    """Bytes per second in this direction (after protocol efficiency)."""
    owner: str | None = None
    """Instance whose outgoing hand-offs this resource carries (link faults target it)."""


@dataclass(frozen=True, slots=True)
class FlowSpec:
    resources: tuple[ResourceSpec, ...]
    nbytes: float
    cap: float = INF
    """Largest rate this flow may take, bytes per second."""


@dataclass(frozen=True)
class TransferPath:
    """How a hand-off between two instances travels."""

    key: str
    """Label in the transfers frame: the hops (slowest first when host-staged) and source."""
    profile: LinkProfile
    """The slowest hop of the route."""
    streams: tuple[tuple[tuple[ResourceSpec, ...], float], ...]
    """Each stream's resources and its bytes per prompt token."""
    fixed_s: float
    """Set-up overhead and latency of every hop, paid once per hand-off."""
    conversion_s_per_byte: float = 0.0
    conversion_s_per_token: float = 0.0

    @property
    def bytes_per_token(self) -> float:
        """Bytes on the wire per prompt token, every replicated copy counted."""
        return sum(b for _, b in self.streams)


@dataclass(slots=True, eq=False)
class Resource:
    key: str
    base: float
    factor: float = 1.0
    dead: bool = False
    flows: dict[Flow, None] = field(default_factory=dict)

    @property
    def capacity(self) -> float:
        return self.base * self.factor


@dataclass(slots=True, eq=False)
class Flow:
    resources: tuple[Resource, ...]
    remaining: float
    cap: float
    done: simpy.Event
    rate: float = 0.0


class Fabric:
    """Every KV byte of a run crosses this object; see the module docstring."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env
        self.resources: dict[str, Resource] = {}
        self._owned: dict[str, set[str]] = {}
        self._factor: dict[str, float] = {}
        self._dead: set[str] = set()  # owners whose resources died for good
        self._flows: dict[Flow, None] = {}  # ordered: ties finish in start order
        self._gen = 0
        self._last = env.now

    @property
    def active(self) -> int:
        return len(self._flows)

    def resource(self, spec: ResourceSpec) -> Resource:
        res = self.resources.get(spec.key)
        if res is None:
            res = Resource(spec.key, spec.bandwidth)
            if spec.owner is not None:
                # A resource first used after its owner's fault shares that fault.
                res.factor = self._factor.get(spec.owner, 1.0)
                res.dead = spec.owner in self._dead
            self.resources[spec.key] = res
        if spec.owner is not None:
            self._owned.setdefault(spec.owner, set()).add(spec.key)
        return res

    # ----- flows -------------------------------------------------------------------
    def start(self, specs: list[FlowSpec]) -> list[Flow]:
        """Start flows now (one re-plan for all); each ``done`` fires True or False."""
        out: list[Flow] = []
        added = False
        for spec in specs:
            resources = tuple(self.resource(r) for r in spec.resources if r.bandwidth < INF)
            flow = Flow(resources, float(spec.nbytes), spec.cap, self.env.event())
            out.append(flow)
            if any(r.dead for r in resources):
                flow.done.succeed(False)
                continue
            if flow.remaining <= 0 or (not resources and spec.cap == INF):
                flow.done.succeed(True)
                continue
            if not added:
                self._advance()
                added = True
            self._flows[flow] = None
            for r in resources:
                r.flows[flow] = None
        if added:
            self._replan()
        return out

    def send(self, flows: list[FlowSpec], fixed_s: float = 0.0
             ) -> Generator[simpy.Event, Any, bool]:
        """Process body: wait ``fixed_s`` (set-up + latency), then move every flow.

        Returns False if a resource on the way died for good before the bytes got through.
        """
        if fixed_s:
            yield self.env.timeout(fixed_s)
        started = self.start(flows)
        results = yield self.env.all_of([f.done for f in started])
        return all(bool(v) for v in results.values())

    def cancel(self, flow: Flow) -> None:
        """Stop a flow whose bytes are no longer wanted; its ``done`` fires with False."""
        if flow not in self._flows:
            return
        self._advance()
        self._drop(flow)
        flow.done.succeed(False)
        self._replan()

    def uncap(self, flows: list[Flow]) -> None:
        """Lift the cap of running flows (a layer-wise stream once the prefill is done).

        A flow that crosses no finite resource is then done at once.
        """
        self._advance()
        for flow in flows:
            flow.cap = INF
            if not flow.resources and flow in self._flows:
                self._drop(flow)
                flow.done.succeed(True)
        self._replan()

    # ----- faults ----------------------------------------------------------------
    def degrade(self, owner: str, factor: float, *, for_good: bool = False) -> None:
        """Scale the resources ``owner`` sends through; factor 0 for good kills them."""
        self._advance()
        self._factor[owner] = factor
        if factor <= 0 and for_good:
            self._dead.add(owner)
        killed: list[Flow] = []
        for key in sorted(self._owned.get(owner, ())):
            res = self.resources[key]
            res.factor = factor
            if factor <= 0 and for_good:
                res.dead = True
                killed.extend(res.flows)
        for flow in dict.fromkeys(killed):  # each once, in a deterministic order
            if flow in self._flows:
                self._drop(flow)
                flow.done.succeed(False)
        self._replan()

    # ----- the allocation ------------------------------------------------------------
    def _drop(self, flow: Flow) -> None:
        self._flows.pop(flow, None)
        for r in flow.resources:
            r.flows.pop(flow, None)

    def _advance(self) -> None:
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            for flow in self._flows:
                flow.remaining -= flow.rate * dt
        self._last = now

    def _allocate(self) -> None:
        """Max-min fair rates with per-flow caps (progressive filling)."""
        left: dict[Resource, float] = {}
        users: dict[Resource, int] = {}
        for flow in self._flows:
            for r in flow.resources:
                left[r] = r.capacity
                users[r] = users.get(r, 0) + 1
        unfrozen = dict(self._flows)
        while unfrozen:
            level = min((flow.cap for flow in unfrozen), default=INF)
            for r, n in users.items():
                if n:
                    level = min(level, max(0.0, left[r]) / n)
            assert level < INF, "a flow with neither a cap nor a finite resource"
            full = {r for r, n in users.items() if n and max(0.0, left[r]) / n <= level}
            frozen = [f for f in unfrozen
                      if f.cap <= level or any(r in full for r in f.resources)]
            for flow in frozen:
                unfrozen.pop(flow)
                flow.rate = level
                for r in flow.resources:
                    left[r] -= level
                    users[r] -= 1

    def _replan(self) -> None:
        self._gen += 1
        if not self._flows:
            return
        self._allocate()
        soonest = INF
        for flow in self._flows:
            if flow.rate > 0:
                soonest = min(soonest, flow.remaining / flow.rate)
        if soonest == INF:  # everything stalled on a resource that is down
            return
        soonest = max(0.0, soonest)
        gen = self._gen
        # The flows this timer is for: those due at the soonest time, or so close to it
        # that the clock cannot tell the two apart.
        due_at = self.env.now + soonest
        due = [f for f in self._flows if f.rate > 0
               and self.env.now + max(0.0, f.remaining / f.rate) <= due_at]
        self.env.timeout(soonest).callbacks.append(lambda _e: self._tick(gen, due))

    def _tick(self, gen: int, due: list[Flow]) -> None:
        if gen != self._gen:
            return
        self._advance()
        for flow in due:
            self._drop(flow)
            flow.done.succeed(True)
        self._replan()
