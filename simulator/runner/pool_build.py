"""One pool of a scenario resolved: its device and engine profiles, precisions,
parallelism (``pp: auto`` made concrete), memory plan and the links of its collectives.

Every check that needs a profile fails here with one line naming the scenario file and
the pool's key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from simulator.cost.engine_memory import apply_convention
from simulator.cost.memory import MemoryPlan, plan_memory
from simulator.cost.parallel import Parallelism, Precisions
from simulator.cost.step import InstanceCostModel, LinkSet
from simulator.errors import ConfigError, MemoryFitError
from simulator.hardware.engines import ServingEngineProfile, load_engine
from simulator.hardware.profiles import DeviceProfile, LinkProfile, Price
from simulator.hardware.registry import load_device, load_link
from simulator.models.arch import ModelConfig
from simulator.models.catalog import resolve_precisions
from simulator.runner.moe_build import comm_buffer_bytes, moe_cost_kwargs, redundant_experts
from simulator.runner.placement import Placement
from simulator.runner.scheduler_defaults import resolve_scheduler
from simulator.scenario.schema import PoolSpec, Scenario
from simulator.units import GIB


def keyed(exc: ConfigError, file: str | None, key: str) -> ConfigError:
    """Attribute ``exc`` to the scenario's key; a file it refers to goes in the message."""
    message = exc.message
    if exc.file is not None and exc.file != file:
        message = f"{message}: {exc.file}"
    return type(exc)(message, file=file or exc.file, key=exc.key or key)


def link_or_none(name: str | None, file: str | None, key: str) -> LinkProfile | None:
    if name is None:
        return None
    try:
        return load_link(name)
    except ConfigError as exc:
        raise keyed(exc, file, key) from None


def instance_links(placement: Placement, par: Parallelism, file: str | None,
                   key: str) -> LinkSet:
    """Links of an instance's collectives, from where its ranks sit.

    A stage's TP (and EP) group talks over the scale-up link when all its ranks share a
    scale-up domain, else over the scale-out network; PP activations cross the scale-out
    network when any two consecutive stages sit in different domains.
    """
    dev = placement.device
    up = link_or_none(dev.scale_up_link, file, f"{key}.device")
    out = link_or_none(dev.scale_out_link, file, f"{key}.device")

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
                 precision: str, util: float, convention: str = "device") -> str:
    """Why ``model`` leaves no KV cache on ``dev``: the need per device against the budget
    the engine's memory convention (``ServingEngineProfile.memory_fraction_of``) gives it.
    ``device`` and ``weights_and_kv``: ``util`` of the device holds the weights (and, for
    ``device``, the activations); ``free_after_weights``: the whole device does, ``util``
    being the share of what is left that goes to the KV cache."""
    need = mem.weight_bytes + mem.activation_bytes
    cap = dev.memory_capacity_gib
    if convention == "free_after_weights":
        verdict = f"but has {cap:.1f} GiB usable (the whole device) for them and the KV cache"
    elif convention == "weights_and_kv":
        verdict = (f"and the engine gives its weights and KV cache {cap * util:.1f} GiB usable "
                   f"({cap:g} GiB x {util:g}), too little for the weights alone")
    else:
        verdict = (f"but has {cap * util:.1f} GiB usable ({cap:g} GiB x {util:g}) for them and "
                   "the KV cache")
    return (
        f"{model.name} does not fit on {dev.name} with tp={par.tp} pp={par.pp}: each device "
        f"needs {mem.weight_bytes / GIB:.1f} GiB of {precision} weights + "
        f"{mem.activation_bytes / GIB:.1f} GiB activations/runtime = {need / GIB:.1f} GiB, "
        f"{verdict}; raise tp or pp, use lower-precision weights, or a larger device"
    )


@dataclass(frozen=True)
class ResolvedPool:
    """A pool with its profiles looked up and its parallelism made concrete."""

    pool: PoolSpec
    key: str
    device: DeviceProfile
    engine: ServingEngineProfile
    precisions: Precisions
    par: Parallelism
    block: int
    util: float


def plan_for(model: ModelConfig, r: ResolvedPool, par: Parallelism) -> MemoryPlan:
    sched = r.pool.scheduler
    probe = InstanceCostModel(model, r.device, par, r.precisions, probe_links(par),
                              **moe_cost_kwargs(r.pool, model, r.device, par, None, 1.0))
    plan = plan_memory(
        model, r.device, par, r.precisions, memory_utilization=r.util, block_size=r.block,
        max_batched_tokens=sched.limits[1], max_seqs=sched.limits[0],
        runtime_reserve_gib=r.engine.runtime_reserve_gib + r.engine.cuda_graph_reserve_gib,
        kv_elements_per_token_per_layer_device=probe.kv_elements_per_token_per_layer_device(),
        redundant_experts=redundant_experts(r.pool),
        comm_buffer_bytes=comm_buffer_bytes(r.pool.moe, model, par),
    )
    return apply_convention(plan, r.util, r.engine.memory_fraction_of, par.dp)


def probe_links(par: Parallelism) -> LinkSet:
    ideal = load_link("ideal")
    return LinkSet(tp=ideal if par.tp > 1 else None, pp=ideal if par.pp > 1 else None,
                   ep=ideal if par.ep > 1 else None)


def smallest_pp(model: ModelConfig, r: ResolvedPool, kv_tokens: int) -> tuple[int, MemoryPlan] | None:
    """Fewest pipeline stages whose devices hold the weights and ``kv_tokens`` of KV."""
    tp, ep = r.par.tp, r.par.ep
    per_device = r.device.memory_bytes * r.util
    lower = max(1, int(model.weight_bytes(r.precisions.weights) // (per_device * tp)))
    # Whole-layer stages stop at one layer per stage; balanced stages may split layers.
    most = model.num_layers * (8 if r.par.balanced_stages else 1)
    for pp in range(min(lower, most), most + 1):
        par = Parallelism(tp, pp, ep, r.par.balanced_stages, r.par.dp)
        mem = plan_for(model, r, par)
        if mem.weight_bytes + mem.activation_bytes < mem.usable_bytes and \
                mem.kv_capacity_tokens >= kv_tokens:
            return pp, mem
    return None


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
        raise keyed(exc, file, f"{key}.device") from None
    if pool.device_usd_per_hour is not None:
        dev = dev.model_copy(update={"price": Price(
            usd_per_hour=pool.device_usd_per_hour, date="scenario",
            source=f"scenario override ({key}.device_usd_per_hour)")})
    return dev


def resolve_pools(scenario: Scenario, model: ModelConfig, base_engine: ServingEngineProfile,
             file: str | None, base_dir: Path) -> list[ResolvedPool]:
    out = []
    for i, given in enumerate(scenario.cluster.pools):
        key = f"cluster.pools[{i}]"
        dev = pool_device(given, base_dir, file, key)
        engine = base_engine
        if given.engine is not None:
            try:
                engine = load_engine(given.engine)
            except ConfigError as exc:
                raise keyed(exc, file, f"{key}.engine") from None
        pool = given.model_copy(update={
            "scheduler": resolve_scheduler(given.scheduler, engine, file, key, dev,
                                           ranks=given.parallelism.dp)})
        prec = resolve_precisions(model, pool.precision, scenario.precision)
        precisions = Precisions(prec["weights"], prec["activations"], prec["kv_cache"])
        ps = pool.parallelism
        try:
            par = Parallelism(ps.tp, 1 if ps.pp == "auto" else ps.pp, ps.ep,
                              ps.layer_split == "balanced", ps.dp)
        except ValueError as exc:
            raise ConfigError(str(exc), file=file, key=f"{key}.parallelism") from None
        sched = pool.scheduler
        r = ResolvedPool(pool, key, dev, engine, precisions, par,
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
            r = ResolvedPool(pool, key, dev, engine, precisions, par, r.block, r.util)
        out.append(r)
    return out
