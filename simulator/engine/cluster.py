"""The cluster of one run: pools of instances, the router, KV hand-offs over links.

Built from resolved specs (cost models, KV capacities, link profiles), so this module
never reads a profile or a scenario file itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Literal

import simpy

from simulator.cost.step import InstanceCostModel
from simulator.engine.config import RouterSpec, SchedulerSpec
from simulator.engine.instance import Instance
from simulator.engine.link import SharedLink
from simulator.engine.recorder import Recorder
from simulator.engine.request import Request
from simulator.engine.router import POLICIES, RouterState
from simulator.hardware.profiles import LinkProfile

Role = Literal["colocated", "prefill", "decode"]


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


@dataclass(frozen=True)
class TransferPath:
    """The link a KV hand-off between two instances crosses, and how many rank streams."""

    key: str
    profile: LinkProfile
    streams: int
    conversion_s_per_byte: float = 0.0
    conversion_s_per_token: float = 0.0
    extra_latency_s: float = 0.0
    """Latency of the route's other hops (host links on a GPU -> LPU path)."""


@dataclass
class TransferPlan:
    mode: Literal["bulk", "layerwise"] = "bulk"
    path: Callable[[int, int], TransferPath] | None = None
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

    def __post_init__(self) -> None:
        self.instances: list[Instance] = []
        for i, spec in enumerate(self.specs):
            self.instances.append(Instance(
                self.env, i, spec.name, spec.pool, spec.role, spec.cost, spec.kv_blocks,
                spec.block_size, spec.scheduler, self.recorder, self._prefilled,
                self._complete, self._kv_freed, self.fast_forward,
            ))
        self.entry = [x for x in self.instances if x.role in ("colocated", "prefill")]
        self.decoders = [x for x in self.instances if x.role == "decode"]
        self.pending_decode: deque[tuple[Request, Instance]] = deque()
        self.links: dict[str, SharedLink] = {}
        self.kv_location: dict[int, int] = {}
        self.completed = 0
        self._entry_policy = POLICIES[self.router.policy]
        self._decode_policy = POLICIES[self.router.decode_policy]

    # ----- arrivals ------------------------------------------------------------------
    def submit(self, req: Request) -> None:
        self.recorder.requests.append(req)
        inst = self._entry_policy(self.entry, req, self.router_state, "entry")
        inst.enqueue(req)  # type: ignore[attr-defined]

    # ----- completions -----------------------------------------------------------------
    def _complete(self, inst: Instance, req: Request) -> None:
        self.completed += 1
        self.kv_location.pop(req.id, None)
        self.on_finished(req)

    # ----- hand-off (disaggregated) --------------------------------------------------
    def _prefilled(self, src: Instance, req: Request) -> None:
        req.transfer_wait_s = self.env.now
        if not self._place(req, src):
            self.pending_decode.append((req, src))

    def _place(self, req: Request, src: Instance) -> bool:
        fits = [d for d in self.decoders if d.can_reserve(req)]
        if not fits:
            return False
        dst = self._decode_policy(fits, req, self.router_state, "decode")
        ok = dst.try_reserve(req)  # type: ignore[attr-defined]
        assert ok
        req.decode_instance = dst.index
        req.decode_admit_s = self.env.now
        self.kv_location[req.id] = dst.index
        self.env.process(self._transfer(req, src, dst))  # type: ignore[arg-type]
        return True

    def _kv_freed(self, inst: Instance) -> None:
        if inst.role != "decode" or not self.pending_decode:
            return
        while self.pending_decode:
            req, src = self.pending_decode[0]
            if not self._place(req, src):
                break
            self.pending_decode.popleft()

    def _link(self, path: TransferPath) -> SharedLink:
        link = self.links.get(path.key)
        if link is None:
            link = SharedLink(self.env, len(self.links), path.key, path.profile, path.streams)
            self.links[path.key] = link
        return link

    def _transfer(self, req: Request, src: Instance, dst: Instance) -> Generator[simpy.Event, Any, None]:
        env = self.env
        start = env.now
        req.transfer_start_s = start
        spec = self.specs[src.index]
        nbytes = spec.kv_bytes_per_token * req.prompt_tokens
        assert self.transfer.path is not None
        path = self.transfer.path(src.index, dst.index)
        link = self._link(path)
        convert = (path.conversion_s_per_byte * nbytes
                   + path.conversion_s_per_token * req.prompt_tokens + path.extra_latency_s)
        if convert:
            yield env.timeout(convert)
        if self.transfer.mode == "layerwise":
            # Each layer's KV streams out as soon as that layer is computed, so while the
            # prefill ran the link could already carry up to (L-1)/L of the bytes; only
            # the rest (at least the last layer's share) is left after the first token.
            overlap_s = req.prefill_end_s - req.prefill_start_s
            streamed = min(nbytes * (1 - 1 / self.transfer.num_layers),
                           overlap_s * link.bandwidth)
            nbytes -= streamed
        yield from link.send(nbytes)
        req.transfer_end_s = env.now
        self.recorder.transfer(req.id, src.index, dst.index, link.index,
                               spec.kv_bytes_per_token * req.prompt_tokens, start, env.now,
                               env.now - req.first_token_s)
        src.release_held(req)
        dst.admit_transferred(req)

    @property
    def link_names(self) -> list[str]:
        return [k for k, _ in sorted(self.links.items(), key=lambda kv: kv[1].index)]
