"""Resolve a scenario into engine objects: profiles, placement, cost models, KV capacity.

All checks that need profiles (memory fit, links that exist) happen here, before any
simulated time passes, and fail with one line naming the scenario file and key. Each
pool's profiles, parallelism and memory plan are resolved in
:mod:`simulator.runner.pool_build`; this module places the pools, builds their cost
models and instance specs, and checks what spans the whole scenario (prompts against KV
capacity, fault targets, links).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simulator.cost.dp_attention import rank_limit
from simulator.cost.handoff import handoff_streams
from simulator.cost.host import host_model
from simulator.cost.memory import MemoryPlan
from simulator.cost.parallel import Parallelism
from simulator.cost.speculative import SpeculativePredictor
from simulator.cost.step import InstanceCostModel
from simulator.engine.cluster import InstanceSpec
from simulator.engine.fabric import TransferPath
from simulator.engine.workload import load_trace
from simulator.engine.workload_spec import (
    EmpiricalLength,
    FixedLength,
    Length,
    LognormalLength,
    SharedPrefix,
    TraceArrival,
    UniformLength,
)
from simulator.errors import ConfigError, MemoryFitError
from simulator.hardware.engines import ServingEngineProfile, load_engine
from simulator.hardware.profiles import DeviceProfile
from simulator.models.arch import ModelConfig
from simulator.models.catalog import get_model, resolve_precisions
from simulator.runner.checks import check_model_settings
from simulator.runner.kernel_tables import predictor_for
from simulator.runner.moe_build import (
    moe_cost_kwargs,
    pool_imbalance,
    speculative_config,
)
from simulator.runner.paths import transfer_path
from simulator.runner.placement import Placement, place
from simulator.runner.pool_build import (
    instance_links,
    keyed,
    link_or_none,
    memory_error,
    plan_for,
    resolve_pools,
)
from simulator.runner.tier_build import pool_tier_routes
from simulator.scenario.schema import PoolSpec, PrecisionSpec, Scenario
from simulator.units import GIB


@dataclass(frozen=True)
class PoolPlan:
    spec: PoolSpec
    device: DeviceProfile
    parallelism: Parallelism
    memory: MemoryPlan
    placements: list[Placement]
    cost_models: list[InstanceCostModel]

    @property
    def devices(self) -> int:
        """Devices provisioned for the pool (its maximum size when it autoscales)."""
        return self.parallelism.devices * self.spec.max_instances


@dataclass(frozen=True)
class ClusterPlan:
    scenario: Scenario
    model: ModelConfig
    engine: ServingEngineProfile
    pools: list[PoolPlan]
    instances: list[InstanceSpec]
    placements: list[Placement]
    base_dir: Path
    file: str | None
    paths: dict[tuple[int, int], TransferPath] = field(default_factory=dict, compare=False,
                                                       repr=False)

    def transfer_path(self, src: int, dst: int) -> TransferPath:
        return _transfer_path(self, src, dst)

    @property
    def pool_devices(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pools:
            out[f"{p.spec.name}:devices"] = p.devices
            out[f"{p.spec.name}:instances"] = p.spec.max_instances
        return out


def _max_prompt(scenario: Scenario, base_dir: Path) -> int | None:
    w = scenario.workload
    if isinstance(w.arrival, TraceArrival):
        path = Path(w.arrival.path)
        trace = load_trace(path if path.is_absolute() else base_dir / path,
                           skip_bad_rows=w.arrival.skip_bad_rows)
        return int(trace.input_tokens.max()) if len(trace.input_tokens) else None
    longest = [_longest_prompt(src.input_tokens, src.shared_prefix) for src in w.sources]
    return None if None in longest else max(x for x in longest if x is not None)


def _longest_prompt(spec: Length | None, prefix: SharedPrefix | None) -> int | None:
    extra = prefix.tokens if prefix else 0
    if isinstance(spec, FixedLength):
        return spec.tokens + extra
    if isinstance(spec, UniformLength):
        return spec.max_tokens + extra
    if isinstance(spec, EmpiricalLength):
        return max(spec.values) + extra
    return None


def _min_prompt(scenario: Scenario) -> int | None:
    """The shortest prompt the workload can issue (None for traces)."""
    w = scenario.workload
    if w.is_trace:
        return None
    out: int | None = None
    for src in w.sources:
        spec = src.input_tokens
        if spec is None:
            return None
        lowest = {FixedLength: lambda x: x.tokens, UniformLength: lambda x: x.min_tokens,
                  EmpiricalLength: lambda x: min(x.values),
                  LognormalLength: lambda x: x.min_tokens}[type(spec)](spec)
        if src.shared_prefix is not None and src.shared_prefix.fraction >= 1.0:
            lowest += src.shared_prefix.tokens
        out = lowest if out is None else min(out, lowest)
    return out


def with_resolved_precision(scenario: Scenario, model: ModelConfig) -> Scenario:
    """The scenario with every precision spelled out as simulated (unset fields take the
    model's released precision), for ``scenario.resolved.yaml``."""
    top = resolve_precisions(model, scenario.precision)
    pools = [p.model_copy(update={"precision": PrecisionSpec(**resolve_precisions(  # type: ignore[arg-type]
        model, p.precision, scenario.precision))}) if p.precision is not None else p
        for p in scenario.cluster.pools]
    cluster = scenario.cluster.model_copy(update={"pools": pools})
    out = scenario.model_copy(update={"precision": PrecisionSpec(**top),  # type: ignore[arg-type]
                                      "cluster": cluster})
    out._source = scenario.source_file
    return out


def build_plan(scenario: Scenario, base_dir: Path | None = None,
               file: str | None = None) -> ClusterPlan:
    base_dir = base_dir or Path.cwd()
    try:
        model = get_model(scenario.model if not scenario.model.endswith(".json")
                          else str(base_dir / scenario.model))
    except ConfigError as exc:
        raise keyed(exc, file, "model") from None
    check_model_settings(scenario, model, file)
    try:
        base_engine = load_engine(scenario.engine)
    except ConfigError as exc:
        raise keyed(exc, file, "engine") from None
    try:
        max_prompt = _max_prompt(scenario, base_dir)
    except ConfigError as exc:
        raise keyed(exc, file, "workload.arrival.path") from None

    min_prompt = _min_prompt(scenario)
    resolved = resolve_pools(scenario, model, base_engine, file, base_dir)
    groups = [(r.pool.name, r.device, r.pool.max_instances, r.par.devices) for r in resolved]
    spread = {r.pool.name: r.pool.placement.nodes_per_instance
              for r in resolved if r.pool.placement.nodes_per_instance}
    placements = place(groups, spread)

    pools: list[PoolPlan] = []
    instances: list[InstanceSpec] = []
    cursor = 0
    for r in resolved:
        pool, dev, par, engine, key = r.pool, r.device, r.par, r.engine, r.key
        pool_places = placements[cursor: cursor + pool.max_instances]
        cursor += pool.max_instances
        costs: list[InstanceCostModel] = []
        predictor_class, tables = predictor_for(scenario.cost, dev, engine.kernel_engine, file)
        imbalance = pool_imbalance(pool, model, par, file, key)
        for place_ in pool_places:
            links = instance_links(place_, par, file, key)
            try:
                costs.append(predictor_class(
                    model, dev, par, r.precisions, links,
                    step_overhead_s=engine.step_overhead_us * 1e-6,
                    per_sequence_overhead_s=engine.per_sequence_overhead_us * 1e-6,
                    graph_launch_factor=engine.graph_launch_factor if engine.cuda_graphs else 1.0,
                    engine=engine.kernel_engine,
                    norm_fusion_bytes=engine.norm_fusion_bytes(dev.name, par.tp,
                                                               model.hidden_size),
                    **moe_cost_kwargs(pool, model, dev, par, place_, imbalance),
                    **tables,
                    # Each attention rank's executor captures its own graphs, up to its
                    # own batch limit; the step is priced on one rank's share.
                    host=host_model(engine, rank_limit(pool.scheduler.max_num_seqs, par.dp),
                                    dev.memory_capacity_gib, par.tp),
                ))
            except ValueError as exc:
                raise ConfigError(str(exc), file=file, key=f"{key}.parallelism") from None
        spec_cfg = speculative_config(pool.speculative) if pool.speculative else None
        if spec_cfg is not None:
            if par.pp > 1:
                raise ConfigError("speculative decoding is modelled with pp = 1 only",
                                  file=file, key=f"{key}.speculative")
            costs = [SpeculativePredictor(c, spec_cfg, model.num_layers)  # type: ignore[misc]
                     for c in costs]
        mem = plan_for(model, r, par)
        if mem.weight_bytes + mem.activation_bytes >= mem.usable_bytes:
            raise MemoryFitError(memory_error(model, dev, par, mem, r.precisions.weights, r.util,
                                              r.engine.memory_fraction_of),
                                 file=file, key=f"{key}.parallelism")
        if mem.kv_capacity_blocks < 1:
            raise MemoryFitError(
                f"no room for KV cache on {dev.name}: {mem.kv_bytes / GIB:.2f} GiB left after "
                f"weights and activations; raise tp or pp, lower max_num_batched_tokens, or "
                f"use a larger device", file=file, key=f"{key}.parallelism")
        # A request's KV lives on one attention rank (all of the instance's with dp = 1).
        rank_kv = mem.kv_capacity_tokens // par.dp
        if max_prompt is not None and pool.role != "prefill" and max_prompt + 1 > rank_kv:
            raise MemoryFitError(
                f"pool {pool.name!r} holds {rank_kv} KV tokens per attention rank "
                f"on {dev.name}, less than the longest prompt ({max_prompt} tokens); raise "
                f"tp/pp, use fp8 KV, or shorten prompts", file=file, key=f"{key}.parallelism")
        if min_prompt is not None and min_prompt + 1 > mem.kv_capacity_tokens:
            raise MemoryFitError(
                f"pool {pool.name!r} holds {mem.kv_capacity_tokens} KV tokens per instance "
                f"on {dev.name}, less than the shortest prompt ({min_prompt} tokens): no "
                f"request could ever run; raise tp/pp, use fp8 KV, or shorten prompts",
                file=file, key=f"{key}.parallelism")
        kv_bytes_token = model.kv_bytes_per_token(r.precisions.kv_cache)
        cold_start = 0.0
        if pool.autoscale is not None:
            a = pool.autoscale
            cold_start = mem.weight_bytes / (a.load_bandwidth_gb_per_s * 1e9) + a.startup_s
        tier_routes_of = pool_tier_routes(scenario, model, pool, par, r.precisions.kv_cache,
                                          pool_places, file, key)
        for j, cost in enumerate(costs):
            instances.append(InstanceSpec(
                name=f"{pool.name}/{j}", pool=pool.name, role=pool.role, cost=cost,
                kv_blocks=mem.kv_capacity_blocks, block_size=r.block, scheduler=pool.scheduler,
                kv_bytes_per_token=kv_bytes_token, active=j < pool.instances,
                cold_start_s=cold_start, devices=par.devices, first_token=engine.first_token,
                max_num_seqs_per=engine.max_num_seqs_per,
                speculative=spec_cfg.acceptance if spec_cfg is not None else None,
                tiers=tier_routes_of[j],
            ))
        pools.append(PoolPlan(pool, dev, par, mem, pool_places, costs))

    names = {spec.name for spec in instances}
    pool_names = {r.pool.name for r in resolved}
    for i, fault in enumerate(scenario.faults):
        target = getattr(fault, "target", None)
        if target is not None and target not in names:
            raise ConfigError(f"unknown target instance {target!r}; instances: "
                              f"{', '.join(sorted(names))}", file=file, key=f"faults[{i}].target")
        pool_ref = getattr(fault, "pool", None)
        if pool_ref is not None and pool_ref not in pool_names:
            raise ConfigError(f"unknown pool {pool_ref!r}; pools: {', '.join(sorted(pool_names))}",
                              file=file, key=f"faults[{i}].pool")
    kv = scenario.cluster.kv_transfer
    for link_key, name in (("link", kv.link), ("network", kv.network)):
        if name is not None:
            link_or_none(name, file, f"cluster.kv_transfer.{link_key}")
    return ClusterPlan(scenario, model, base_engine, pools, instances, placements, base_dir, file)


def _transfer_path(plan: ClusterPlan, src: int, dst: int) -> TransferPath:
    """The route of a KV hand-off from where the two instances sit (see runner/paths.py)."""
    cached = plan.paths.get((src, dst))
    if cached is not None:
        return cached
    a, b = plan.placements[src], plan.placements[dst]
    cost_a, cost_b = plan.instances[src].cost, plan.instances[dst].cost
    streams = handoff_streams(plan.model, cost_a.precisions.kv_cache, cost_a.parallelism,
                              cost_b.parallelism)
    kv = plan.scenario.cluster.kv_transfer
    path = transfer_path(a, b, plan.instances[src].name, streams, forced=kv.link,
                         network=kv.network, spine_oversubscription=kv.spine_oversubscription,
                         conversion_s_per_byte=kv.conversion_us_per_mb * 1e-12,
                         conversion_s_per_token=kv.conversion_us_per_token * 1e-6)
    plan.paths[(src, dst)] = path
    return path
