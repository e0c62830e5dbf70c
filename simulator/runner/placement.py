"""Placement: which node each instance's devices sit on, and the links that implies.

Pools are laid out in order; each pool's devices are packed onto nodes of the device's
``devices_per_node``, continuing on the current node when the previous pool used the
same device kind. An instance whose devices all share a node and a scale-up domain talks
over the scale-up link (NVLink, LPU C2C); otherwise over the scale-out network.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.hardware.profiles import DeviceProfile


@dataclass(frozen=True)
class Placement:
    pool: str
    device: DeviceProfile
    first_device: int
    """Global index of the instance's first device (in its device kind's numbering)."""
    devices: int
    nodes: tuple[int, ...]
    """Nodes the instance spans, in order."""
    spread: bool = False
    """Ranks are split evenly over ``nodes`` (explicit placement) instead of packed."""

    def global_device(self, rank: int) -> int:
        """Index of ``rank``'s device in its kind's numbering (node * devices_per_node + slot)."""
        per_node = self.device.devices_per_node
        if self.spread:
            share = -(-self.devices // len(self.nodes))
            return self.nodes[rank // share] * per_node + rank % share
        return self.first_device + rank

    def domain_of_rank(self, rank: int) -> int:
        return self.global_device(rank) // self.device.scale_up_domain

    def same_domain(self, ranks: range) -> bool:
        return len({self.domain_of_rank(r) for r in ranks}) == 1


def place(pools: list[tuple[str, DeviceProfile, int, int]],
          explicit_nodes_per_instance: dict[str, int] | None = None) -> list[Placement]:
    """Place ``(pool, device, instances, devices_per_instance)`` groups onto nodes.

    ``explicit_nodes_per_instance[pool] = k`` spreads each of that pool's instances over
    ``k`` nodes (to study a TP/EP group that spans nodes).
    """
    cursor: dict[str, int] = {}
    out: list[Placement] = []
    for pool, device, instances, per_instance in pools:
        kind = device.name
        per_node = device.devices_per_node
        spread = (explicit_nodes_per_instance or {}).get(pool, 0)
        for _ in range(instances):
            start = cursor.get(kind, 0)
            if spread > 1:
                # Start on a fresh node and put per_instance / spread devices on each.
                start = -(-start // per_node) * per_node
                nodes = tuple(start // per_node + k for k in range(spread))
                cursor[kind] = start + spread * per_node
                out.append(Placement(pool, device, start, per_instance, nodes, spread=True))
                continue
            # Do not split an instance that fits in one node across two nodes.
            if per_instance <= per_node and start % per_node + per_instance > per_node:
                start = -(-start // per_node) * per_node
            first_node = start // per_node
            last_node = (start + per_instance - 1) // per_node
            out.append(Placement(pool, device, start, per_instance,
                                 tuple(range(first_node, last_node + 1))))
            cursor[kind] = start + per_instance
    return out
