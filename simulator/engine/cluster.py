"""The cluster of one run: pools of instances, the router, faults and cancellations.

Built from resolved specs (cost models, KV capacities, link profiles), so this module
never reads a profile or a scenario file itself. The KV hand-offs of a disaggregated
cluster are :mod:`simulator.engine.handoff`'s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import simpy

from simulator.cost.speculative import Acceptance
from simulator.cost.step import InstanceCostModel
from simulator.engine.config import RouterSpec, SchedulerSpec
from simulator.engine.disagg_router import ConditionalRouter
from simulator.engine.fabric import Fabric
from simulator.engine.handoff import MIN_KEY_POLICIES, HandOff, TransferPlan, load_changed
from simulator.engine.instance import Instance
from simulator.engine.load_index import LoadIndex
from simulator.engine.priority import make_queue
from simulator.engine.recorder import Recorder
from simulator.engine.request import Request, State
from simulator.engine.router import POLICIES, RouterState
from simulator.engine.step_prices import PriceTables
from simulator.engine.tenants import Admission
from simulator.engine.tier_io import TierRoute
from simulator.engine.tier_loads import TierLoader

Role = Literal["colocated", "prefill", "decode"]

INDEX_FROM = 8
"""Pools of at least this many instances route a least-* policy through a maintained
:class:`~simulator.engine.load_index.LoadIndex` (the same picks as scanning them all)."""

INSTANCE_KEYS: dict[str, Callable[[Instance], tuple[float, ...]]] = {
    "least_outstanding": Instance.outstanding_key,
    "least_tokens": Instance.tokens_key,
    "least_kv": Instance.kv_key,
}
"""The keys of :data:`~simulator.engine.router.MIN_KEYS` as the instance reads them itself
(one gated call a read): a load index reads these, the same tuples."""

__all__ = ["INDEX_FROM", "MIN_KEY_POLICIES", "Cluster", "InstanceSpec", "Role", "TransferPlan"]


@dataclass(frozen=True)
class InstanceSpec:
    name: str
    pool: str
    role: Role
    cost: InstanceCostModel
    kv_blocks: int
    block_size: int
    scheduler: SchedulerSpec
    kv_bytes_per_token: float
    """KV bytes of one token across the whole instance (all ranks), for hand-offs."""
    active: bool = True
    """Powered and serving at t=0 (autoscaled pools start some instances off)."""
    cold_start_s: float = 0.0
    """Time from a scale-out decision until the instance serves (weights load + start-up)."""
    devices: int = 1
    max_num_seqs_per: str = "engine"
    """Whether ``max_num_seqs`` caps the instance (``engine``) or each of its pp micro-batch
    schedulers (``virtual_engine``)."""
    first_token: str = "decode_recompute"
    """Prefill role: whether the prefill emits the client's first token with the KV
    (``forwarded_after_transfer``) or the decode side recomputes it (``decode_recompute``)."""
    speculative: Acceptance | None = None
    """Tokens a decoding sequence advances per step under speculative decoding / MTP."""
    tiers: tuple[TierRoute, ...] = ()
    """KV tiers below HBM, fastest first (``scheduler.kv_tiers``)."""


@dataclass
class Cluster:
    env: simpy.Environment
    specs: list[InstanceSpec]
    router: RouterSpec
    router_state: RouterState
    recorder: Recorder
    transfer: TransferPlan = field(default_factory=TransferPlan)
    on_finished: Callable[[Request], None] = lambda _r: None
    fast_forward: bool = True
    prefix_block_tokens: int = 512
    speculation_rng: np.random.Generator | None = None
    """Draws accepted tokens per step; each speculative instance gets its own child."""
    admission: Admission | None = None
    """Per-class admission limits (request classes with ``max_outstanding``)."""

    def __post_init__(self) -> None:
        self.fabric = Fabric(self.env)
        self.tiers = TierLoader(self.env, self.fabric, [s.tiers for s in self.specs],
                                self.prefix_block_tokens, self._route)
        self.instances: list[Instance] = []
        prices = PriceTables()  # instances priced alike share their kept prices
        for i, spec in enumerate(self.specs):
            inst = Instance(
                self.env, i, spec.name, spec.pool, spec.role, spec.cost, spec.kv_blocks,
                spec.block_size, spec.scheduler, self.recorder, self._prefilled,
                self._complete, self._kv_freed, self.fast_forward, self.prefix_block_tokens,
                first_token=spec.first_token, max_num_seqs_per=spec.max_num_seqs_per,
                speculative=spec.speculative,
                speculation_rng=self._child_rng() if spec.speculative is not None else None,
                prices=prices.for_cost(spec.cost),
            )
            inst.attach_tiers(self.tiers.below(i))
            if not spec.active:
                inst.switch_off()
            self.instances.append(inst)
        self.tiers.bind(self.instances)
        self.by_name = {x.name: x for x in self.instances}
        self.entry = [x for x in self.instances if x.role in ("colocated", "prefill")]
        self.decoders = [x for x in self.instances if x.role == "decode"]
        self.pending_entry = make_queue(self.router.queue_policy)
        self.retries = 0
        self._entry_policy = POLICIES[self.router.policy]
        self._entry_index = self._load_index(self.entry, self.router.policy)
        decode_index = self._load_index(self.decoders, self.router.decode_policy)
        if self.router.dispatch == "central_queue" or self.router.conditional is not None:
            self._entry_index = None  # those paths need every candidate
        for index, pool in ((self._entry_index, self.entry), (decode_index, self.decoders)):
            for inst in pool if index is not None else ():
                inst.on_load_change = index.mark  # type: ignore[union-attr]
        self.handoff = HandOff(self.env, self.fabric, self.recorder, self.transfer,
                               self.decoders, self.router.decode_policy, decode_index,
                               self.router_state, self.fail_request)
        if self.transfer.mode == "layerwise":
            for inst in self.instances:
                if inst.role == "prefill":
                    inst.on_prefill_start = self.handoff.prefill_started
        self._conditional = (ConditionalRouter(self.router.conditional, self._entry_policy,
                                               self.router_state)
                             if self.router.conditional is not None else None)

    def _load_index(self, pool: list[Instance], policy: str) -> LoadIndex[Instance] | None:
        """A load index for ``pool`` under ``policy``, where it picks exactly as a scan.

        The index needs every fall of a key announced; a jump's lazily booked KV only
        rises, except where a prefix cache or KV tier may evict while it books, so
        ``least_kv`` keeps scanning pools with those.
        """
        key = INSTANCE_KEYS.get(policy)
        if key is None or len(pool) < INDEX_FROM:
            return None
        if policy == "least_kv" and any(
                self.specs[x.index].scheduler.prefix_caching or self.specs[x.index].tiers
                for x in pool):
            return None
        return LoadIndex(pool, key)

    # ----- arrivals ------------------------------------------------------------------

    def _child_rng(self) -> np.random.Generator:
        parent = self.speculation_rng or np.random.default_rng(0)
        return np.random.default_rng(parent.integers(2**63))
    def submit(self, req: Request) -> None:
        self.recorder.requests.append(req)
        if self.admission is not None:
            shed = self.admission.admit(req)
            if shed is not None:
                req.move_to(State.SHED)
                req.reason = shed
                self._ended(req)
                return
        # Only instances that can ever hold the request may serve it: one that cannot
        # would keep it at its queue head for good.
        need = req.prompt_tokens + req.output_tokens
        sides = [("colocated or prefill", self.entry)]
        if self.decoders:
            sides.append(("decode", self.decoders))
        for side, pool in sides:
            if not any(x.can_ever_hold(req) for x in pool):
                req.move_to(State.REJECTED)
                most = max(x.kv_capacity_tokens for x in pool)
                req.reason = (f"prompt+output {need} tokens exceed the KV capacity of every "
                              f"{side} instance (largest: {most} tokens)")
                self._ended(req)
                return
        self._route(req)

    def _route(self, req: Request) -> None:
        if self.router.dispatch == "central_queue":
            candidates = [x for x in self.entry if x.has_slot() and x.can_ever_hold(req)]
            if not candidates or self.pending_entry:  # nobody overtakes the queue's order
                req.move_to(State.QUEUED)
                self.pending_entry.append(req)
                return
        elif self._entry_index is not None:
            pick = self._entry_index.pick(lambda x: x.accepting and x.can_ever_hold(req))
            if pick is not None:
                self.tiers.enqueue(pick, req)
                return
            candidates = []
        else:
            candidates = [x for x in self.entry if x.accepting and x.can_ever_hold(req)]
        if self._conditional is not None and self._route_local(req, candidates):
            return
        if not candidates:  # every entry instance is down or off: wait for one
            req.move_to(State.QUEUED)
            self.pending_entry.append(req)
            return
        if len(candidates) == 1 and self.router.policy in MIN_KEY_POLICIES:
            inst = candidates[0]  # the least of one: its key need not be read
        else:
            inst = self._entry_policy(candidates, req, self.router_state, "entry")  # type: ignore[assignment]
        self.tiers.enqueue(inst, req)

    def _route_local(self, req: Request, entry: list[Instance]) -> bool:
        """Conditional disaggregation (engine/disagg_router.py): enqueue ``req`` where it
        is to be prefilled, on a decode instance or a chosen prefill instance; False
        leaves the choice of a prefill instance to the entry policy."""
        local = [d for d in self.decoders if d.accepting and d.can_ever_hold(req)]
        if not local:
            return False
        queue = len(self.pending_entry) + sum(x.num_waiting for x in self.entry)
        assert self._conditional is not None
        where = self._conditional.place(req, local, entry, queue, self.handoff.path)
        if where is None:
            return False
        self.tiers.enqueue(where, req)
        return True

    def _pull(self, inst: Instance) -> None:
        """Central queue: hand waiting requests to ``inst`` while it has free slots."""
        while (self.pending_entry and inst.has_slot()
               and inst.can_ever_hold(self.pending_entry[0])):
            self.tiers.enqueue(inst, self.pending_entry.popleft())

    # ----- completions -----------------------------------------------------------------
    def _prefilled(self, src: Instance, req: Request) -> None:
        self.handoff.prefilled(src, req)

    def _complete(self, inst: Instance, req: Request) -> None:
        load_changed(inst)
        self.handoff.kv_location.pop(req.id, None)
        self._ended(req)

    def fail_request(self, req: Request, reason: str) -> None:
        req.move_to(State.FAILED)
        req.reason = reason
        self.handoff.kv_location.pop(req.id, None)
        self._ended(req)

    def _kv_freed(self, inst: Instance) -> None:
        load_changed(inst)
        if inst.role != "decode":
            if self.router.dispatch == "central_queue" and self.pending_entry:
                self._pull(inst)
            return
        if self.handoff.pending:
            self.handoff.drain()

    def _ended(self, req: Request) -> None:
        """Every way a request admitted here ends passes through this one place."""
        if self.admission is not None:
            self.admission.release(req)
        self.on_finished(req)

    # ----- cancellation (client timeouts) -------------------------------------------
    def cancel(self, req: Request, reason: str) -> None:
        """The client gave up: stop ``req`` wherever it is and free its KV everywhere.

        Queued at the router: dropped. On an instance (waiting, prefilling, decoding, or
        its KV held for a hand-off): :meth:`Instance.cancel`. In a hand-off: its flows
        stop and the decode side's reservation is freed (booked on a stand-in while a
        layer-wise stream runs during the prefill).
        """
        if req.ended:
            return
        if req in self.pending_entry:
            self.pending_entry.remove(req)
        handoff = self.handoff
        handoff.pending = deque((r, s) for r, s in handoff.pending if r is not req)
        holder = handoff.drop_flows(req)
        pair = handoff.in_transfer.pop(req.id, None)
        if pair is not None:
            pair[1].cancel_reservation(holder)
        for inst in self.instances:
            if inst.holds(req):
                inst.cancel(req)
        handoff.kv_location.pop(req.id, None)
        req.move_to(State.CANCELLED)
        req.reason, req.cancel_s = reason, self.env.now
        self._ended(req)

    # ----- faults ------------------------------------------------------------------
    def fail_instance(self, inst: Instance) -> None:
        """``inst`` dies: its KV is gone; its requests are prefilled or placed again."""
        if not inst.alive:
            return
        lost, held, reserved = inst.fail()
        self.recorder.event(self.env.now, "instance_failure",
                            f"{inst.name}: {len(lost)} running/queued, {len(held)} held, "
                            f"{len(reserved)} incoming")
        handoff = self.handoff
        # Hand-offs waiting for decode room from the dead prefill instance lost their KV.
        keep: deque[tuple[Request, Instance]] = deque()
        for req, src in handoff.pending:
            if src is not inst:
                keep.append((req, src))
            elif req not in held:
                held.append(req)
        handoff.pending = keep
        for req in lost + held:
            holder = handoff.drop_flows(req)
            pair = handoff.in_transfer.pop(req.id, None)
            if pair is not None and pair[1] is not inst:
                pair[1].cancel_reservation(holder)
            self._restart(req)
        for req in reserved:  # KV still on the prefill side: send it elsewhere
            early = handoff.streaming.get(req.id)
            handoff.drop_flows(req)
            pair = handoff.in_transfer.pop(req.id, None)
            if early is not None and pair is not None:
                # A layer-wise stream to the dead instance: the request is still being
                # prefilled (``req`` is its stand-in); it hands off after the prefill.
                early[2].decode_instance = -1
                handoff.kv_location.pop(req.id, None)
                continue
            req.restarts += 1
            self.retries += 1
            if pair is None or not pair[0].alive:
                self._restart(req, counted=True)
                continue
            if not handoff.place(req, pair[0]):
                handoff.pending.append((req, pair[0]))
        if inst.role == "decode":
            handoff.drain()

    def _restart(self, req: Request, counted: bool = False) -> None:
        """Send ``req`` back to be prefilled (prompt + tokens generated so far)."""
        if not counted:
            req.restarts += 1
            self.retries += 1
        req.reset_for_recompute(preempted=False)
        req.move_to(State.QUEUED)
        req.decode_instance = -1
        self.handoff.kv_location.pop(req.id, None)
        self._route(req)

    def waiting_for_instance(self) -> bool:
        """Whether a request waits at the router, or for decode room, for an instance."""
        return bool(self.pending_entry) or bool(self.handoff.pending)

    def stop(self) -> None:
        """The clock has stopped: every instance books what ended by now (no more events
        run after this)."""
        for inst in self.instances:
            inst.stop()

    def recover_instance(self, inst: Instance) -> None:
        if inst.alive:
            return
        inst.recover()
        self.recorder.event(self.env.now, "instance_recovery", inst.name)
        self.flush_pending()

    def flush_pending(self) -> None:
        waiting, self.pending_entry = self.pending_entry, make_queue(self.router.queue_policy)
        for req in waiting:
            self._route(req)
        self.handoff.drain()

    def degrade_links(self, source: str, factor: float, for_good: bool) -> None:
        """Scale what ``source`` sends through (its NICs, scale-up ports, host lanes)."""
        self.fabric.degrade(source, factor, for_good=for_good)

    @property
    def link_names(self) -> list[str]:
        return list(self.handoff.link_labels)
