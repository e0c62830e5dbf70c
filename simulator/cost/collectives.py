"""Collectives and point-to-point transfers on a link.

A link with an ``nccl`` block prices all-reduce, all-gather, reduce-scatter and all-to-all as
NCCL runs them: the algorithm and protocol NCCL's tuner predicts cheapest, priced on the
link's fitted numbers (:mod:`simulator.cost.nccl`).
Other links use one alpha-beta model: ring all-reduce over ``n`` ranks moves
``2(n-1)/n * B`` bytes through each rank's link in ``2(n-1)`` steps; each step pays the
link's hop latency, each call a base latency. A one-rank group costs nothing.
"""

from __future__ import annotations

from typing import Literal

from simulator.cost.nccl import nccl_time
from simulator.hardware.profiles import LinkProfile

AttentionParallel = Literal["tp", "dp"]
"""How attention is split inside an MoE instance: TP (every rank holds every token) or
data-parallel attention (each rank owns a share of the requests)."""


def _alpha(link: LinkProfile, steps: int) -> float:
    return (link.collective_base_us + steps * link.collective_hop_us) * 1e-6


def allreduce_time(nbytes: float, ranks: int, link: LinkProfile) -> float:
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    if link.nccl is not None:
        return nccl_time("allreduce", nbytes, ranks, link.nccl)
    steps = 2 * (ranks - 1)
    return _alpha(link, steps) + (2 * (ranks - 1) / ranks) * nbytes / link.effective_bandwidth


def allgather_time(nbytes: float, ranks: int, link: LinkProfile,
                   op: str = "allgather") -> float:
    """All-gather (or, with ``op="reducescatter"``, reduce-scatter) of a ``nbytes`` buffer
    (the all-gather's output, the reduce-scatter's input)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    if link.nccl is not None:
        return nccl_time("reducescatter" if op == "reducescatter" else "allgather",
                         nbytes, ranks, link.nccl)
    steps = ranks - 1
    return _alpha(link, steps) + ((ranks - 1) / ranks) * nbytes / link.effective_bandwidth


def alltoall_time(nbytes_per_rank: float, ranks: int, link: LinkProfile) -> float:
    """All-to-all where each rank holds ``nbytes_per_rank`` and keeps 1/ranks of it."""
    if ranks <= 1 or nbytes_per_rank <= 0:
        return 0.0
    if link.nccl is not None:
        return nccl_time("alltoall", nbytes_per_rank, ranks, link.nccl)
    steps = ranks - 1
    moved = ((ranks - 1) / ranks) * nbytes_per_rank
    return _alpha(link, steps) + moved / link.effective_bandwidth


def p2p_time(nbytes: float, link: LinkProfile) -> float:
    """One send/recv: set-up overhead + latency + bytes at the achievable bandwidth."""
    if nbytes <= 0:
        return 0.0
    fixed = (link.per_transfer_overhead_us + link.latency_us) * 1e-6
    return fixed + nbytes / link.effective_bandwidth


def moe_token_exchange_time(
    attention: AttentionParallel, routed_bytes_per_rank: float, ep: int, link: LinkProfile | None
) -> float:
    """Communication an MoE layer adds to expert parallelism, on top of the TP all-reduces.

    With TP attention every rank already holds every token after the attention all-reduce:
    each rank runs its local experts on the tokens routed to them and the partial outputs
    are summed by the layer's existing all-reduce, so nothing else is sent (vLLM
    ``--enable-expert-parallel`` without data parallelism: ``FusedMoEParallelConfig``
    in ``vllm/model_executor/layers/fused_moe/config.py`` enables the all-to-all kernels
    only when ``dp_size > 1``). With data-parallel attention each rank owns different
    tokens, so routed copies go out (dispatch) and come back (combine): two all-to-alls.
    This generic alpha-beta pair is a bound for any all-to-all library; instances with
    data-parallel attention price DeepEP's kernels instead (:mod:`simulator.cost.moe_comm`).
    """
    if attention == "tp" or ep <= 1 or link is None:
        return 0.0
    return 2 * alltoall_time(routed_bytes_per_rank, ep, link)
