"""KV tier traffic of one instance as flows on the network fabric.

:class:`TierIO` sits between an instance's HBM prefix cache and its
:class:`~simulator.engine.kv_tiers.TierStack`: blocks the cache evicts are written down
(device-to-host copies over each GPU's host link, NVMe writes, RDMA writes to the shared
pool) and a prefix hit below HBM is read back up. Both are flows over the fabric's
shared resources (:mod:`simulator.engine.fabric`), so a load competes with KV hand-offs
and with other loads for the same PCIe lanes and NICs, and takes ``bytes / bandwidth``
only when it is alone.

Stores are fire-and-forget, as vLLM's offloading connector issues them on a side stream
(``vllm/v1/kv_offload/worker``: the D2H copy is queued and the scheduler does not wait
for it). A load is awaited by the request that needs it: vLLM keeps such a request in
``WAITING_FOR_REMOTE_KVS`` until the connector reports the blocks have arrived, while the
engine keeps stepping its other requests (``vllm/v1/core/sched/scheduler.py``).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import simpy

from simulator.engine.fabric import Fabric, FlowSpec, ResourceSpec
from simulator.engine.kv_tiers import TIER_NAMES, TierStack

Streams = tuple[tuple[tuple[ResourceSpec, ...], float], ...]
"""Per rank stream: the resources it crosses and its bytes per hash block."""


@dataclass(frozen=True)
class TierRoute:
    """How one tier of one instance is reached (built in runner/paths.py)."""

    name: str
    capacity_blocks: int
    """Hash blocks the tier holds (``capacity_gib`` / bytes of one block)."""
    block_bytes: float
    """Bytes of one hash block across the instance (all ranks' shards)."""
    read: Streams
    write: Streams
    latency_s: float


class TierIO:
    """Offloads and loads of one instance (see the module docstring)."""

    def __init__(self, env: simpy.Environment, fabric: Fabric, stack: TierStack,
                 routes: dict[str, TierRoute]) -> None:
        self.env = env
        self.fabric = fabric
        self.stack = stack
        self.routes = routes
        self.bytes_read = dict.fromkeys(TIER_NAMES, 0.0)
        self.bytes_written = dict.fromkeys(TIER_NAMES, 0.0)

    def block_bytes(self, name: str) -> float:
        return self.routes[name].block_bytes

    # ----- down ------------------------------------------------------------------------
    def offload(self, hashes: list[int]) -> None:
        """The HBM cache evicted ``hashes``: write them down the stack."""
        written = self.stack.offload(hashes)
        specs: list[FlowSpec] = []
        for name, n in written.items():
            route = self.routes[name]
            self.bytes_written[name] += n * route.block_bytes
            specs += [FlowSpec(res, per_block * n) for res, per_block in route.write]
        if specs:
            self.fabric.start(specs)  # nothing waits for a store

    def discard(self, hashes: list[int]) -> None:
        self.stack.discard(hashes)

    # ----- up --------------------------------------------------------------------------
    def lookup(self, hashes: list[int]) -> list[str]:
        return self.stack.lookup(hashes)

    def load(self, hashes: list[int]) -> tuple[dict[str, int], simpy.Event]:
        """Read the leading found blocks of ``hashes`` into HBM.

        Returns the blocks taken from each tier and an event that fires (with True, or
        False if a resource on the way died) when the last byte has arrived.
        """
        taken = self.stack.take(hashes)
        specs: list[FlowSpec] = []
        latency = 0.0
        for name, n in taken.items():
            route = self.routes[name]
            self.bytes_read[name] += n * route.block_bytes
            specs += [FlowSpec(res, per_block * n) for res, per_block in route.read]
            latency = max(latency, route.latency_s)
        done = self.env.process(self._load(specs, latency))
        return taken, done

    def _load(self, specs: list[FlowSpec], latency: float
              ) -> Generator[simpy.Event, Any, bool]:
        ok = yield from self.fabric.send(specs, latency)
        return bool(ok)
