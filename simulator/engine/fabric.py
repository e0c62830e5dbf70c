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

A *transfer* (:meth:`Fabric.transfer`, a hand-off's rank streams) reports its end once,
by a callback. One that starts on an idle fabric with all its flows due at the first
completion is one timer while it stays alone, at the time the re-plan would give (the
same float operations; its rates, a pure function of its routes, caps and speeds, kept).
When anything else happens on the fabric (a flow starts or is cancelled, a cap is
lifted, a resource changes speed) it joins the flow table with the bytes and rates it
started with and the clock of its start: the next re-plan advances it as if it had
been there all along.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import simpy

from simulator.engine.flow_specs import INF, FlowSpec, ResourceSpec, TransferPath

__all__ = ["INF", "Fabric", "Flow", "FlowSpec", "ResourceSpec", "Transfer", "TransferPath"]


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
    done: simpy.Event | None
    """Fires True or False when the flow ends (None: a transfer's flow, see ``group``)."""
    rate: float = 0.0
    group: Transfer | None = None
    result: bool | None = None
    """True once through, False once cancelled or killed, None while it runs."""


@dataclass(slots=True, eq=False)
class Transfer:
    """Flows whose end is reported once, when the last is done: ``on_done(all got through)``."""

    on_done: Callable[[bool], None]
    left: int = 0
    ok: bool = True
    flows: list[Flow] = field(default_factory=list)


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
        self._lone: Transfer | None = None  # a transfer alone on the fabric, not re-planned
        # Rates of a transfer alone on the fabric, by its flows' resources and caps (the
        # allocation is a pure function of those and of the resources' speeds).
        self._alone_rates: dict[tuple[Any, ...], tuple[float, ...]] = {}
        # The resources of each route (routes are built once per instance pair), by id.
        self._routes: dict[int, tuple[tuple[ResourceSpec, ...], tuple[Resource, ...]]] = {}

    @property
    def active(self) -> int:
        """Flows moving bytes now."""
        lone = self._lone
        return len(self._flows) + (sum(f.result is None for f in lone.flows) if lone else 0)

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
    def start(self, specs: list[FlowSpec], *, events: bool = True) -> list[Flow]:
        """Start flows now (one re-plan for all); each ``done`` fires True or False.

        ``events=False``: no ``done`` events (nothing waits on these flows as such).
        """
        return self._open([self._flow(spec, events) for spec in specs])

    def transfer(self, specs: list[FlowSpec], on_done: Callable[[bool], None],
                 joined: Sequence[Flow] = ()) -> list[Flow]:
        """Start flows now as one transfer; ``on_done(ok)`` runs (at the time the last of
        them and of the running ``joined`` flows ends: from the timer of a lone transfer,
        else as an event) with whether all got through. Returns the new flows."""
        group = Transfer(on_done)
        for flow in joined:
            flow.group = group
            if flow.result is None:
                group.left += 1
            else:
                group.ok = group.ok and flow.result
        flows = [self._flow(spec, False) for spec in specs]
        group.left += len(flows)
        group.flows = flows
        for flow in flows:
            flow.group = group
        if group.left == 0:
            self._report(group)
        elif not self._flows and self._lone is None and self._alone(group):
            return flows
        return self._open(flows)

    def _flow(self, spec: FlowSpec, event: bool) -> Flow:
        route = self._routes.get(id(spec.resources))
        if route is None or route[0] is not spec.resources:
            route = (spec.resources,
                     tuple(self.resource(r) for r in spec.resources if r.bandwidth < INF))
            self._routes[id(spec.resources)] = route
        resources = route[1]
        return Flow(resources, float(spec.nbytes), spec.cap,
                    self.env.event() if event else None)

    def _open(self, flows: list[Flow]) -> list[Flow]:
        added = False
        for flow in flows:
            if any(r.dead for r in flow.resources):
                self._finish(flow, False)
                continue
            if flow.remaining <= 0 or (not flow.resources and flow.cap == INF):
                self._finish(flow, True)
                continue
            if not added:
                self._advance()
                added = True
            self._flows[flow] = None
            for r in flow.resources:
                r.flows[flow] = None
        if added:
            self._replan()
        return flows

    def _alone(self, group: Transfer) -> bool:
        """Start ``group`` on an idle fabric as one timer, if its flows all end together
        at the first completion the re-plan would plan; False leaves it to the re-plan."""
        flows = group.flows
        uncapped = True
        for flow in flows:
            if flow.remaining <= 0 or not flow.resources:
                return False
            for r in flow.resources:
                if r.dead:
                    return False
            if flow.cap != INF:
                uncapped = False
        # Kept for uncapped flows only: caps (a stream's production rate) rarely repeat.
        key = tuple([f.resources for f in flows]) if uncapped else None
        rates = self._alone_rates.get(key) if key is not None else None
        if rates is None:
            self._allocate(dict.fromkeys(flows))
            rates = tuple([f.rate for f in flows])
            if key is not None:
                self._alone_rates[key] = rates
        # As _replan computes it; bytes and rates are positive here, so its max(0, .) and
        # rate > 0 tests hold.
        soonest = INF
        for flow, rate in zip(flows, rates, strict=True):
            flow.rate = rate
            if rate > 0 and flow.remaining / rate < soonest:
                soonest = flow.remaining / rate
        if soonest == INF:
            return False
        now = self.env.now
        due_at = now + soonest
        for flow in flows:
            if not (flow.rate > 0 and now + flow.remaining / flow.rate <= due_at):
                return False
        self._last = now  # what an advance over the (empty) flow table does
        self._gen += 1
        self._lone = group
        self.env.timeout(soonest).callbacks.append(lambda _e: self._lone_tick(group))
        return True

    def _lone_tick(self, group: Transfer) -> None:
        if self._lone is not group:
            return  # it joined the flow table: the re-plans time it now
        self._lone = None
        self._last = self.env.now
        self._gen += 1
        for flow in group.flows:
            flow.result = True
        group.left = 0
        # Reported by a plain call: the fabric is settled here (nothing is left to plan),
        # and this timer is the only event of the transfer at its end, so the report runs
        # at the same time as the event :meth:`_report` would schedule, ahead of the events
        # only a coincidence of float times could put between the two.
        group.on_done(group.ok)

    def _join_lone(self) -> None:
        """The lone transfer's flows enter the flow table as they started (see the module
        docstring): bytes and rates of its start, ``_last`` still its start time."""
        group, self._lone = self._lone, None
        assert group is not None
        for flow in group.flows:
            self._flows[flow] = None
            for r in flow.resources:
                r.flows[flow] = None

    def _finish(self, flow: Flow, ok: bool) -> None:
        flow.result = ok
        if flow.done is not None:
            flow.done.succeed(ok)
        group = flow.group
        if group is not None:
            group.left -= 1
            group.ok = group.ok and ok
            if group.left == 0:
                self._report(group)

    def _report(self, group: Transfer) -> None:
        event = self.env.event()
        event.callbacks.append(lambda _e: group.on_done(group.ok))
        event.succeed()

    def send(self, flows: list[FlowSpec], fixed_s: float = 0.0
             ) -> Generator[simpy.Event, Any, bool]:
        """Process body: wait ``fixed_s`` (set-up + latency), then move every flow.

        Returns False if a resource on the way died for good before the bytes got through.
        """
        if fixed_s:
            yield self.env.timeout(fixed_s)
        started = self.start(flows)
        results = yield self.env.all_of([f.done for f in started if f.done is not None])
        return all(bool(v) for v in results.values())

    def cancel(self, flow: Flow) -> None:
        """Stop a flow whose bytes are no longer wanted; its ``done`` fires with False."""
        if self._lone is not None and flow.group is self._lone:
            self._join_lone()
        if flow not in self._flows:
            return
        self._advance()
        self._drop(flow)
        self._finish(flow, False)
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
                self._finish(flow, True)
        self._replan()

    # ----- faults ----------------------------------------------------------------
    def degrade(self, owner: str, factor: float, *, for_good: bool = False) -> None:
        """Scale the resources ``owner`` sends through; factor 0 for good kills them."""
        self._advance()
        self._alone_rates.clear()  # speeds change
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
                self._finish(flow, False)
        self._replan()

    # ----- the allocation ------------------------------------------------------------
    def _drop(self, flow: Flow) -> None:
        self._flows.pop(flow, None)
        for r in flow.resources:
            r.flows.pop(flow, None)

    def _advance(self) -> None:
        if self._lone is not None:
            self._join_lone()
        now = self.env.now
        dt = now - self._last
        if dt > 0:
            for flow in self._flows:
                flow.remaining -= flow.rate * dt
        self._last = now

    def _allocate(self, flows: dict[Flow, None]) -> None:
        """Max-min fair rates of ``flows`` with per-flow caps (progressive filling).

        Each round, every resource still shared by unfrozen flows offers its fair share
        (what is left of it, at least 0, over those flows); the level is the least share
        or cap; the flows at their cap or crossing a resource whose share is the level
        freeze at it, and their rate is taken off what their resources have left.
        """
        left: dict[Resource, float] = {}
        users: dict[Resource, int] = {}
        shared = False
        for flow in flows:
            for r in flow.resources:
                n = users.get(r)
                if n is None:
                    left[r] = r.capacity
                    users[r] = 1
                else:
                    users[r] = n + 1
                    shared = True
        if not shared:
            _unshared(flows, left)
            return
        _fill(flows, left, users)

    def _replan(self) -> None:
        self._gen += 1
        if not self._flows:
            return
        self._allocate(self._flows)
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
            self._finish(flow, True)
        self._replan()


def _unshared(flows: dict[Flow, None], left: dict[Resource, float]) -> None:
    """:meth:`Fabric._allocate` where no two flows cross one resource (most re-plans).

    A flow's resources then offer it their whole capacity (at least 0) until it freezes,
    as no other flow takes from them, and progressive filling freezes it when the level
    reaches the least of its cap and those capacities: that least is its rate, the same
    float (tests/test_fabric.py checks it against :func:`_fill`).
    """
    for flow in flows:
        level = flow.cap
        for r in flow.resources:
            share = left[r] if left[r] > 0.0 else 0.0
            if share < level:  # noqa: PLR1730 (a comparison: no call per resource)
                level = share
        assert level < INF, "a flow with neither a cap nor a finite resource"
        flow.rate = level


def _fill(flows: dict[Flow, None], left: dict[Resource, float],
          users: dict[Resource, int]) -> None:
    """Progressive filling of :meth:`Fabric._allocate`: ``left`` holds each resource's
    capacity and ``users`` the flows crossing it."""
    # The fair share of every resource still shared by unfrozen flows; a round changes
    # only those of the resources its frozen flows cross.
    share = {r: (left[r] if left[r] > 0.0 else 0.0) / n for r, n in users.items()}
    unfrozen = list(flows)
    while unfrozen:
        level = min([flow.cap for flow in unfrozen] + list(share.values()))
        assert level < INF, "a flow with neither a cap nor a finite resource"
        keep: list[Flow] = []
        touched: dict[Resource, None] = {}
        for flow in unfrozen:
            frozen = flow.cap <= level
            if not frozen:
                for r in flow.resources:
                    if share[r] <= level:
                        frozen = True
                        break
            if not frozen:
                keep.append(flow)
                continue
            flow.rate = level
            for r in flow.resources:
                left[r] -= level
                users[r] -= 1
                touched[r] = None
        for r in touched:
            n = users[r]
            if n:
                share[r] = (left[r] if left[r] > 0.0 else 0.0) / n
            else:
                del share[r]
        unfrozen = keep
