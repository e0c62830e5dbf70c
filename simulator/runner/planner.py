"""Capacity planner: the cheapest layouts that meet the SLO at a target request rate.

Given a model, a workload, SLOs, a target rate and the hardware allowed (device types,
how many, prices), the planner

1. enumerates *families*: colocated (one pool) or disaggregated (prefill + decode pools),
   each pool a device type with a TP x PP shape; shapes that cannot hold the model are
   rejected with the memory message;
2. estimates each pool's per-instance capacity (requests/s) with the cost model
   (``cost/``): prefill from the step time of a full prefill batch (``max_num_batched_tokens``
   of mean-length prompts), decode from the step time of the largest batch the KV cache and
   ``max_num_seqs`` allow; a pool whose single-prompt prefill misses the TTFT SLO, or whose
   one-sequence decode step misses TPOT, is rejected. The capacity is optimistic (full
   batches, no queueing), so ``ceil(target / capacity)`` instances is a lower bound: the
   search starts there, and families whose lower-bound cost is out of reach are pruned
   without being simulated;
3. simulates each surviving family at the target rate, starting from its lower bound and
   adding instances to the pool whose SLO is further from being met (TTFT -> prefill,
   TPOT -> decode) until SLO attainment reaches the target, the device limits are hit, or
   the family's best case costs more than the ``top`` cheapest feasible configurations
   found so far (branch and bound);
4. optionally finds each feasible configuration's goodput (highest rate still meeting the
   target, :mod:`simulator.runner.goodput`) for the cost vs goodput Pareto plot.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.config_io import read_yaml, validate
from simulator.cost.batch import BatchShape
from simulator.engine.config import RouterSpec, SchedulerSpec, WorkloadSpec
from simulator.engine.workload import sample_lengths
from simulator.errors import ConfigError
from simulator.hardware.profiles import DeviceProfile
from simulator.hardware.registry import load_device
from simulator.runner.build import build_plan
from simulator.runner.executors import Executor, make_executor
from simulator.runner.goodput import GoodputSpec
from simulator.runner.sweep import RunTask, execute_run, stable_hash
from simulator.scenario.schema import KVTransferSpec, PrecisionSpec, Scenario, SLOSpec


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareOption(_Spec):
    device: str = Field(description="Device profile name (or a device YAML path).")
    max_devices: int = Field(gt=0, description="Most devices of this type the plan may use.")
    usd_per_hour: float | None = Field(None, ge=0, description=(
        "Price per device-hour (default: the profile's dated price)."))


class PlanSpec(_Spec):
    """The plan file."""

    name: str = Field("plan", description="Plan name.")
    description: str = Field("", description="What is being planned.")
    model: str = Field(description="Catalog model name or path to a Hugging Face config.json.")
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec,  # type: ignore[arg-type]
                                     description="Precisions of weights, activations and KV.")
    engine: str = Field("vllm", description="Serving-engine profile.")
    workload: WorkloadSpec = Field(description=(
        "Lengths and arrival process; its rate is replaced by the target rate."))
    slo: SLOSpec = Field(description="Latency targets (at least one).")
    target_rate_per_s: float | None = Field(None, gt=0, description=(
        "Request rate to serve (default: the workload's rate_per_s)."))
    attainment: float = Field(0.9, gt=0, le=1, description=(
        "Share of requests that must meet every SLO."))
    hardware: list[HardwareOption] = Field(min_length=1, description="Allowed device types.")
    layouts: list[Literal["colocated", "disaggregated"]] = Field(
        ["colocated", "disaggregated"], min_length=1, description="Layouts to consider.")
    tp: list[int] = Field([1, 2, 4, 8], min_length=1, description="TP sizes to consider.")
    pp: list[int] = Field([1], min_length=1, description="PP sizes to consider.")
    mixed_devices: bool = Field(False, description=(
        "Allow prefill and decode pools on different device types."))
    max_instances_per_pool: int = Field(16, gt=0, description="Most instances in one pool.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec,  # type: ignore[arg-type]
                                     description="Batching settings of every pool.")
    router: RouterSpec = Field(default_factory=RouterSpec,  # type: ignore[arg-type]
                               description="Routing policies.")
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec,  # type: ignore[arg-type]
                                        description="KV hand-off (disaggregated layouts).")
    seed: int = Field(0, ge=0, description="Seed of every simulation.")
    top: int = Field(10, gt=0, description="How many feasible configurations to rank.")
    max_simulations_per_family: int = Field(10, gt=0, description=(
        "Most simulations spent growing one family before it is rejected."))
    goodput_search: bool = Field(True, description=(
        "Find each ranked configuration's goodput (for the Pareto plot)."))

    @model_validator(mode="after")
    def _check(self) -> PlanSpec:
        if self.slo.ttft_s is None and self.slo.tpot_s is None and self.slo.e2e_s is None:
            raise ValueError("give at least one SLO (slo.ttft_s, slo.tpot_s or slo.e2e_s)")
        if not hasattr(self.workload.arrival, "rate_per_s"):
            raise ValueError(f"the planner varies the request rate; arrival kind "
                             f"{self.workload.arrival.kind!r} has none (use poisson, gamma "
                             "or constant)")
        if any(t < 1 for t in self.tp) or any(p < 1 for p in self.pp):
            raise ValueError("tp and pp sizes must be >= 1")
        names = [h.device for h in self.hardware]
        if len(set(names)) < len(names):
            raise ValueError(f"hardware lists a device twice: {names}")
        return self

    @property
    def rate(self) -> float:
        return self.target_rate_per_s or float(self.workload.arrival.rate_per_s)  # type: ignore[union-attr]


@dataclass(frozen=True)
class Shape:
    device: str
    tp: int
    pp: int

    def text(self) -> str:
        return f"{self.device} TP{self.tp}" + (f"xPP{self.pp}" if self.pp > 1 else "")


@dataclass(frozen=True)
class Family:
    layout: str
    shapes: tuple[Shape, ...]  # colocated: (main,); disaggregated: (prefill, decode)

    @property
    def roles(self) -> tuple[str, ...]:
        return ("colocated",) if self.layout == "colocated" else ("prefill", "decode")

    def label(self, counts: tuple[int, ...] | None = None) -> str:
        parts = []
        for role, shape, n in zip(self.roles, self.shapes, counts or (None,) * 2, strict=False):
            tag = "" if role == "colocated" else f"{role[0].upper()} "
            parts.append(f"{tag}{f'{n}x ' if n else ''}{shape.text()}")
        return ("colocated " if self.layout == "colocated" else "") + " + ".join(parts)


@dataclass
class Candidate:
    family: Family
    counts: tuple[int, ...]
    cost_usd_per_hour: float
    devices: dict[str, int]
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlanResult:
    spec: PlanSpec
    ranked: pd.DataFrame
    """Configurations meeting the SLO at the target rate, cheapest first."""
    rejected: pd.DataFrame
    """One row per family that produced no feasible configuration, with the reason."""
    simulated: pd.DataFrame
    """Every simulation run, feasible or not."""
    best: Scenario | None
    feasible_count: int = 0
    """Feasible configurations found, ranked or not."""


# ----- building scenarios -------------------------------------------------------------
def scenario_of(spec: PlanSpec, family: Family, counts: tuple[int, ...],
                rate: float | None = None) -> Scenario:
    pools = [{"name": "main" if role == "colocated" else role, "role": role,
              "device": shape.device, "instances": n,
              "parallelism": {"tp": shape.tp, "pp": shape.pp},
              "scheduler": spec.scheduler.model_dump(mode="json")}
             for role, shape, n in zip(family.roles, family.shapes, counts, strict=True)]
    workload = spec.workload.model_dump(mode="json")
    workload["arrival"]["rate_per_s"] = rate or spec.rate
    return Scenario.model_validate({
        "name": f"{spec.name}: {family.label(counts)}",
        "seed": spec.seed, "model": spec.model, "engine": spec.engine,
        "precision": spec.precision.model_dump(mode="json"), "workload": workload,
        "cluster": {"pools": pools, "router": spec.router.model_dump(mode="json"),
                    "kv_transfer": spec.kv_transfer.model_dump(mode="json")},
        "slo": spec.slo.model_dump(mode="json"),
    })


def families(spec: PlanSpec) -> list[Family]:
    shapes = [Shape(h.device, tp, pp) for h in spec.hardware for tp in spec.tp for pp in spec.pp
              if tp * pp <= h.max_devices]
    out: list[Family] = []
    if "colocated" in spec.layouts:
        out += [Family("colocated", (s,)) for s in shapes]
    if "disaggregated" in spec.layouts:
        out += [Family("disaggregated", (p, d)) for p, d in itertools.product(shapes, shapes)
                if spec.mixed_devices or p.device == d.device]
    return out


# ----- cost-model estimates -------------------------------------------------------------
def _price(spec: PlanSpec, device: DeviceProfile, name: str) -> float:
    option = next(h for h in spec.hardware if h.device == name)
    if option.usd_per_hour is not None:
        return option.usd_per_hour
    if device.price is None:
        raise ConfigError(f"device {device.name} has no price in its profile; give "
                          "usd_per_hour", key=f"hardware.{name}")
    return device.price.usd_per_hour


def _mean_lengths(spec: PlanSpec) -> tuple[float, float]:
    rng = np.random.default_rng(spec.seed)
    w = spec.workload
    prompt = float(sample_lengths(w.input_tokens, rng, 8192).mean())  # type: ignore[arg-type]
    output = float(sample_lengths(w.output_tokens, rng, 8192).mean())  # type: ignore[arg-type]
    if w.shared_prefix is not None:
        prompt += w.shared_prefix.tokens * w.shared_prefix.fraction
    return prompt, output


def capacity(spec: PlanSpec, family: Family) -> tuple[list[float], str | None]:
    """Optimistic requests/s of one instance of each pool, or a reason the family fails."""
    from simulator.errors import MemoryFitError

    try:
        plan = build_plan(scenario_of(spec, family, (1,) * len(family.shapes)))
    except MemoryFitError as exc:
        return [], f"does not fit: {exc.message}"
    prompt, output = _mean_lengths(spec)
    caps: list[float] = []
    for role, pool in zip(family.roles, plan.pools, strict=True):
        cap = _pool_capacity(spec, role, pool, prompt, output)
        if isinstance(cap, str):
            return [], cap
        caps.append(cap)
    return caps, None


def _pool_capacity(spec: PlanSpec, role: str, pool: Any, prompt: float,
                   output: float) -> float | str:
    """Requests/s one instance of ``pool`` (a ``PoolPlan``) serves, or why it cannot."""
    sched, slo = spec.scheduler, spec.slo
    cost = pool.cost_models[0]
    pipelined = pool.parallelism.pp > 1  # throughput follows the slowest stage

    def seconds(batch: BatchShape) -> float:
        step = cost.step(batch)
        return step.slowest_stage_s if pipelined else step.seconds

    tokens = max(1, round(prompt))
    one_prefill = cost.step(BatchShape.prefill(tokens)).seconds
    if role != "decode" and slo.ttft_s is not None and one_prefill > slo.ttft_s:
        return (f"{role} pool: prefill of a mean prompt ({tokens} tokens) takes "
                f"{one_prefill * 1e3:.0f} ms alone, above the TTFT SLO")
    k = max(1, int(sched.max_num_batched_tokens // tokens))
    t_prefill = seconds(BatchShape.build([(tokens, 0, True)] * k)) / k
    ctx = prompt + output / 2  # a sequence's mean context over its decode
    b_max = max(1, min(sched.max_num_seqs, int(pool.memory.kv_capacity_tokens // ctx)))

    def t_decode(b: int) -> float:
        return seconds(BatchShape.decode(b, int(b * ctx)))

    if slo.tpot_s is not None and role != "prefill" and t_decode(1) > slo.tpot_s:
        return (f"{role} pool: one decode step of a single sequence takes "
                f"{t_decode(1) * 1e3:.1f} ms, above the TPOT SLO")
    # Largest batch memory and the scheduler allow: no instance decodes faster than this,
    # whatever the SLO (a TPOT-limited batch would not be a bound: the SLO is on a
    # percentile, so real batches may exceed it for some steps).
    decode_s_per_request = output * t_decode(b_max) / b_max
    if role == "prefill":
        return 1.0 / t_prefill
    if role == "decode":
        return 1.0 / decode_s_per_request
    # Colocated: chunked prefill lets decodes ride in prefill steps, so the two phases'
    # times overlap; neither can go faster than alone.
    return 1.0 / max(t_prefill, decode_s_per_request)


# ----- the search -----------------------------------------------------------------------
def _task(spec: PlanSpec, cand: Candidate, index: int, goodput: bool = False) -> RunTask:
    sc = scenario_of(spec, cand.family, cand.counts).model_dump(mode="json")
    gp = (GoodputSpec(target=spec.attainment, start_rate_per_s=spec.rate, rel_tol=0.05,
                      max_probes=10).model_dump(mode="json") if goodput else None)
    run_id = stable_hash(sc if gp is None else {"scenario": sc, "goodput": gp})
    return RunTask(run_id, run_id, index, spec.seed, {}, sc, str(Path.cwd()), None, False, gp)


class Planner:
    def __init__(self, spec: PlanSpec, executor: Executor) -> None:
        self.spec = spec
        self.executor = executor
        self.devices = {h.device: load_device(h.device) for h in spec.hardware}
        self.limits = {h.device: h.max_devices for h in spec.hardware}
        self.rejected: list[dict[str, Any]] = []
        self.simulated: list[Candidate] = []
        self.feasible: list[Candidate] = []

    def candidate(self, family: Family, counts: tuple[int, ...]) -> Candidate | None:
        devices: dict[str, int] = {}
        cost = 0.0
        for shape, n in zip(family.shapes, counts, strict=True):
            devices[shape.device] = devices.get(shape.device, 0) + n * shape.tp * shape.pp
            cost += n * shape.tp * shape.pp * _price(self.spec, self.devices[shape.device],
                                                     shape.device)
        if any(devices[d] > self.limits[d] for d in devices):
            return None
        if any(n > self.spec.max_instances_per_pool for n in counts):
            return None
        return Candidate(family, counts, cost, devices)

    def reject(self, family: Family, reason: str) -> None:
        self.rejected.append({"family": family.label(), "layout": family.layout,
                              "reason": reason})

    def bound(self) -> float:
        """Cost of the ``top``-th cheapest feasible configuration so far (inf if fewer)."""
        costs = sorted(c.cost_usd_per_hour for c in self.feasible)
        return costs[self.spec.top - 1] if len(costs) >= self.spec.top else math.inf

    def start(self, family: Family) -> Candidate | None:
        caps, reason = capacity(self.spec, family)
        if reason:
            self.reject(family, reason)
            return None
        counts = tuple(max(1, math.ceil(self.spec.rate / c)) for c in caps)
        cand = self.candidate(family, counts)
        if cand is None:
            need = {s.device: 0 for s in family.shapes}
            for s, n in zip(family.shapes, counts, strict=True):
                need[s.device] += n * s.tp * s.pp
            pools = ", ".join(f"{n} {role} instance(s) (<= {c:.3g} req/s each)"
                              for role, n, c in zip(family.roles, counts, caps, strict=True))
            self.reject(family, f"the cost model's capacity estimate needs at least {pools} "
                        f"= {', '.join(f'{n} {d}' for d, n in need.items())} for "
                        f"{self.spec.rate:g} req/s; limits: "
                        f"{', '.join(f'{self.limits[d]} {d}' for d in need)}, "
                        f"{self.spec.max_instances_per_pool} instances per pool")
        return cand

    def grow(self, cand: Candidate) -> Candidate | None:
        """The next candidate of a family that missed the target: grow the worse phase."""
        s, slo = cand.summary, self.spec.slo
        counts = list(cand.counts)
        if len(counts) == 1:
            pick = 0
        else:
            q = "p90" if self.spec.attainment <= 0.9 else "p99"
            ttft = s.get(f"ttft_{q}_s", math.inf) / (slo.ttft_s or math.inf)
            tpot = s.get(f"tpot_{q}_s", math.inf) / (slo.tpot_s or math.inf)
            e2e = s.get(f"e2e_{q}_s", math.inf) / (slo.e2e_s or math.inf)
            pick = 0 if ttft >= max(tpot, e2e) else 1
        counts[pick] += max(1, counts[pick] // 4)
        return self.candidate(cand.family, tuple(counts))

    def unfit_shapes(self) -> set[Shape]:
        """Shapes that cannot hold the model (weights, or the longest prompt's KV)."""
        from simulator.errors import MemoryFitError

        bad: set[Shape] = set()
        for shape in dict.fromkeys(s for f in families(self.spec) for s in f.shapes):
            try:
                build_plan(scenario_of(self.spec, Family("colocated", (shape,)), (1,)))
            except MemoryFitError as exc:
                bad.add(shape)
                self.rejected.append({"family": f"every pool on {shape.text()}",
                                      "layout": "any", "reason": f"does not fit: {exc.message}"})
        return bad

    def search(self) -> None:
        active: dict[Family, tuple[Candidate, int]] = {}
        unfit = self.unfit_shapes()
        for family in families(self.spec):
            if unfit & set(family.shapes):
                continue
            cand = self.start(family)
            if cand is not None:
                active[family] = (cand, 0)
        while active:
            bound = self.bound()
            for family, (cand, _) in list(active.items()):
                if cand.cost_usd_per_hour > bound:
                    self.reject(family, f"pruned: costs at least ${cand.cost_usd_per_hour:,.2f}/h "
                                f"({cand.family.label(cand.counts)}), more than the "
                                f"{self.spec.top} cheapest feasible configurations")
                    del active[family]
            batch = [_task(self.spec, cand, i) for i, (cand, _) in enumerate(active.values())]
            by_id = {t.run_id: fam for t, fam in zip(batch, list(active), strict=True)}
            for task, outcome in self.executor.map_unordered(execute_run, batch):
                family = by_id[task.run_id]
                cand, tries = active[family]
                row: dict[str, Any] = outcome[0] if isinstance(outcome, tuple) else {
                    "status": "failed", "error": str(outcome)}
                cand.summary = row
                self.simulated.append(cand)
                if row.get("status") != "ok":
                    self.reject(family, f"simulation failed: {row.get('error')}")
                    del active[family]
                elif float(row.get("slo_attainment", 0.0)) >= self.spec.attainment:
                    self.feasible.append(cand)
                    del active[family]
                elif tries + 1 >= self.spec.max_simulations_per_family:
                    self.reject(family, self._miss(cand, "after "
                                f"{tries + 1} simulations (max_simulations_per_family)"))
                    del active[family]
                else:
                    nxt = self.grow(cand)
                    if nxt is None:
                        self.reject(family, self._miss(cand, "at the device/instance limits"))
                        del active[family]
                    else:
                        active[family] = (nxt, tries + 1)

    def _miss(self, cand: Candidate, when: str) -> str:
        s = cand.summary
        return (f"SLO attainment {s.get('slo_attainment', 0):.0%} < {self.spec.attainment:.0%} "
                f"{when}, with {cand.family.label(cand.counts)}: TTFT p90 "
                f"{s.get('ttft_p90_s', math.nan) * 1e3:.0f} ms, TPOT p90 "
                f"{s.get('tpot_p90_s', math.nan) * 1e3:.1f} ms")

    def goodputs(self, ranked: list[Candidate]) -> dict[int, dict[str, Any]]:
        tasks = [_task(self.spec, c, i, goodput=True) for i, c in enumerate(ranked)]
        out: dict[int, dict[str, Any]] = {}
        for task, outcome in self.executor.map_unordered(execute_run, tasks):
            if isinstance(outcome, tuple):
                out[task.index] = outcome[0]
        return out


def _row(spec: PlanSpec, cand: Candidate) -> dict[str, Any]:
    s = cand.summary
    keep = ("slo_attainment", "goodput", "ttft_p90_s", "tpot_p90_s", "e2e_p90_s",
            "output_token_throughput", "cost_usd_per_1m_output_tokens", "energy_j_per_output_token")
    row: dict[str, Any] = {
        "label": cand.family.label(cand.counts), "layout": cand.family.layout,
        "devices": sum(cand.devices.values()), "cost_usd_per_hour": cand.cost_usd_per_hour,
        **{k: s.get(k, math.nan) for k in keep},
        "target_rate_per_s": spec.rate,
    }
    for role, shape, n in zip(cand.family.roles, cand.family.shapes, cand.counts, strict=True):
        row[f"{role}_device"], row[f"{role}_tp"] = shape.device, shape.tp
        row[f"{role}_pp"], row[f"{role}_instances"] = shape.pp, n
    # Planner prices may override profile prices: recompute $/1M tokens with them.
    tput = s.get("output_token_throughput", 0.0) or math.nan
    row["cost_usd_per_1m_output_tokens"] = cand.cost_usd_per_hour / (tput * 3600) * 1e6
    row["scenario_json"] = json.dumps(scenario_of(spec, cand.family, cand.counts)
                                      .model_dump(mode="json"), sort_keys=True)
    return row


def load_plan(path: str | Path) -> PlanSpec:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", file=str(path))
    return validate(PlanSpec, data, file=str(path))


def plan(spec: PlanSpec, *, executor: str = "local", workers: int | None = None,
         scheduler: str | None = None, file: str | None = None) -> PlanResult:
    """Search the layouts of ``spec``; see the module docstring for the method."""
    pool = make_executor(executor, workers, scheduler)
    try:
        planner = Planner(spec, pool)
        try:
            planner.search()
        except ConfigError as exc:
            raise exc.with_file(file or "") from None
        ranked = sorted(planner.feasible, key=lambda c: (
            c.cost_usd_per_hour, -c.summary.get("slo_attainment", 0.0), c.family.label(c.counts)))
        ranked = ranked[: spec.top]
        rows = [_row(spec, c) for c in ranked]
        if spec.goodput_search and ranked:
            for i, g in planner.goodputs(ranked).items():
                rows[i]["goodput_rate_per_s"] = g.get("goodput_rate_per_s", math.nan)
                rows[i]["goodput_rate_per_device"] = g.get("goodput_rate_per_device", math.nan)
    finally:
        pool.close()
    table = pd.DataFrame(rows)
    if len(table):
        table.insert(0, "rank", range(1, len(table) + 1))
    rejected = pd.DataFrame(planner.rejected, columns=["family", "layout", "reason"])
    simulated = pd.DataFrame([{**_row(spec, c), "feasible": c in planner.feasible}
                              for c in planner.simulated if c.summary.get("status") == "ok"])
    best = scenario_of(spec, ranked[0].family, ranked[0].counts) if ranked else None
    return PlanResult(spec, table, rejected.reset_index(drop=True), simulated, best,
                      len(planner.feasible))
