"""Resolve a scenario into engine objects: profiles, placement, cost models, KV capacity.

All checks that need profiles (memory fit, links that exist) happen here, before any
simulated time passes, and fail with one line naming the scenario file and key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simulator.cost.engine_memory import apply_convention
from simulator.cost.handoff import handoff_streams
from simulator.cost.host import host_model
from simulator.cost.memory import MemoryPlan, plan_memory
from simulator.cost.parallel import Parallelism, Precisions
from simulator.cost.speculative import SpeculativePredictor
from simulator.cost.step import InstanceCostModel, LinkSet
from simulator.engine.cluster import InstanceSpec
from simulator.engine.config import (
    EmpiricalLength,
    FixedLength,
    Length,
    LognormalLength,
    SharedPrefix,
    TraceArrival,
    UniformLength,
)
from simulator.engine.fabric import TransferPath
from simulator.engine.workload import load_trace
from simulator.errors import ConfigError, MemoryFitError
from simulator.hardware.engines import ServingEngineProfile, load_engine
from simulator.hardware.profiles import DeviceProfile, LinkProfile, Price
from simulator.hardware.registry import load_device, load_link
from simulator.models.arch import ModelConfig
from simulator.models.catalog import get_model, resolve_precisions
from simulator.runner.checks import check_model_settings
from simulator.runner.kernel_tables import predictor_for
from simulator.runner.moe_build import (
    comm_buffer_bytes,
    moe_cost_kwargs,
    pool_imbalance,
    redundant_experts,
    speculative_config,
)
from simulator.runner.paths import transfer_path
from simulator.runner.placement import Placement, place
from simulator.runner.scheduler_defaults import resolve_scheduler
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


def _keyed(exc: ConfigError, file: str | None, key: str) -> ConfigError:
    """Attribute ``exc`` to the scenario's key; a file it refers to goes in the message."""
    message = exc.message
    if exc.file is not None and exc.file != file:
        message = f"{message}: {exc.file}"
    return type(exc)(message, file=file or exc.file, key=exc.key or key)


def _link(name: str | None, file: str | None, key: str) -> LinkProfile | None:
    if name is None:
        return None
    try:
        return load_link(name)
    except ConfigError as exc:
        raise _keyed(exc, file, key) from None


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


def instance_links(placement: Placement, par: Parallelism, file: str | None,
                   key: str) -> LinkSet:
    """Links of an instance's collectives, from where its ranks sit.

    A stage's TP (and EP) group talks over the scale-up link when all its ranks share a
    scale-up domain, else over the scale-out network; PP activations cross the scale-out
    network when any two consecutive stages sit in different domains.
    """
    dev = placement.device
    up = _link(dev.scale_up_link, file, f"{key}.device")
    out = _link(dev.scale_out_link, file, f"{key}.device")

    def pick(inside: bool) -> LinkProfile | None:
        return (up or out) if inside else (out or up)

    tp_inside = all(placement.same_domain(range(s * par.tp, (s + 1) * par.tp))
                    for s in range(par.pp))
    group_link = pick(tp_inside)
    if par.tp > 1 and group_link is None:
        raise ConfigError(f"tp={par.tp} needs a link but device {dev.name} has no "
                          "scale_up_link or scale_out_link", file=file,
                          key=f"{key}.parallelism.tp")
    pp_link = None
    if par.pp > 1:
        pp_inside = all(placement.domain_of_rank(s * par.tp - 1) == placement.domain_of_rank(s * par.tp)
                        for s in range(1, par.pp))
        pp_link = pick(pp_inside)
        if pp_link is None:
            raise ConfigError(f"pp={par.pp} needs a link but device {dev.name} has none",
                              file=file, key=f"{key}.parallelism.pp")
    return LinkSet(tp=group_link if par.tp > 1 else None, pp=pp_link,
                   ep=group_link if par.ep > 1 else None)


def memory_error(model: ModelConfig, dev: DeviceProfile, par: Parallelism, mem: MemoryPlan,
                 precision: str, util: float) -> str:
    need = mem.weight_bytes + mem.activation_bytes
    return (
        f"{model.name} does not fit on {dev.name} with tp={par.tp} pp={par.pp}: each device "
        f"needs {mem.weight_bytes / GIB:.1f} GiB of {precision} weights + "
        f"{mem.activation_bytes / GIB:.1f} GiB activations/runtime = {need / GIB:.1f} GiB, "
        f"but has {mem.usable_bytes / GIB:.1f} GiB usable ({dev.memory_capacity_gib:g} GiB x "
        f"{util:g}); raise tp or pp, use lower-precision weights, or a larger device"
    )


@dataclass(frozen=True)
class _Resolved:
    """A pool with its profiles looked up and its parallelism made concrete."""

    pool: PoolSpec
    key: str
    device: DeviceProfile
    engine: ServingEngineProfile
    precisions: Precisions
    par: Parallelism
    block: int
    util: float


def _plan_for(model: ModelConfig, r: _Resolved, par: Parallelism) -> MemoryPlan:
    sched = r.pool.scheduler
    probe = InstanceCostModel(model, r.device, par, r.precisions, _probe_links(par),
                              **moe_cost_kwargs(r.pool, model, r.device, par, None, 1.0))
    plan = plan_memory(
        model, r.device, par, r.precisions, memory_utilization=r.util, block_size=r.block,
        max_batched_tokens=sched.max_num_batched_tokens, max_seqs=sched.max_num_seqs,
        runtime_reserve_gib=r.engine.runtime_reserve_gib + r.engine.cuda_graph_reserve_gib,
        kv_elements_per_token_per_layer_device=probe.kv_elements_per_token_per_layer_device(),
        redundant_experts=redundant_experts(r.pool),
        comm_buffer_bytes=comm_buffer_bytes(r.pool.moe, model, par),
    )
    return apply_convention(plan, r.util, r.engine.memory_fraction_of, par.dp)


def _probe_links(par: Parallelism) -> LinkSet:
    ideal = load_link("ideal")
    return LinkSet(tp=ideal if par.tp > 1 else None, pp=ideal if par.pp > 1 else None,
                   ep=ideal if par.ep > 1 else None)


def smallest_pp(model: ModelConfig, r: _Resolved, kv_tokens: int) -> tuple[int, MemoryPlan] | None:
    """Fewest pipeline stages whose devices hold the weights and ``kv_tokens`` of KV."""
    tp, ep = r.par.tp, r.par.ep
    per_device = r.device.memory_bytes * r.util
    lower = max(1, int(model.weight_bytes(r.precisions.weights) // (per_device * tp)))
    # Whole-layer stages stop at one layer per stage; balanced stages may split layers.
    most = model.num_layers * (8 if r.par.balanced_stages else 1)
    for pp in range(min(lower, most), most + 1):
        par = Parallelism(tp, pp, ep, r.par.balanced_stages, r.par.dp)
        mem = _plan_for(model, r, par)
        if mem.weight_bytes + mem.activation_bytes < mem.usable_bytes and \
                mem.kv_capacity_tokens >= kv_tokens:
            return pp, mem
    return None


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


def pool_device(pool: PoolSpec, base_dir: Path, file: str | None, key: str) -> DeviceProfile:
    """The pool's device profile: a shipped name, or a YAML path relative to the scenario
    file (as traces are); with the pool's ``device_usd_per_hour`` as its price."""
    name = pool.device
    if name.endswith((".yaml", ".yml")):
        path = Path(name) if Path(name).is_absolute() else base_dir / name
        if not path.is_file():
            raise ConfigError(f"device file {name!r} not found (looked for {path}; a device "
                              "path is relative to the scenario file)", file=file,
                              key=f"{key}.device")
        name = str(path)
    try:
        dev = load_device(name)
    except ConfigError as exc:
        raise _keyed(exc, file, f"{key}.device") from None
    if pool.device_usd_per_hour is not None:
        dev = dev.model_copy(update={"price": Price(
            usd_per_hour=pool.device_usd_per_hour, date="scenario",
            source=f"scenario override ({key}.device_usd_per_hour)")})
    return dev


def _resolve(scenario: Scenario, model: ModelConfig, base_engine: ServingEngineProfile,
             file: str | None, base_dir: Path) -> list[_Resolved]:
    out = []
    for i, given in enumerate(scenario.cluster.pools):
        key = f"cluster.pools[{i}]"
        dev = pool_device(given, base_dir, file, key)
        engine = base_engine
        if given.engine is not None:
            try:
                engine = load_engine(given.engine)
            except ConfigError as exc:
                raise _keyed(exc, file, f"{key}.engine") from None
        pool = given.model_copy(update={
            "scheduler": resolve_scheduler(given.scheduler, engine, file, key)})
        prec = resolve_precisions(model, pool.precision, scenario.precision)
        precisions = Precisions(prec["weights"], prec["activations"], prec["kv_cache"])
        ps = pool.parallelism
        try:
            par = Parallelism(ps.tp, 1 if ps.pp == "auto" else ps.pp, ps.ep,
                              ps.layer_split == "balanced", ps.dp)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, key=f"{key}.parallelism") from None
        sched = pool.scheduler
        r = _Resolved(pool, key, dev, engine, precisions, par,
                      sched.block_size or engine.block_size,
                      sched.memory_utilization or engine.memory_fraction(ps.tp * ps.dp))
        if ps.pp == "auto" or pool.kv_budget_tokens is not None:
            budget = pool.kv_budget_tokens or 0
            found = smallest_pp(model, r, budget)
            if found is None:
                most = model.num_layers * (8 if r.par.balanced_stages else 1)
                raise MemoryFitError(
                    f"{model.name} with {budget} KV tokens does not fit on {dev.name} even "
                    f"with tp={ps.tp} x pp={most} ({ps.tp * most} devices); raise tp, use "
                    f"lower precision, or lower kv_budget_tokens", file=file,
                    key=f"{key}.parallelism")
            need_pp, _ = found
            if ps.pp == "auto":
                par = Parallelism(ps.tp, need_pp, ps.ep, r.par.balanced_stages, ps.dp)
            elif ps.pp < need_pp:
                raise MemoryFitError(
                    f"{model.name} with {budget} KV tokens needs at least tp={ps.tp} x "
                    f"pp={need_pp} = {ps.tp * need_pp} {dev.name} devices per instance, "
                    f"given {ps.tp} x {ps.pp} = {ps.tp * ps.pp}; raise pp (or set pp: auto)",
                    file=file, key=f"{key}.parallelism.pp")
            r = _Resolved(pool, key, dev, engine, precisions, par, r.block, r.util)
        out.append(r)
    return out


def build_plan(scenario: Scenario, base_dir: Path | None = None,
               file: str | None = None) -> ClusterPlan:
    base_dir = base_dir or Path.cwd()
    try:
        model = get_model(scenario.model if not scenario.model.endswith(".json")
                          else str(base_dir / scenario.model))
    except ConfigError as exc:
        raise _keyed(exc, file, "model") from None
    check_model_settings(scenario, model, file)
    try:
        base_engine = load_engine(scenario.engine)
    except ConfigError as exc:
        raise _keyed(exc, file, "engine") from None
    try:
        max_prompt = _max_prompt(scenario, base_dir)
    except ConfigError as exc:
        raise _keyed(exc, file, "workload.arrival.path") from None

    min_prompt = _min_prompt(scenario)
    resolved = _resolve(scenario, model, base_engine, file, base_dir)
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
        predictor_class, tables = predictor_for(scenario.cost, dev, engine.name, file)
        imbalance = pool_imbalance(pool, model, par, file, key)
        for place_ in pool_places:
            links = instance_links(place_, par, file, key)
            try:
                costs.append(predictor_class(
                    model, dev, par, r.precisions, links,
                    step_overhead_s=engine.step_overhead_us * 1e-6,
                    per_sequence_overhead_s=engine.per_sequence_overhead_us * 1e-6,
                    graph_launch_factor=engine.graph_launch_factor if engine.cuda_graphs else 1.0,
                    engine=engine.name,
                    **moe_cost_kwargs(pool, model, dev, par, place_, imbalance),
                    **tables,
                    host=host_model(engine, pool.scheduler.max_num_seqs),
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
        mem = _plan_for(model, r, par)
        if mem.weight_bytes + mem.activation_bytes >= mem.usable_bytes:
            raise MemoryFitError(memory_error(model, dev, par, mem, r.precisions.weights, r.util),
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
            _link(name, file, f"cluster.kv_transfer.{link_key}")
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
