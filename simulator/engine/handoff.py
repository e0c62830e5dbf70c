"""KV hand-offs of a disaggregated cluster: from a prefill instance to a decode instance.

After (or, layer-wise, during) a prefill, a decode instance with room is picked by the
decode policy, its KV is reserved, and the prompt's KV moves over the :class:`Fabric`:
one flow per rank stream, over the NIC, NVLink, host-link and spine resources the route
crosses (routes in runner/paths.py, bytes in cost/handoff.py). A hand-off that finds no
decode room waits in :attr:`HandOff.pending` until a decode instance frees KV.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import simpy

from simulator.cost.batch import BatchShape
from simulator.engine.fabric import INF, Fabric, Flow, FlowSpec, TransferPath
from simulator.engine.instance import Instance
from simulator.engine.load_index import LoadIndex
from simulator.engine.recorder import Recorder
from simulator.engine.request import Request, State
from simulator.engine.router import POLICIES, RouterState

# Policies that pick the instance with the smallest key and keep no state between calls.
MIN_KEY_POLICIES = frozenset({"least_kv", "least_outstanding", "least_tokens"})


@dataclass
class TransferPlan:
    mode: Literal["bulk", "layerwise"] = "bulk"
    path: Callable[[int, int], TransferPath] | None = None
    """Route of a hand-off between two instances (by index), see runner/paths.py."""
    num_layers: int = 1


def load_changed(inst: Instance) -> None:
    """Tell the load index of ``inst``'s pool (if any) that its routing key moved."""
    if inst.on_load_change is not None:
        inst.on_load_change(inst)


class HandOff:
    """The hand-offs of one cluster; see the module docstring.

    ``fail`` ends a request whose KV can never arrive (the cluster's ``fail_request``).
    """

    def __init__(self, env: simpy.Environment, fabric: Fabric, recorder: Recorder,
                 plan: TransferPlan, decoders: list[Instance], policy: str,
                 index: LoadIndex[Instance] | None, router_state: RouterState,
                 fail: Callable[[Request, str], None]) -> None:
        self.env = env
        self.fabric = fabric
        self.recorder = recorder
        self.plan = plan
        self.decoders = decoders
        self.policy_name = policy
        self.policy = POLICIES[policy]
        self.index = index
        self.router_state = router_state
        self.fail = fail
        self.pending: deque[tuple[Request, Instance]] = deque()
        self.in_transfer: dict[int, tuple[Instance, Instance]] = {}
        self.link_labels: dict[str, int] = {}
        # Flows carrying each request's KV now; a layer-wise stream opens them at prefill
        # start (with its destination reserved then), a bulk hand-off after the prefill.
        self.flows: dict[int, list[Flow]] = {}
        self.streaming: dict[int, tuple[Instance, Request, Request]] = {}
        self.kv_location: dict[int, int] = {}

    def pending_requests(self) -> list[Request]:
        """Requests whose prefill is done, waiting for a decode instance with room."""
        return [req for req, _ in self.pending]

    def prefill_started(self, src: Instance, req: Request) -> None:
        """Layer-wise: reserve a destination now and stream each layer's KV as it is made.

        SGLang's P/D (``python/sglang/srt/disaggregation/decode.py``, the pre-allocation
        queue) and Mooncake reserve decode KV before the prefill runs, which is what lets
        layers leave while later ones compute. If no decode instance can reserve now, the
        hand-off starts after the prefill, like a bulk one: overlap is credited only while
        a destination was held.
        """
        dst = self.pick(req)
        if dst is None:
            return
        # The request's block counts belong to the prefill side until its prefill ends, so
        # the early reservation is booked on a stand-in carrying the decode side's count.
        stand_in = Request(req.id, req.arrival_s, req.prompt_tokens, req.output_tokens)
        stand_in.generated = req.generated
        stand_in.block_hashes = req.block_hashes
        self._reserve(req, src, dst, stand_in)
        req.decode_cached_tokens = stand_in.decode_cached_tokens
        path = self.path(src, dst)
        tokens = req.prefill_target - req.decode_cached_tokens
        share = 1 - 1 / self.plan.num_layers
        # A layer cannot leave before it is computed: cap the stream at the rate the
        # prefill produces it, as the cost model prices this prefill alone.
        seconds = src.cost.step(BatchShape.prefill(tokens, req.cached_tokens)).seconds
        specs = [FlowSpec(res, bpt * tokens * share,
                          bpt * tokens * share / seconds if seconds > 0 else INF)
                 for res, bpt in path.streams]
        self.flows[req.id] = self.fabric.start(specs, events=False)
        self.streaming[req.id] = (dst, stand_in, req)
        req.transfer_start_s = self.env.now

    def prefilled(self, src: Instance, req: Request) -> None:
        """``src`` finished ``req``'s prefill and holds its KV: hand it off, or wait."""
        load_changed(src)  # running -> held: one fewer outstanding
        req.transfer_wait_s = self.env.now
        early = self.streaming.pop(req.id, None)
        if early is not None:
            dst, stand_in, _ = early
            # The prefill has handed its blocks to src_blocks: the request itself now
            # carries the decode reservation.
            req.blocks = stand_in.blocks
            dst.rebind_reservation(req)
            self._transfer(req, src, dst, streamed=True)
            return
        if not self.place(req, src):
            self.pending.append((req, src))

    def pick(self, req: Request) -> Instance | None:
        """The decode instance the policy picks among those that can reserve ``req`` now."""
        if self.index is not None:
            return self.index.pick(
                lambda d: d.accepting and d.can_ever_hold(req) and d.can_reserve(req))
        if self.policy_name in MIN_KEY_POLICIES:
            # A least-something policy picks the same instance among those that fit as
            # among all, whenever its pick fits: try that first, filter only if not.
            serving = [d for d in self.decoders if d.accepting and d.can_ever_hold(req)]
            if serving:
                # The least of one is that one: its key need not be read.
                pick = (serving[0] if len(serving) == 1
                        else self.policy(serving, req, self.router_state, "decode"))
                if pick.can_reserve(req):  # type: ignore[attr-defined]
                    return pick  # type: ignore[return-value]
        fits = [d for d in self.decoders
                if d.accepting and d.can_ever_hold(req) and d.can_reserve(req)]
        if not fits:
            return None
        return self.policy(fits, req, self.router_state, "decode")  # type: ignore[return-value]

    def _reserve(self, req: Request, src: Instance, dst: Instance,
                 holder: Request | None = None) -> None:
        ok = dst.try_reserve(holder or req)
        assert ok
        req.decode_instance = dst.index
        req.decode_admit_s = self.env.now
        self.kv_location[req.id] = dst.index
        self.in_transfer[req.id] = (src, dst)

    def place(self, req: Request, src: Instance) -> bool:
        """Reserve a decode instance for ``req`` and start its transfer; False if none fits."""
        dst = self.pick(req)
        if dst is None:
            return False
        self._reserve(req, src, dst)
        self._transfer(req, src, dst)
        return True

    def drain(self) -> None:
        """Place waiting hand-offs, in order, while decode room lasts."""
        while self.pending:
            req, src = self.pending[0]
            if not self.place(req, src):
                break
            self.pending.popleft()

    def path(self, src: Instance, dst: Instance) -> TransferPath:
        assert self.plan.path is not None
        path = self.plan.path(src.index, dst.index)
        self.link_labels.setdefault(path.key, len(self.link_labels))
        return path

    def drop_flows(self, req: Request) -> Request:
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
                  streamed: bool = False) -> None:
        """Start the hand-off: set-up and latency, then the flows; :meth:`_arrived` ends it.

        Callbacks on events, no process: a timer for the fixed part, the fabric's report
        for the flows. With no fixed part the flows start in an urgent event now, where a
        process started now would run first.
        """
        env = self.env
        attempt = req.restarts
        start = req.transfer_start_s if streamed else env.now
        req.transfer_start_s = env.now
        path = self.path(src, dst)
        # The KV covers every token prefilled: the prompt, plus the tokens generated before
        # a failure sent the request back to be prefilled again; less the leading blocks a
        # prefix cache on the decode side already holds (it pulls only the rest).
        tokens = req.prefill_target - req.decode_cached_tokens
        nbytes = path.bytes_per_token * tokens
        convert = path.conversion_s_per_byte * nbytes + path.conversion_s_per_token * tokens
        joined: list[Flow] = []
        if streamed:
            # The prefill is done: the stream may run at full speed, and the last layer's
            # share (what could not leave before the last layer was computed) follows.
            joined = self.flows.get(req.id, [])
            self.fabric.uncap(joined)
            tail = [FlowSpec(res, bpt * tokens / self.plan.num_layers)
                    for res, bpt in path.streams]
        else:
            tail = [FlowSpec(res, bpt * tokens) for res, bpt in path.streams]

        def launch(_e: object = None) -> None:
            if req.restarts != attempt or req.status is State.CANCELLED:
                return  # a failure already sent the request elsewhere, or the client gave up
            flows = self.fabric.transfer(
                tail, lambda ok: self._arrived(req, src, dst, path, nbytes, start, attempt, ok),
                joined)
            self.flows[req.id] = joined + flows

        delay = convert + path.fixed_s
        event = env.timeout(delay) if delay else urgent(env)
        event.callbacks.append(launch)

    def _arrived(self, req: Request, src: Instance, dst: Instance, path: TransferPath,
                 nbytes: float, start: float, attempt: int, ok: bool) -> None:
        """Every flow of the hand-off ended; ``ok``: all got through."""
        if req.restarts != attempt or req.status is State.CANCELLED:
            return
        self.flows.pop(req.id, None)
        self.in_transfer.pop(req.id, None)
        if not ok:  # a link died for good: no other path in this topology
            src.release_held(req)
            dst.cancel_reservation(req)
            self.fail(req, f"KV transfer failed: link {path.key} is down")
            return
        now = self.env.now
        req.transfer_end_s = now
        self.recorder.transfer(req.id, src.index, dst.index, self.link_labels[path.key],
                               nbytes, start, now, now - req.prefill_end_s)
        src.release_held(req)
        dst.admit_transferred(req)


def urgent(env: simpy.Environment) -> simpy.Event:
    """An event that fires now, ahead of the normal events due now (as a process's start)."""
    event = simpy.Event(env)
    event._ok = True
    event._value = None
    env.schedule(event, simpy.events.URGENT)
    return event
