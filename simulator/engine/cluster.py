"""The cluster of one run: pools of instances, the router, KV hand-offs over links.

Built from resolved specs (cost models, KV capacities, link profiles), so this module
never reads a profile or a scenario file itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import simpy

from simulator.cost.batch import BatchShape
from simulator.cost.speculative import Acceptance
from simulator.cost.step import InstanceCostModel
from simulator.engine.config import RouterSpec, SchedulerSpec
from simulator.engine.disagg_router import ConditionalRouter
from simulator.engine.fabric import INF, Fabric, Flow, FlowSpec, TransferPath
from simulator.engine.instance import Instance
from simulator.engine.load_index import LoadIndex
from simulator.engine.priority import make_queue
from simulator.engine.recorder import Recorder
from simulator.engine.request import Request, State
from simulator.engine.router import MIN_KEYS, POLICIES, RouterState
from simulator.engine.tenants import Admission
from simulator.engine.tier_io import TierRoute
from simulator.engine.tier_loads import TierLoader

Role = Literal["colocated", "prefill", "decode"]

INDEX_FROM = 8
"""Pools of at least this many instances route a least-* policy through a maintained
:class:`~simulator.engine.load_index.LoadIndex` (the same picks as scanning them all)."""

# Policies that pick the instance with the smallest key and keep no state between calls.
_MIN_KEY_POLICIES = frozenset({"least_kv", "least_outstanding", "least_tokens"})


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
class TransferPlan:
    mode: Literal["bulk", "layerwise"] = "bulk"
    path: Callable[[int, int], TransferPath] | None = None
    """Route of a hand-off between two instances (by index), see runner/paths.py."""
    num_layers: int = 1


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
        for i, spec in enumerate(self.specs):
            inst = Instance(
                self.env, i, spec.name, spec.pool, spec.role, spec.cost, spec.kv_blocks,
                spec.block_size, spec.scheduler, self.recorder, self._prefilled,
                self._complete, self._kv_freed, self.fast_forward, self.prefix_block_tokens,
                first_token=spec.first_token, max_num_seqs_per=spec.max_num_seqs_per,
                speculative=spec.speculative,
                speculation_rng=self._child_rng() if spec.speculative is not None else None,
            )
            inst.attach_tiers(self.tiers.below(i))
            if not spec.active:
                inst.switch_off()
            self.instances.append(inst)
        if self.transfer.mode == "layerwise":
            for inst in self.instances:
                if inst.role == "prefill":
                    inst.on_prefill_start = self._prefill_started
        self.tiers.bind(self.instances)
        self.by_name = {x.name: x for x in self.instances}
        self.entry = [x for x in self.instances if x.role in ("colocated", "prefill")]
        self.decoders = [x for x in self.instances if x.role == "decode"]
        self.pending_decode: deque[tuple[Request, Instance]] = deque()
        self.pending_entry = make_queue(self.router.queue_policy)
        self.in_transfer: dict[int, tuple[Instance, Instance]] = {}
        self.link_labels: dict[str, int] = {}
        # Flows carrying each request's KV now; a layer-wise stream opens them at prefill
        # start (with its destination reserved then), a bulk hand-off after the prefill.
        self.flows: dict[int, list[Flow]] = {}
        self.streaming: dict[int, tuple[Instance, Request, Request]] = {}
        self.kv_location: dict[int, int] = {}
        self.retries = 0
        self._entry_policy = POLICIES[self.router.policy]
        self._decode_policy = POLICIES[self.router.decode_policy]
        self._entry_index = self._load_index(self.entry, self.router.policy)
        self._decode_index = self._load_index(self.decoders, self.router.decode_policy)
        if self.router.dispatch == "central_queue" or self.router.conditional is not None:
            self._entry_index = None  # those paths need every candidate
        for index, pool in ((self._entry_index, self.entry),
                            (self._decode_index, self.decoders)):
            for inst in pool if index is not None else ():
                inst.on_load_change = index.mark  # type: ignore[union-attr]
        self._conditional = (ConditionalRouter(self.router.conditional, self._entry_policy,
                                               self.router_state)
                             if self.router.conditional is not None else None)

    def _load_index(self, pool: list[Instance], policy: str) -> LoadIndex[Instance] | None:
        """A load index for ``pool`` under ``policy``, where it picks exactly as a scan.

        The index needs every fall of a key announced; a jump's lazily booked KV only
        rises, except where a prefix cache or KV tier may evict while it books, so
        ``least_kv`` keeps scanning pools with those.
        """
        key = MIN_KEYS.get(policy)
        if key is None or len(pool) < INDEX_FROM:
            return None
        if policy == "least_kv" and any(
                self.specs[x.index].scheduler.prefix_caching or self.specs[x.index].tiers
                for x in pool):
            return None
        return LoadIndex(pool, key)  # type: ignore[arg-type]

    @staticmethod
    def _load_changed(inst: Instance) -> None:
        if inst.on_load_change is not None:
            inst.on_load_change(inst)

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
        inst = self._entry_policy(candidates, req, self.router_state, "entry")
        self.tiers.enqueue(inst, req)  # type: ignore[arg-type]

    def _route_local(self, req: Request, entry: list[Instance]) -> bool:
        """Conditional disaggregation (engine/disagg_router.py): enqueue ``req`` where it
        is to be prefilled, on a decode instance or a chosen prefill instance; False
        leaves the choice of a prefill instance to the entry policy."""
        local = [d for d in self.decoders if d.accepting and d.can_ever_hold(req)]
        if not local:
            return False
        queue = len(self.pending_entry) + sum(x.num_waiting for x in self.entry)
        assert self._conditional is not None
        where = self._conditional.place(req, local, entry, queue, self._path)
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
    def _complete(self, inst: Instance, req: Request) -> None:
        self._load_changed(inst)
        self.kv_location.pop(req.id, None)
        self._ended(req)

    def fail_request(self, req: Request, reason: str) -> None:
        req.move_to(State.FAILED)
        req.reason = reason
        self.kv_location.pop(req.id, None)
        self._ended(req)

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
        self.pending_decode = deque((r, s) for r, s in self.pending_decode if r is not req)
        holder = self._drop_flows(req)
        pair = self.in_transfer.pop(req.id, None)
        if pair is not None:
            pair[1].cancel_reservation(holder)
        for inst in self.instances:
            if inst.holds(req):
                inst.cancel(req)
        self.kv_location.pop(req.id, None)
        req.move_to(State.CANCELLED)
        req.reason, req.cancel_s = reason, self.env.now
        self._ended(req)

    # ----- hand-off (disaggregated) --------------------------------------------------
    def _prefill_started(self, src: Instance, req: Request) -> None:
        """Layer-wise: reserve a destination now and stream each layer's KV as it is made.

        SGLang's P/D (``python/sglang/srt/disaggregation/decode.py``, the pre-allocation
        queue) and Mooncake reserve decode KV before the prefill runs, which is what lets
        layers leave while later ones compute. If no decode instance can reserve now, the
        hand-off starts after the prefill, like a bulk one: overlap is credited only while
        a destination was held.
        """
        dst = self._pick_decode(req)
        if dst is None:
            return
        # The request's block counts belong to the prefill side until its prefill ends, so
        # the early reservation is booked on a stand-in carrying the decode side's count.
        stand_in = Request(req.id, req.arrival_s, req.prompt_tokens, req.output_tokens)
        stand_in.generated = req.generated
        stand_in.block_hashes = req.block_hashes
        self._reserve(req, src, dst, stand_in)
        req.decode_cached_tokens = stand_in.decode_cached_tokens
        path = self._path(src, dst)
        tokens = req.prefill_target - req.decode_cached_tokens
        share = 1 - 1 / self.transfer.num_layers
        # A layer cannot leave before it is computed: cap the stream at the rate the
        # prefill produces it, as the cost model prices this prefill alone.
        seconds = src.cost.step(BatchShape.prefill(tokens, req.cached_tokens)).seconds
        specs = [FlowSpec(res, bpt * tokens * share,
                          bpt * tokens * share / seconds if seconds > 0 else INF)
                 for res, bpt in path.streams]
        self.flows[req.id] = self.fabric.start(specs)
        self.streaming[req.id] = (dst, stand_in, req)
        req.transfer_start_s = self.env.now

    def _prefilled(self, src: Instance, req: Request) -> None:
        self._load_changed(src)  # running -> held: one fewer outstanding
        req.transfer_wait_s = self.env.now
        early = self.streaming.pop(req.id, None)
        if early is not None:
            dst, stand_in, _ = early
            # The prefill has handed its blocks to src_blocks: the request itself now
            # carries the decode reservation.
            req.blocks = stand_in.blocks
            dst.rebind_reservation(req)
            self.env.process(self._transfer(req, src, dst, streamed=True))
            return
        if not self._place(req, src):
            self.pending_decode.append((req, src))

    def _pick_decode(self, req: Request) -> Instance | None:
        if self._decode_index is not None:
            return self._decode_index.pick(
                lambda d: d.accepting and d.can_ever_hold(req) and d.can_reserve(req))
        if self.router.decode_policy in _MIN_KEY_POLICIES:
            # A least-something policy picks the same instance among those that fit as
            # among all, whenever its pick fits: try that first, filter only if not.
            serving = [d for d in self.decoders if d.accepting and d.can_ever_hold(req)]
            if serving:
                pick = self._decode_policy(serving, req, self.router_state, "decode")
                if pick.can_reserve(req):  # type: ignore[attr-defined]
                    return pick  # type: ignore[return-value]
        fits = [d for d in self.decoders
                if d.accepting and d.can_ever_hold(req) and d.can_reserve(req)]
        if not fits:
            return None
        return self._decode_policy(fits, req, self.router_state, "decode")  # type: ignore[return-value]

    def _reserve(self, req: Request, src: Instance, dst: Instance,
                 holder: Request | None = None) -> None:
        ok = dst.try_reserve(holder or req)
        assert ok
        req.decode_instance = dst.index
        req.decode_admit_s = self.env.now
        self.kv_location[req.id] = dst.index
        self.in_transfer[req.id] = (src, dst)

    def _place(self, req: Request, src: Instance) -> bool:
        dst = self._pick_decode(req)
        if dst is None:
            return False
        self._reserve(req, src, dst)
        self.env.process(self._transfer(req, src, dst))
        return True

    def _kv_freed(self, inst: Instance) -> None:
        self._load_changed(inst)
        if inst.role != "decode":
            if self.router.dispatch == "central_queue" and self.pending_entry:
                self._pull(inst)
            return
        if self.pending_decode:
            self._drain_pending_decode()

    def _drain_pending_decode(self) -> None:
        while self.pending_decode:
            req, src = self.pending_decode[0]
            if not self._place(req, src):
                break
            self.pending_decode.popleft()

    def _path(self, src: Instance, dst: Instance) -> TransferPath:
        assert self.transfer.path is not None
        path = self.transfer.path(src.index, dst.index)
        self.link_labels.setdefault(path.key, len(self.link_labels))
        return path

    def _drop_flows(self, req: Request) -> Request:
        """The request's KV no longer needs to move (a failure sent it elsewhere).

        Returns what holds its decode reservation (a stand-in while it still prefills).
        """
        early = self.streaming.pop(req.id, None)
        for flow in self.flows.pop(req.id, ()):
            self.fabric.cancel(flow)
        if early is None:
            return req
        # The stream that began at prefill start is gone: the hand-off has not started.
        early[2].transfer_start_s = early[2].decode_admit_s = float("nan")
        early[2].decode_cached_tokens = 0
        return early[1]

    def _transfer(self, req: Request, src: Instance, dst: Instance,
                  streamed: bool = False) -> Generator[simpy.Event, Any, None]:
        env = self.env
        attempt = req.restarts
        start = req.transfer_start_s if streamed else env.now
        req.transfer_start_s = env.now
        path = self._path(src, dst)
        # The KV covers every token prefilled: the prompt, plus the tokens generated before
        # a failure sent the request back to be prefilled again; less the leading blocks a
        # prefix cache on the decode side already holds (it pulls only the rest).
        tokens = req.prefill_target - req.decode_cached_tokens
        nbytes = path.bytes_per_token * tokens
        convert = path.conversion_s_per_byte * nbytes + path.conversion_s_per_token * tokens
        flows: list[Flow] = []
        if streamed:
            # The prefill is done: the stream may run at full speed, and the last layer's
            # share (what could not leave before the last layer was computed) follows.
            flows = self.flows.get(req.id, [])
            self.fabric.uncap(flows)
            if convert + path.fixed_s:
                yield env.timeout(convert + path.fixed_s)
            tail = [FlowSpec(res, bpt * tokens / self.transfer.num_layers)
                    for res, bpt in path.streams]
        else:
            if convert + path.fixed_s:
                yield env.timeout(convert + path.fixed_s)
            tail = [FlowSpec(res, bpt * tokens) for res, bpt in path.streams]
        if req.restarts != attempt or req.status is State.CANCELLED:
            return  # a failure already sent the request elsewhere, or the client gave up
        flows = flows + self.fabric.start(tail)
        self.flows[req.id] = flows
        results = yield env.all_of([f.done for f in flows])
        if req.restarts != attempt or req.status is State.CANCELLED:
            return
        self.flows.pop(req.id, None)
        self.in_transfer.pop(req.id, None)
        if not all(results.values()):  # a link died for good: no other path in this topology
            src.release_held(req)
            dst.cancel_reservation(req)
            self.fail_request(req, f"KV transfer failed: link {path.key} is down")
            return
        req.transfer_end_s = env.now
        self.recorder.transfer(req.id, src.index, dst.index, self.link_labels[path.key],
                               nbytes, start, env.now, env.now - req.prefill_end_s)
        src.release_held(req)
        dst.admit_transferred(req)

    # ----- faults ------------------------------------------------------------------
    def fail_instance(self, inst: Instance) -> None:
        """``inst`` dies: its KV is gone; its requests are prefilled or placed again."""
        if not inst.alive:
            return
        lost, held, reserved = inst.fail()
        self.recorder.event(self.env.now, "instance_failure",
                            f"{inst.name}: {len(lost)} running/queued, {len(held)} held, "
                            f"{len(reserved)} incoming")
        # Hand-offs waiting for decode room from the dead prefill instance lost their KV.
        keep: deque[tuple[Request, Instance]] = deque()
        for req, src in self.pending_decode:
            if src is not inst:
                keep.append((req, src))
            elif req not in held:
                held.append(req)
        self.pending_decode = keep
        for req in lost + held:
            holder = self._drop_flows(req)
            pair = self.in_transfer.pop(req.id, None)
            if pair is not None and pair[1] is not inst:
                pair[1].cancel_reservation(holder)
            self._restart(req)
        for req in reserved:  # KV still on the prefill side: send it elsewhere
            early = self.streaming.get(req.id)
            self._drop_flows(req)
            pair = self.in_transfer.pop(req.id, None)
            if early is not None and pair is not None:
                # A layer-wise stream to the dead instance: the request is still being
                # prefilled (``req`` is its stand-in); it hands off after the prefill.
                early[2].decode_instance = -1
                self.kv_location.pop(req.id, None)
                continue
            req.restarts += 1
            self.retries += 1
            if pair is None or not pair[0].alive:
                self._restart(req, counted=True)
                continue
            if not self._place(req, pair[0]):
                self.pending_decode.append((req, pair[0]))
        if inst.role == "decode":
            self._drain_pending_decode()

    def _restart(self, req: Request, counted: bool = False) -> None:
        """Send ``req`` back to be prefilled (prompt + tokens generated so far)."""
        if not counted:
            req.restarts += 1
            self.retries += 1
        req.reset_for_recompute(preempted=False)
        req.move_to(State.QUEUED)
        req.decode_instance = -1
        self.kv_location.pop(req.id, None)
        self._route(req)

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
        self._drain_pending_decode()

    def degrade_links(self, source: str, factor: float, for_good: bool) -> None:
        """Scale what ``source`` sends through (its NICs, scale-up ports, host lanes)."""
        self.fabric.degrade(source, factor, for_good=for_good)

    @property
    def link_names(self) -> list[str]:
        return list(self.link_labels)
