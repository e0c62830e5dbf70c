"""NCCL's own choice of algorithm and protocol for a collective on one link.

For every collective NCCL's tuner prices each algorithm (ring, tree, NVLink SHARP) with each
protocol it may run (LL, LL128, Simple) as ``latency + bytes / bandwidth`` on its own constants
and launches the one it predicts cheapest (``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``
in ``NVIDIA/nccl:src/graph/tuning.cc``). The prediction is not the time: the tuner's LL is
slower and its Simple and NVLS latencies lower than they run, so the measured curves jump
where the tuner switches protocol (2 x H100: 14 us at 1 MiB, 28 us at 2 MiB). This module
does both steps: it ranks the menu with the tuner's model (NCCL's constants, NCCL's own
bus-bandwidth figure for the link) and prices the chosen entry with the same structure on the
link's fitted numbers (the link's ``nccl`` block,
:class:`simulator.hardware.profiles.NcclTuning`).

The structure taken from ``tuning.cc`` (commit b6475625):

* latency = base latency of (algorithm, protocol) + hops x hardware latency per hop, with the
  constants of :data:`BASE_US` and :data:`HOP_US` (NVLink, PCIe or network rows); a ring
  all-reduce takes ``2(n-1)`` hops, an all-gather / reduce-scatter ``n-1``, a tree all-reduce
  ``2(n-1)`` inside a node (``2 log2 n`` across nodes), NVLink SHARP one fixed latency;
* bandwidth = the ring's bus bandwidth times a protocol factor: Simple moves only data; LL
  carries a 4-byte flag with every 4 data bytes and the tuner prices it at 1/4 of the bus
  bandwidth for an all-reduce, 1/3 for an all-gather / reduce-scatter, capped at ``llMaxBw``
  (on the link, LL's bus bandwidth is a fitted figure of its own);
  LL128 keeps 120 of each 128 bytes for data (NCCL's 0.92); a tree reaches 0.92 of it and
  moves its buffer twice (LL 1/3.8, LL128 7/9 of that inside a node);
* the tuner's NVLS algorithm bandwidth is 5/6 of its bus bandwidth, its latency 23 us;
* NVLink SHARP (NVLS) runs Simple only, for all-reduce, all-gather and reduce-scatter, and
  only on fabrics with multicast and groups of more than two GPUs
  (``src/transport/nvls.cc``: ``gpuCount <= 2`` disables it); LL128 only where the link
  allows it (NVLink in NCCL's tuner).

All-to-all is not tuned by NCCL: it is grouped send/receive, which runs LL while each peer's
share is at most ``NCCL_P2P_LL_THRESHOLD`` (16 KiB) and Simple above. The sends to all peers
run at once, so it pays one call's base latency and one hop (:data:`P2P_HOPS`), and moves
``(n-1)/n`` of the buffer at the protocol's bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from simulator.hardware.profiles import NcclTuning

Collective = Literal["allreduce", "allgather", "reducescatter", "alltoall"]
Algorithm = Literal["ring", "tree", "nvls"]
Protocol = Literal["ll", "ll128", "simple"]

BASE_US: dict[tuple[Algorithm, Protocol], float] = {
    ("tree", "ll"): 6.8, ("tree", "ll128"): 14.0, ("tree", "simple"): 0.0,
    ("ring", "ll"): 6.6, ("ring", "ll128"): 14.0, ("ring", "simple"): 8.4,
    ("nvls", "simple"): 0.0,
}
"""``baseLat`` of ``tuning.cc``: fixed latency of one call per (algorithm, protocol), us."""

HOP_US: dict[str, dict[tuple[Algorithm, Protocol], float]] = {
    "nvlink": {("tree", "ll"): 0.6, ("tree", "ll128"): 1.25, ("tree", "simple"): 28.0,
               ("ring", "ll"): 0.6, ("ring", "ll128"): 1.9, ("ring", "simple"): 3.4,
               ("nvls", "simple"): 23.0},
    "pcie": {("tree", "ll"): 1.0, ("tree", "ll128"): 1.9, ("tree", "simple"): 28.0,
             ("ring", "ll"): 1.0, ("ring", "ll128"): 2.5, ("ring", "simple"): 5.7},
    "network": {("tree", "ll"): 5.0, ("tree", "ll128"): 8.5, ("tree", "simple"): 28.0,
                ("ring", "ll"): 2.7, ("ring", "ll128"): 4.0, ("ring", "simple"): 14.0,
                ("nvls", "simple"): 18.0},
}
"""``hwLat`` of ``tuning.cc``: latency per hop by hardware, (algorithm, protocol), us. The
NVLS entry is its whole latency (NCCL adds no base for NVLS)."""

LL128_DATA = 0.92
"""LL128's share of the bus bandwidth (``tuning.cc``; 120 of 128 bytes carry data)."""
TREE_SHARE = 0.92
"""A tree's share of the ring's bus bandwidth (``tuning.cc``)."""
P2P_LL_THRESHOLD = 16384
"""Bytes per peer up to which NCCL's send/receive use LL (``NCCL_P2P_LL_THRESHOLD``)."""
P2P_HOPS: Literal["one", "ring"] = "one"
"""Hops an all-to-all pays: one (peers served at once) or a ring's ``n-1`` steps. Chosen on
the training sizes' folds (:mod:`simulator.validation.nccl_fit` ``--folds``)."""


LL_MAX_BW = 87.7
"""The tuner's cap on LL's bus bandwidth on one Ampere / Hopper node, GB/s (``llMaxBws``)."""
NVLS_ALG_SHARE = 5 / 6
"""The tuner's NVLS algorithm bandwidth per unit of bus bandwidth (``tuning.cc``)."""


@dataclass(frozen=True)
class Choice:
    """One (algorithm, protocol) NCCL would consider: the time NCCL's tuner predicts for it
    (``estimate``, what it ranks by) and the time it takes on this link (``seconds``)."""

    algorithm: Algorithm
    protocol: Protocol
    seconds: float
    estimate: float


@dataclass(frozen=True)
class _Rates:
    base_scale: float
    hop_scale: float
    bus: float  # bytes/s
    ll_bus: float | None  # bytes/s; None: the tuner's LL rule
    nvls_bw: float | None  # bytes/s of buffer
    nvls_us: float


def _tuner_rates(t: NcclTuning) -> _Rates:
    bus = (t.tuner_bus_bandwidth_gb_per_s or t.bus_bandwidth_gb_per_s) * 1e9
    return _Rates(1.0, 1.0, bus, None, bus * NVLS_ALG_SHARE, HOP_US[t.hardware].get(
        ("nvls", "simple"), 0.0))


def _link_rates(t: NcclTuning, op: Collective) -> _Rates:
    nvls = t.nvls_bandwidth_gb_per_s * 1e9 if t.nvls_bandwidth_gb_per_s else None
    bus = t.op_bus_bandwidth_gb_per_s.get(op, t.bus_bandwidth_gb_per_s)  # type: ignore[call-overload,arg-type]
    return _Rates(t.base_scale, t.hop_scale, bus * 1e9,
                  t.ll_bandwidth_gb_per_s * 1e9, nvls, t.nvls_latency_us)


def _menu(op: Collective, nbytes: float, n: int, t: NcclTuning,
          r: _Rates) -> dict[tuple[Algorithm, Protocol], float]:
    """Seconds of each (algorithm, protocol) with one set of rates."""
    hop = HOP_US[t.hardware]
    protocols: list[Protocol] = ["ll", "ll128", "simple"] if t.ll128 else ["ll", "simple"]

    def lat(a: Algorithm, p: Protocol, hops: float) -> float:
        return (r.base_scale * BASE_US[(a, p)] + r.hop_scale * hops * hop[(a, p)]) * 1e-6

    def ll(share: float) -> float:  # LL's bus bandwidth: the tuner's rule or the link's
        return min(LL_MAX_BW * 1e9, r.bus * share) if r.ll_bus is None else r.ll_bus

    out: dict[tuple[Algorithm, Protocol], float] = {}
    if op == "alltoall":
        p: Protocol = "ll" if nbytes / n <= P2P_LL_THRESHOLD else "simple"
        bw = ll(1 / 3) if p == "ll" else r.bus
        hops = 1 if P2P_HOPS == "one" else n - 1
        out[("ring", p)] = lat("ring", p, hops) + (n - 1) / n * nbytes / bw
        return out
    steps = 2 * (n - 1) if op == "allreduce" else n - 1
    for p in protocols:
        share = 1 / 4 if op == "allreduce" else 1 / 3
        bw = {"ll": ll(share), "ll128": LL128_DATA * r.bus, "simple": r.bus}[p]
        out[("ring", p)] = lat("ring", p, steps) + nbytes * steps / n / bw
    if op == "allreduce":
        depth = 2 * (n - 1) if t.hardware != "network" else 2 * math.ceil(math.log2(n))
        for p in protocols:
            bw = {"ll": TREE_SHARE * ll(1 / 3.8), "ll128": TREE_SHARE * r.bus * 7 / 9,
                  "simple": TREE_SHARE * r.bus}[p]
            out[("tree", p)] = lat("tree", p, depth) + 2 * nbytes / bw
    if t.nvls and n > 2 and r.nvls_bw is not None:
        moved = nbytes if op == "allreduce" else (n - 1) / n * nbytes
        out[("nvls", "simple")] = r.nvls_us * 1e-6 + moved / r.nvls_bw
    return out


def candidates(op: Collective, nbytes: float, ranks: int, t: NcclTuning) -> list[Choice]:
    """Every (algorithm, protocol) NCCL's tuner weighs for this call, with the tuner's
    estimate (NCCL's constants, the tuner's bus bandwidth) and the link's fitted time.

    ``nbytes`` is the buffer NCCL is given (the all-reduce buffer, the all-gather output /
    reduce-scatter input, the all-to-all buffer of one rank). Empty for one rank or no bytes.
    """
    if ranks <= 1 or nbytes <= 0:
        return []
    real = _menu(op, nbytes, ranks, t, _link_rates(t, op))
    guess = _menu(op, nbytes, ranks, t, _tuner_rates(t))
    return [Choice(a, p, sec, guess[(a, p)]) for (a, p), sec in real.items()]


def choose(op: Collective, nbytes: float, ranks: int, t: NcclTuning) -> Choice | None:
    """The (algorithm, protocol) NCCL's tuner launches: the lowest *predicted* time (its own
    estimate), which is not always the fastest on the link."""
    menu = candidates(op, nbytes, ranks, t)
    return min(menu, key=lambda c: c.estimate) if menu else None


def nccl_time(op: Collective, nbytes: float, ranks: int, t: NcclTuning) -> float:
    """Seconds of the collective as NCCL runs it: the tuner's choice, priced on the link
    (0 for one rank or no bytes)."""
    c = choose(op, nbytes, ranks, t)
    return c.seconds if c is not None else 0.0
