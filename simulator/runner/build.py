"""Resolve a scenario into engine objects: profiles, placement, cost models, KV capacity.

All checks that need profiles (memory fit, links that exist) happen here, before any
simulated time passes, and fail with one line naming the scenario file and key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simulator.cost.memory import MemoryPlan, plan_memory
from simulator.cost.parallel import Parallelism, Precisions
from simulator.cost.step import InstanceCostModel, LinkSet
from simulator.engine.cluster import InstanceSpec, TransferPath
from simulator.engine.config import EmpiricalLength, FixedLength, UniformLength
from simulator.engine.workload import load_trace
from simulator.errors import ConfigError, MemoryFitError
from simulator.hardware.engines import ServingEngineProfile, load_engine
from simulator.hardware.profiles import DeviceProfile, LinkProfile
from simulator.hardware.registry import load_device, load_link
from simulator.models.arch import ModelConfig
from simulator.models.catalog import get_model
from simulator.runner.placement import Placement, place
from simulator.scenario.schema import PoolSpec, Scenario


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
        return self.parallelism.devices * self.spec.instances


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

    def transfer_path(self, src: int, dst: int) -> TransferPath:
        return _transfer_path(self, src, dst)

    @property
    def pool_devices(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for p in self.pools:
            out[f"{p.spec.name}:devices"] = p.devices
            out[f"{p.spec.name}:instances"] = p.spec.instances
        return out


def _keyed(exc: ConfigError, file: str | None, key: str) -> ConfigError:
    return type(exc)(exc.message, file=exc.file or file, key=exc.key or key)


def _link(name: str | None, file: str | None, key: str) -> LinkProfile | None:
    if name is None:
        return None
    try:
        return load_link(name)
    except ConfigError as exc:
        raise _keyed(exc, file, key) from None


def _max_prompt(scenario: Scenario, base_dir: Path) -> int | None:
    w = scenario.workload
    if w.arrival.kind == "trace":
        path = Path(w.arrival.path)
        trace = load_trace(path if path.is_absolute() else base_dir / path)
        return int(trace.input_tokens.max()) if len(trace.input_tokens) else None
    spec = w.input_tokens
    extra = w.shared_prefix.tokens if w.shared_prefix else 0
    if isinstance(spec, FixedLength):
        return spec.tokens + extra
    if isinstance(spec, UniformLength):
        return spec.max_tokens + extra
    if isinstance(spec, EmpiricalLength):
        return max(spec.values) + extra
    return None


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
        f"needs {mem.weight_bytes / 1e9:.1f} GB of {precision} weights + "
        f"{mem.activation_bytes / 1e9:.1f} GB activations/runtime = {need / 1e9:.1f} GB, "
        f"but has {mem.usable_bytes / 1e9:.1f} GB usable ({dev.memory_capacity_gb:g} GB x "
        f"{util:g}); raise tp or pp, use lower-precision weights, or a larger device"
    )


def build_plan(scenario: Scenario, base_dir: Path | None = None,
               file: str | None = None) -> ClusterPlan:
    base_dir = base_dir or Path.cwd()
    try:
        model = get_model(scenario.model if not scenario.model.endswith(".json")
                          else str(base_dir / scenario.model))
    except ConfigError as exc:
        raise _keyed(exc, file, "model") from None
    try:
        base_engine = load_engine(scenario.engine)
    except ConfigError as exc:
        raise _keyed(exc, file, "engine") from None
    prec = scenario.precision
    precisions = Precisions(prec.weights, prec.activations, prec.kv_cache)
    try:
        max_prompt = _max_prompt(scenario, base_dir)
    except ConfigError as exc:
        raise _keyed(exc, file, "workload.arrival.path") from None

    devices: list[DeviceProfile] = []
    groups = []
    for i, pool in enumerate(scenario.cluster.pools):
        key = f"cluster.pools[{i}]"
        try:
            dev = load_device(pool.device)
        except ConfigError as exc:
            raise _keyed(exc, file, f"{key}.device") from None
        devices.append(dev)
        p = pool.parallelism
        groups.append((pool.name, dev, pool.instances, p.tp * p.pp))
    spread = {pool.name: pool.placement.nodes_per_instance
              for pool in scenario.cluster.pools if pool.placement.nodes_per_instance}
    placements = place(groups, spread)

    pools: list[PoolPlan] = []
    instances: list[InstanceSpec] = []
    cursor = 0
    for i, (pool, dev) in enumerate(zip(scenario.cluster.pools, devices, strict=True)):
        key = f"cluster.pools[{i}]"
        ps = pool.parallelism
        try:
            par = Parallelism(ps.tp, ps.pp, ps.ep)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, key=f"{key}.parallelism") from None
        sched = pool.scheduler
        engine = base_engine
        if pool.engine is not None:
            try:
                engine = load_engine(pool.engine)
            except ConfigError as exc:
                raise _keyed(exc, file, f"{key}.engine") from None
        block = sched.block_size or engine.block_size
        util = sched.memory_utilization or engine.memory_utilization
        pool_places = placements[cursor: cursor + pool.instances]
        cursor += pool.instances
        costs: list[InstanceCostModel] = []
        for place_ in pool_places:
            links = instance_links(place_, par, file, key)
            try:
                costs.append(InstanceCostModel(
                    model, dev, par, precisions, links,
                    step_overhead_s=engine.step_overhead_us * 1e-6,
                    per_sequence_overhead_s=engine.per_sequence_overhead_us * 1e-6,
                    graph_launch_factor=engine.graph_launch_factor if engine.cuda_graphs else 1.0,
                    moe_imbalance=pool.moe_imbalance,
                ))
            except ValueError as exc:
                raise ConfigError(str(exc), file=file, key=f"{key}.parallelism") from None
        kv_elems = costs[0].kv_elements_per_token_per_layer_device()
        mem = plan_memory(
            model, dev, par, precisions, memory_utilization=util, block_size=block,
            max_batched_tokens=sched.max_num_batched_tokens, max_seqs=sched.max_num_seqs,
            runtime_reserve_gib=engine.runtime_reserve_gib,
            kv_elements_per_token_per_layer_device=kv_elems,
        )
        if mem.weight_bytes + mem.activation_bytes >= mem.usable_bytes:
            raise MemoryFitError(memory_error(model, dev, par, mem, prec.weights, util),
                                 file=file, key=f"{key}.parallelism")
        if mem.kv_capacity_blocks < 1:
            raise MemoryFitError(
                f"no room for KV cache on {dev.name}: {mem.kv_bytes / 1e9:.2f} GB left after "
                f"weights and activations; raise tp or pp, lower max_num_batched_tokens, or "
                f"use a larger device", file=file, key=f"{key}.parallelism")
        if max_prompt is not None and pool.role != "prefill" and max_prompt + 1 > mem.kv_capacity_tokens:
            raise MemoryFitError(
                f"pool {pool.name!r} holds {mem.kv_capacity_tokens} KV tokens per instance, "
                f"less than the longest prompt ({max_prompt} tokens); raise tp/pp, use fp8 "
                f"KV, or shorten prompts", file=file, key=f"{key}.parallelism")
        kv_bytes_token = model.kv_bytes_per_token(prec.kv_cache)
        for j, cost in enumerate(costs):
            instances.append(InstanceSpec(
                name=f"{pool.name}/{j}", pool=pool.name, role=pool.role, cost=cost,
                kv_blocks=mem.kv_capacity_blocks, block_size=block, scheduler=sched,
                kv_bytes_per_token=kv_bytes_token,
            ))
        pools.append(PoolPlan(pool, dev, par, mem, pool_places, costs))

    kv = scenario.cluster.kv_transfer
    if kv.link is not None:
        _link(kv.link, file, "cluster.kv_transfer.link")
    return ClusterPlan(scenario, model, base_engine, pools, instances, placements, base_dir, file)


def _transfer_path(plan: ClusterPlan, src: int, dst: int) -> TransferPath:
    a, b = plan.placements[src], plan.placements[dst]
    par_a = plan.instances[src].cost.parallelism
    par_b = plan.instances[dst].cost.parallelism
    streams = max(1, min(par_a.tp, par_b.tp))
    kv = plan.scenario.cluster.kv_transfer
    conversion = kv.conversion_us_per_mb * 1e-6 / 1e6
    if kv.link is not None:
        profile = load_link(kv.link)
        return TransferPath(f"{kv.link}:{plan.instances[src].name}", profile, streams, conversion)
    same_kind = a.device.name == b.device.name
    if same_kind and set(a.nodes) == set(b.nodes) and len(a.nodes) == 1 and a.device.scale_up_link:
        profile = load_link(a.device.scale_up_link)
        return TransferPath(f"{profile.name}:node{a.nodes[0]}:{plan.instances[src].name}",
                            profile, streams, conversion)
    names = [n for n in (a.device.scale_out_link, b.device.scale_out_link) if n]
    if not names:
        names = [n for n in (a.device.host_link, b.device.host_link) if n]
    if not names:
        raise ConfigError(f"no network link between {a.device.name} and {b.device.name}",
                          file=plan.file, key="cluster.kv_transfer.link")
    profiles = [load_link(n) for n in names]
    slowest = min(profiles, key=lambda p: p.effective_bandwidth)
    return TransferPath(f"{slowest.name}:{plan.instances[src].name}", slowest, streams, conversion)

