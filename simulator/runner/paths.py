"""The route of a KV hand-off: which fabric resources each rank stream crosses.

A hand-off is a set of rank-to-rank streams (how many, and how many bytes each, comes from
:func:`simulator.cost.handoff.handoff_streams`). Each stream crosses resources named by
the physical thing that sets their rate, so that everything sharing that thing shares its
bandwidth, whichever instances are at either end:

* both devices in one scale-up domain (an HGX board, a GB200 NVL72 rack): the source
  GPU's scale-up port out and the destination GPU's port in;
* same device kind, different domains: the NIC each GPU sits behind
  (``scale_out_nics_per_node`` of the device, one per GPU by default as on DGX/HGX
  H100: 8 x ConnectX-7 400G), out on the source node and in on the destination node,
  plus the nodes' spine uplinks when ``kv_transfer.spine_oversubscription`` is set;
* different device kinds (GPU -> LPU): host-staged, through each device's host link and
  the network link (``kv_transfer.network``), one lane per rank;
* ``kv_transfer.link`` forces one link profile: each device's port of that link.
"""

from __future__ import annotations

from simulator.engine.fabric import ResourceSpec, TransferPath
from simulator.engine.kv_config import KvTierSpec
from simulator.engine.tier_io import TierRoute
from simulator.hardware.profiles import DeviceProfile, LinkProfile
from simulator.hardware.registry import load_link
from simulator.runner.placement import Placement
from simulator.units import GIB


def _fixed(*profiles: LinkProfile) -> float:
    return sum(p.per_transfer_overhead_us + p.latency_us for p in profiles) * 1e-6


def _port(link: LinkProfile, dev: DeviceProfile, g: int, way: str,
          owner: str | None) -> ResourceSpec:
    return ResourceSpec(f"{link.name}:{dev.name}#{g}:{way}", link.effective_bandwidth, owner)


def _nic(link: LinkProfile, dev: DeviceProfile, g: int, way: str,
         owner: str | None) -> ResourceSpec:
    per_node = dev.devices_per_node
    nics = dev.scale_out_nics_per_node or per_node
    node, slot = divmod(g, per_node)
    nic = slot * nics // per_node
    return ResourceSpec(f"{link.name}:{dev.name}:node{node}:nic{nic}:{way}",
                        link.effective_bandwidth, owner)


def _spine(link: LinkProfile, dev: DeviceProfile, g: int, way: str,
           oversubscription: float) -> ResourceSpec:
    nics = dev.scale_out_nics_per_node or dev.devices_per_node
    node = g // dev.devices_per_node
    return ResourceSpec(f"spine:{dev.name}:node{node}:{way}",
                        nics * link.effective_bandwidth / oversubscription)


def transfer_path(a: Placement, b: Placement, src_name: str, streams: list[tuple[int, int, float]],
                  *, forced: str | None, network: str | None, spine_oversubscription: float | None,
                  conversion_s_per_byte: float, conversion_s_per_token: float) -> TransferPath:
    """Resources of every stream of a hand-off from placement ``a`` to placement ``b``."""
    da, db = a.device, b.device
    out: dict[tuple[ResourceSpec, ...], float] = {}
    used: dict[str, LinkProfile] = {}
    fixed = 0.0

    def add(resources: tuple[ResourceSpec, ...], nbytes: float) -> None:
        out[resources] = out.get(resources, 0.0) + nbytes

    if forced is not None:
        link = load_link(forced)
        used[link.name] = link
        fixed = _fixed(link)
        for i, j, nbytes in streams:
            ga, gb = a.global_device(i), b.global_device(j)
            add((_port(link, da, ga, "tx", src_name), _port(link, db, gb, "rx", None)), nbytes)
    elif da.name == db.name and (da.scale_up_link or da.scale_out_link):
        up = load_link(da.scale_up_link) if da.scale_up_link else None
        net = load_link(da.scale_out_link) if da.scale_out_link else None
        for i, j, nbytes in streams:
            ga, gb = a.global_device(i), b.global_device(j)
            if up is not None and (ga // da.scale_up_domain == gb // db.scale_up_domain
                                   or net is None):
                used[up.name] = up
                add((_port(up, da, ga, "tx", src_name), _port(up, db, gb, "rx", None)), nbytes)
                continue
            assert net is not None
            used[net.name] = net
            hops = [_nic(net, da, ga, "tx", src_name)]
            node_a, node_b = ga // da.devices_per_node, gb // db.devices_per_node
            if spine_oversubscription is not None and node_a != node_b:
                hops += [_spine(net, da, ga, "up", spine_oversubscription),
                         _spine(net, db, gb, "down", spine_oversubscription)]
            hops.append(_nic(net, db, gb, "rx", None))
            add(tuple(hops), nbytes)
        fixed = max(_fixed(p) for p in used.values())
    else:
        names = [n for n in (da.host_link, network or "ethernet-100g", db.host_link) if n]
        profiles = [load_link(n) for n in names]
        for p in profiles:
            used[p.name] = p
        fixed = _fixed(*profiles)
        for i, j, nbytes in streams:
            ga, gb = a.global_device(i), b.global_device(j)
            hops = []
            if da.host_link:
                hops.append(_port(load_link(da.host_link), da, ga, "tx", src_name))
            net = load_link(network or "ethernet-100g")
            hops += [ResourceSpec(f"{net.name}:{da.name}#{ga}:tx", net.effective_bandwidth,
                                  src_name),
                     ResourceSpec(f"{net.name}:{db.name}#{gb}:rx", net.effective_bandwidth)]
            if db.host_link:
                hops.append(_port(load_link(db.host_link), db, gb, "rx", None))
            add(tuple(hops), nbytes)
        label = "+".join(names)
        slowest = min(profiles, key=lambda p: p.effective_bandwidth)
        return TransferPath(f"{label}:{src_name}", slowest, tuple(out.items()), fixed,
                            conversion_s_per_byte, conversion_s_per_token)
    slowest = min(used.values(), key=lambda p: p.effective_bandwidth)
    label = "+".join(sorted(used))
    return TransferPath(f"{label}:{src_name}", slowest, tuple(out.items()), fixed,
                        conversion_s_per_byte, conversion_s_per_token)



# ----- KV tiers ------------------------------------------------------------------------
# Default rates of a tier's own resource when its spec leaves them empty, bytes/s (None:
# only the GPU's host link or NIC limits it). SSD: one PCIe Gen4 U.2 drive, Kioxia CM6-R
# datasheet (sequential read 6.9 GB/s, write 4.2 GB/s).
_TIER_READ = {"dram": None, "ssd": 6.9e9, "remote": None}
_TIER_WRITE = {"dram": None, "ssd": 4.2e9, "remote": None}
_TIER_LATENCY_US = {"dram": 10.0, "ssd": 100.0, "remote": 20.0}


def tier_routes(a: Placement, inst_name: str, tiers: list[KvTierSpec],
                rank_bytes_per_token: list[float], block_tokens: int) -> dict[str, TierRoute]:
    """How each KV tier of the instance at ``a`` is reached, rank by rank.

    Every rank moves its own shard of a block (``rank_bytes_per_token``, replicas
    counted, as :func:`simulator.cost.handoff.handoff_streams` gives them): DRAM and
    SSD traffic crosses the rank's host link (the same PCIe port a host-staged hand-off
    uses), the shared pool's crosses the rank's scale-out NIC (the same NIC a P/D
    hand-off uses). A tier with a rate of its own adds one resource all ranks share:
    ``KIND:INSTANCE:read|write`` (per instance), ``remote-pool:read|write`` (cluster).
    The first tier is written from HBM over the GPU's link; lower ones from the host.
    """
    dev = a.device
    host = load_link(dev.host_link) if dev.host_link else None
    net = load_link(dev.scale_out_link) if dev.scale_out_link else None
    block_bytes = sum(rank_bytes_per_token) * block_tokens
    out: dict[str, TierRoute] = {}
    for level, spec in enumerate(tiers):
        kind = spec.kind
        link = net if kind == "remote" else host
        if link is None:
            need = "scale_out_link" if kind == "remote" else "host_link"
            raise ValueError(f"a {kind} KV tier needs the device's {need}; {dev.name} has none")
        where = "remote-pool" if kind == "remote" else f"{kind}:{inst_name}"
        read_bw = spec.read_gb_per_s * 1e9 if spec.read_gb_per_s else _TIER_READ[kind]
        write_bw = spec.write_gb_per_s * 1e9 if spec.write_gb_per_s else _TIER_WRITE[kind]
        own_read = (ResourceSpec(f"{where}:read", read_bw),) if read_bw else ()
        own_write = (ResourceSpec(f"{where}:write", write_bw),) if write_bw else ()
        hop = _nic if kind == "remote" else _port
        read, write = [], []
        for rank, bpt in enumerate(rank_bytes_per_token):
            g = a.global_device(rank)
            per_block = bpt * block_tokens
            read.append(((*own_read, hop(link, dev, g, "rx", None)), per_block))
            from_gpu = level == 0 or kind == "remote"
            gpu_hop = (hop(link, dev, g, "tx", inst_name),) if from_gpu else ()
            write.append(((*gpu_hop, *own_write), per_block))
        capacity = int(spec.capacity_gib * GIB // block_bytes)
        if capacity < 1:
            raise ValueError(f"a {kind} tier of {spec.capacity_gib:g} GiB holds no "
                             f"{block_tokens}-token block ({block_bytes / GIB:.3f} GiB each)")
        latency = spec.latency_us if spec.latency_us is not None else _TIER_LATENCY_US[kind]
        out[kind] = TierRoute(kind, capacity, block_bytes, tuple(read), tuple(write),
                              latency * 1e-6)
    return out
