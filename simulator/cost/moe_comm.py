"""MoE dispatch and combine across an expert-parallel group, as DeepEP runs them.

With data-parallel attention every rank owns different tokens, so each MoE layer sends
every token's hidden state to the ranks holding its top-k experts (dispatch) and brings
the weighted expert outputs back (combine). DeepEP (deepseek-ai/DeepEP, README
"Performance", 2025-06) ships two kernel families, and SGLang picks between them per batch
(``--deepep-mode auto``: normal for prefill/extend batches, low-latency for decode):

* **normal** kernels send a token once per destination *node* over RDMA and forward it over
  NVLink to the ranks inside that node (DeepSeek-V3's group-limited routing keeps a token
  on at most ``M`` nodes, so the RDMA traffic per token is capped at ``M`` copies). The
  README measures the RDMA bottleneck bandwidth on H800 with one CX7 400 Gb/s NIC per GPU
  (~50 GB/s) at 4096 tokens, FP8 dispatch / BF16 combine: 43, 58 and 51 GB/s at EP 16, 32
  and 64 (values above 50 GB/s are DeepEP's own byte accounting); inside one node the
  bottleneck is NVLink (153 / 158 GB/s of ~160 on H800).
* **low-latency** kernels send every (token, expert) copy directly, CUDA-graph friendly,
  measured at 128 tokens per rank: dispatch 77-194 us and combine 114-369 us for EP 8-256,
  i.e. 98 -> 39 GB/s (dispatch) and 127 -> 39 GB/s (combine) of logical bandwidth.

The measured bandwidths are the curve; they are scaled by the ratio of the scenario's
link bandwidth to the 50 GB/s NIC they were measured on. The README figures are per-size
points, not a fit, so EP sizes between them interpolate on log2(EP) and sizes outside are
clamped. Within one node both kernels run on NVLink at the link's effective bandwidth,
unless the group carries the device's measured kernels (:class:`DeepEPFits`, fitted by
:mod:`simulator.validation.deepep_fit` on NVIDIA AIConfigurator's single-node DeepEP tables,
EP 8): then the NVLink leg is priced as measured, with a fixed latency (tens of us) and the
low-latency kernels' throughput limited by the SMs they launch (one per expert group,
:func:`low_latency_sms`). Across nodes the RDMA model above stands; the measured NVLink leg
is its floor (a group spanning nodes never exchanges faster than one NVLink domain would),
and for the normal kernels it prices the NVLink forwarding leg.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from simulator.hardware.operator_fits import DeepEPCost, DeepEPFits
from simulator.hardware.profiles import LinkProfile

DeepEPKernel = Literal["normal", "low_latency"]
DeepEPMode = Literal["auto", "normal", "low_latency"]

_MEASURED_NIC_GB_PER_S = 50.0
"""DeepEP's benchmark NIC: ConnectX-7 InfiniBand 400 Gb/s, ~50 GB/s per direction."""
_NORMAL_RDMA = {"dispatch": ((16, 43.0), (32, 58.0), (64, 51.0)),
                "combine": ((16, 43.0), (32, 57.0), (64, 50.0))}
_LOW_LATENCY = {"dispatch": ((8, 98.0), (16, 63.0), (32, 48.0), (64, 43.0), (128, 39.0),
                             (256, 39.0)),
                "combine": ((8, 127.0), (16, 74.0), (32, 53.0), (64, 46.0), (128, 39.0),
                            (256, 40.0))}
FP8_SCALE_BLOCK = 128
"""DeepEP FP8 dispatch carries one fp32 scale per 128 channels."""


def _curve(points: tuple[tuple[int, float], ...], ep: int) -> float:
    """GB/s at ``ep`` ranks: linear in log2(ep) between measured points, clamped outside."""
    x = math.log2(ep)
    xs = [math.log2(e) for e, _ in points]
    ys = [v for _, v in points]
    if x <= xs[0]:
        return ys[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys, strict=True), zip(xs[1:], ys[1:], strict=True),
                                  strict=False):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return ys[-1]


def _missed(total: int, chosen: int, in_bin: float) -> float:
    """P(a bin of ``in_bin`` of ``total`` items gets none of ``chosen`` distinct draws)."""
    p = 1.0
    for i in range(chosen):
        if total - i <= 0:
            return 0.0
        p *= max(total - in_bin - i, 0) / (total - i)
    return p


@dataclass(frozen=True, slots=True)
class EPGroup:
    """Where the ranks of one expert-parallel group sit and which links join them."""

    ranks: int
    ranks_per_node: int
    """Ranks sharing one NVLink domain (the group spans ``ranks / ranks_per_node`` nodes)."""
    nvlink: LinkProfile | None
    rdma: LinkProfile | None
    max_nodes_per_token: int | None = None
    """Group-limited routing: a token's experts lie on at most this many nodes
    (DeepSeek-V3 ``topk_group: 4``); None = unrestricted top-k."""
    measured: DeepEPFits | None = None
    """The device's DeepEP kernels measured inside one NVLink domain (None: the NVLink
    leg runs at the scale-up link's effective bandwidth)."""
    sm_count: int | None = None
    """SMs per device (the low-latency kernels' launch size); needed with ``measured``."""

    def __post_init__(self) -> None:
        if self.ranks < 1 or self.ranks_per_node < 1:
            raise ValueError("an EP group needs >= 1 rank and >= 1 rank per node")
        if self.nodes > 1 and self.rdma is None:
            raise ValueError(f"an EP group over {self.nodes} nodes needs a scale-out link")
        if self.measured is not None and not self.sm_count:
            raise ValueError("measured DeepEP kernels need the device's sm_count")

    @property
    def nodes(self) -> int:
        return -(-self.ranks // min(self.ranks_per_node, self.ranks))

    def nodes_per_token(self, experts: int, top_k: int) -> float:
        """Expected distinct nodes a token's top-k experts lie on (experts spread evenly)."""
        n = self.nodes
        reached = n * (1.0 - _missed(experts, top_k, experts / n)) if n > 1 else 1.0
        if self.max_nodes_per_token is not None:
            reached = min(reached, float(self.max_nodes_per_token))
        return reached

    def ranks_per_token(self, experts: int, top_k: int) -> float:
        """Expected distinct ranks holding a token's top-k experts."""
        r = self.ranks
        return r * (1.0 - _missed(experts, top_k, experts / r))


def deepep_kernel(mode: DeepEPMode, prefill_tokens: int) -> DeepEPKernel:
    """The kernel family a step uses: SGLang's ``auto`` picks normal when the batch extends
    (prefill) and low-latency for decode-only batches."""
    if mode == "auto":
        return "normal" if prefill_tokens > 0 else "low_latency"
    return mode


def low_latency_sms(experts: int, sm_count: int) -> int:
    """SMs DeepEP's low-latency dispatch and combine launch: one warp group per expert,
    ``ceil(experts / sm_count)`` groups per SM, so ``ceil(experts / groups)`` SMs
    (deepseek-ai/DeepEP csrc/kernels/internode_ll.cu, host launchers of ``dispatch`` and
    ``combine``): 8 experts run on 8 SMs, 256 on 128 of an H100's 132."""
    groups = -(-experts // sm_count)
    return -(-experts // groups)


def payload_bytes(phase: Literal["dispatch", "combine"], hidden: int) -> float:
    """Bytes of one token copy: FP8 with one fp32 scale per 128 channels for dispatch,
    BF16 for combine."""
    return hidden + 4 * hidden / FP8_SCALE_BLOCK if phase == "dispatch" else 2.0 * hidden


def nvlink_copies(kernel: DeepEPKernel, ranks: int, experts: int, top_k: int) -> float:
    """Remote copies of one token inside an NVLink domain of ``ranks``: the low-latency
    kernels send one per selected expert, the normal kernels one per distinct rank
    (expected under uniform routing); the copy to the token's own rank stays local."""
    group = EPGroup(ranks, ranks, None, None)
    per_token = float(top_k) if kernel == "low_latency" else group.ranks_per_token(experts, top_k)
    return per_token * (ranks - 1) / ranks


def _measured(cost: DeepEPCost, kernel: DeepEPKernel, group: EPGroup, tokens: float,
              hidden: int, width: float, copies: float, experts: int, hottest: float) -> float:
    """Seconds of the measured NVLink kernel for ``copies`` remote copies per token."""
    assert group.measured is not None
    assert group.sm_count is not None
    sms = (low_latency_sms(experts, group.sm_count) if kernel == "low_latency"
           else group.measured.normal_sms)
    return float(cost.seconds(tokens, width, copies, hidden, experts, sms, hottest))


def _scaled(gb_per_s: float, link: LinkProfile) -> float:
    return gb_per_s * 1e9 * link.bandwidth_gb_per_s / _MEASURED_NIC_GB_PER_S


def alltoall_seconds(phase: Literal["dispatch", "combine"], kernel: DeepEPKernel,
                     tokens_per_rank: float, hidden: int, experts: int, top_k: int,
                     group: EPGroup, hottest_factor: float = 1.0) -> float:
    """Seconds of one dispatch or combine of ``tokens_per_rank`` tokens on every rank.

    Dispatch sends FP8 with block scales, combine BF16 (DeepEP's production setting). The
    rank holding the most-loaded experts receives ``hottest_factor`` times the average,
    and everyone waits for it.
    """
    if group.ranks <= 1 or tokens_per_rank <= 0:
        return 0.0
    width = payload_bytes(phase, hidden)
    measured = getattr(group.measured, kernel)[phase] if group.measured is not None else None
    in_domain = min(group.ranks, group.ranks_per_node)
    nvl_floor = 0.0
    if measured is not None and in_domain > 1:
        # The NVLink leg as measured: the whole exchange in one domain, else the floor of
        # the one across nodes (the same tokens never cost less over more ranks).
        nvl_floor = _measured(measured, kernel, group, tokens_per_rank, hidden, width,
                              nvlink_copies(kernel, in_domain, experts, top_k), experts,
                              hottest_factor)
        if group.nodes == 1:
            return nvl_floor
    if group.nodes == 1:
        link = group.nvlink or group.rdma
        assert link is not None
        if kernel == "low_latency":
            copies = top_k * (group.ranks - 1) / group.ranks
        else:
            copies = group.ranks_per_token(experts, top_k) * (group.ranks - 1) / group.ranks
        nbytes = tokens_per_rank * copies * width * hottest_factor
        return (link.latency_us + link.collective_base_us) * 1e-6 + nbytes / link.effective_bandwidth
    rdma = group.rdma
    assert rdma is not None
    fixed = (rdma.latency_us + rdma.collective_base_us) * 1e-6
    if kernel == "low_latency":
        # Every (token, expert) copy goes out directly; the measured curve is logical bytes.
        nbytes = tokens_per_rank * top_k * width * hottest_factor
        return max(fixed + nbytes / _scaled(_curve(_LOW_LATENCY[phase], group.ranks), rdma),
                   nvl_floor)
    # Normal: one RDMA copy per remote node reached, then NVLink forwarding in the node.
    nodes = group.nodes_per_token(experts, top_k)
    remote = nodes * (group.nodes - 1) / group.nodes
    rdma_s = tokens_per_rank * remote * width * hottest_factor / _scaled(
        _curve(_NORMAL_RDMA[phase], group.ranks), rdma)
    nvl_s = 0.0
    per_node = group.ranks_per_token(experts, top_k) / max(nodes, 1.0)
    if measured is not None and in_domain > 1:
        # NVLink forwarding as measured (its fixed latency is the floor below).
        nvl_s = _measured(measured, kernel, group, tokens_per_rank, hidden, width,
                          nodes * per_node, experts, hottest_factor) - \
            _measured(measured, kernel, group, 0.0, hidden, width, 0.0, experts, 1.0)
    elif group.nvlink is not None:
        nvl_s = tokens_per_rank * nodes * per_node * width * hottest_factor / \
            group.nvlink.effective_bandwidth
    return max(fixed + max(rdma_s, nvl_s), nvl_floor)


def moe_exchange_seconds(kernel: DeepEPKernel, tokens_per_rank: float, hidden: int,
                         experts: int, top_k: int, group: EPGroup,
                         hottest_factor: float = 1.0) -> float:
    """Dispatch + combine of one MoE layer."""
    args = (kernel, tokens_per_rank, hidden, experts, top_k, group, hottest_factor)
    return alltoall_seconds("dispatch", *args) + alltoall_seconds("combine", *args)


def low_latency_buffer_bytes(max_tokens_per_rank: int, hidden: int, experts: int) -> float:
    """RDMA buffer of DeepEP's low-latency mode on one rank.

    Every local expert may receive ``max_tokens_per_rank`` tokens from every rank, so the
    receive buffers hold ``experts x max_tokens`` FP8 dispatch rows and BF16 combine rows,
    double-buffered for overlap (``Buffer.get_low_latency_rdma_size_hint`` sizes it the same
    way in deep_ep/buffer.py; the README advises keeping ``max_tokens`` under 256).
    """
    dispatch = hidden + 4 * hidden / FP8_SCALE_BLOCK + 16
    combine = 2 * hidden
    return 2.0 * experts * max_tokens_per_rank * (dispatch + combine)


NORMAL_BUFFER_BYTES = 2.0 * 1e9
"""NVLink + RDMA buffers of the normal kernels (1 GB each, SGLang's DeepEP buffer default
``num_nvl_bytes`` / ``num_rdma_bytes`` order of magnitude; an estimate, not a measurement)."""
