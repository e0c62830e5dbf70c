"""A pool's MoE settings made concrete: EP group placement, expert load, DeepEP buffers."""

from __future__ import annotations

from typing import Any

from simulator.cost.expert_load import (
    given_popularity,
    imbalance,
    zipf_popularity,
)
from simulator.cost.moe_comm import NORMAL_BUFFER_BYTES, EPGroup, low_latency_buffer_bytes
from simulator.cost.parallel import Parallelism
from simulator.cost.speculative import Acceptance, SpeculativeConfig
from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile
from simulator.hardware.registry import load_link
from simulator.models.arch import ModelConfig
from simulator.runner.placement import Placement
from simulator.scenario.moe_spec import MoESpec
from simulator.scenario.schema import PoolSpec
from simulator.scenario.speculative_spec import SpeculativeSpec


def redundant_experts(pool: PoolSpec) -> int:
    return pool.moe.expert_load.redundant_experts if pool.moe is not None else 0


def pool_imbalance(pool: PoolSpec, model: ModelConfig, par: Parallelism, file: str | None,
                   key: str) -> float:
    """The hottest EP rank's load over the mean: from the expert load, else the scalar."""
    spec = pool.moe
    if spec is None or not model.is_moe or spec.expert_load.popularity == "uniform":
        return pool.moe_imbalance
    load = spec.expert_load
    ranks = par.ep
    if load.popularity == "given":
        assert load.weights is not None
        if len(load.weights) != model.num_experts:
            raise ConfigError(f"{len(load.weights)} expert weights given, {model.name} has "
                              f"{model.num_experts} routed experts", file=file,
                              key=f"{key}.moe.expert_load.weights")
        popularity = given_popularity(list(load.weights))
    else:
        popularity = zipf_popularity(model.num_experts, load.zipf_exponent, load.seed)
    try:
        return imbalance(popularity, ranks, load.redundant_experts, load.eplb)
    except ValueError as exc:
        raise ConfigError(f"{exc} (parallelism.ep={ranks})", file=file,
                          key=f"{key}.moe.expert_load") from None


def comm_buffer_bytes(spec: MoESpec | None, model: ModelConfig, par: Parallelism) -> float:
    """DeepEP buffers on every device of a data-parallel-attention instance."""
    if par.dp <= 1 or not model.is_moe:
        return 0.0
    mode = spec.deepep_mode if spec is not None else "auto"
    tokens = spec.low_latency_max_tokens_per_rank if spec is not None else 128
    out = 0.0
    if mode in ("auto", "normal"):
        out += NORMAL_BUFFER_BYTES
    if mode in ("auto", "low_latency"):
        out += low_latency_buffer_bytes(tokens, model.hidden_size, model.num_experts)
    return out


def ep_group(placement: Placement | None, device: DeviceProfile, par: Parallelism,
             spec: MoESpec | None) -> EPGroup | None:
    """The instance's EP group: ranks per NVLink domain from where its devices sit."""
    if par.dp <= 1:
        return None
    ranks = par.ep
    if placement is None:
        per_node = min(ranks, device.scale_up_domain)
    else:
        first = placement.domain_of_rank(0)
        per_node = sum(1 for r in range(ranks) if placement.domain_of_rank(r) == first)
    up = load_link(device.scale_up_link) if device.scale_up_link else None
    out = load_link(device.scale_out_link) if device.scale_out_link else None
    return EPGroup(ranks, per_node, up, out,
                   spec.max_nodes_per_token if spec is not None else None)


def moe_cost_kwargs(pool: PoolSpec, model: ModelConfig, device: DeviceProfile,
                    par: Parallelism, placement: Placement | None, imbalance_: float,
                    ) -> dict[str, Any]:
    spec = pool.moe
    return {
        "ep_group": ep_group(placement, device, par, spec) if model.is_moe else None,
        "deepep_mode": spec.deepep_mode if spec is not None else "auto",
        "two_batch_overlap": bool(spec is not None and spec.two_batch_overlap),
        "redundant_experts": redundant_experts(pool),
        "moe_imbalance": imbalance_,
    }


def speculative_config(spec: SpeculativeSpec) -> SpeculativeConfig:
    """The pool's speculative setting as the cost layer's acceptance and draft cost."""
    k = spec.draft_tokens
    if spec.acceptance_rates is not None:
        acceptance = Acceptance.from_rates(list(spec.acceptance_rates))
    elif spec.acceptance_histogram is not None:
        acceptance = Acceptance.from_histogram(list(spec.acceptance_histogram))
    else:
        assert spec.acceptance_length is not None
        acceptance = Acceptance.from_mean(spec.acceptance_length, k)
    layers = spec.draft_layers
    if layers is None:
        layers = 0.0 if spec.method == "ngram" else 1.0
    return SpeculativeConfig(spec.method, acceptance, layers, spec.host_us_per_step)
