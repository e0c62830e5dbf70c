"""The plan file and the planner's building blocks: shapes, families, candidates, and
the scenario each candidate simulates (:mod:`simulator.runner.planner` runs the search)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.config_io import read_yaml, validate
from simulator.engine.config import RouterSpec, SchedulerSpec
from simulator.engine.workload_spec import WorkloadSpec
from simulator.errors import ConfigError
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
    dp: list[int] = Field([1], min_length=1, description=(
        "Data-parallel attention ranks per instance to consider (MoE models: EP spans the "
        "dp x tp devices, e.g. [1, 16, 32]; 1 = TP attention). The scheduler limits are "
        "per attention rank and scale with dp."))
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
        for src in self.workload.sources:
            if not hasattr(src.arrival, "rate_per_s"):
                kind = src.arrival.kind if src.arrival is not None else None
                raise ValueError(f"the planner varies the request rate; arrival kind "
                                 f"{kind!r} has none (use poisson, gamma or constant)")
        if any(t < 1 for t in self.tp) or any(p < 1 for p in self.pp) or \
                any(d < 1 for d in self.dp):
            raise ValueError("tp, pp and dp sizes must be >= 1")
        names = [h.device for h in self.hardware]
        if len(set(names)) < len(names):
            raise ValueError(f"hardware lists a device twice: {names}")
        return self

    @property
    def rate(self) -> float:
        own = sum((float(getattr(src.arrival, "rate_per_s", 0.0))
                   for src in self.workload.sources), 0.0)
        return self.target_rate_per_s or own


@dataclass(frozen=True)
class Shape:
    device: str
    tp: int
    pp: int
    dp: int = 1

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    def text(self) -> str:
        if self.dp > 1:
            return f"{self.device} DP{self.dp}xEP{self.dp * self.tp}" + (
                f" (TP{self.tp} attention)" if self.tp > 1 else "")
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
    warnings: list[str] = field(default_factory=list)
    """Caveats on the whole plan (e.g. runs too short for steady state)."""


# ----- building scenarios -------------------------------------------------------------
def scenario_of(spec: PlanSpec, family: Family, counts: tuple[int, ...],
                rate: float | None = None) -> Scenario:
    pools = [{"name": "main" if role == "colocated" else role, "role": role,
              "device": shape.device, "instances": n,
              "parallelism": _parallelism(shape), "scheduler": _scheduler(spec, shape)}
             for role, shape, n in zip(family.roles, family.shapes, counts, strict=True)]
    workload = spec.workload.model_dump(mode="json")
    target = rate or spec.rate
    if workload.get("classes"):  # the traffic mix is kept: every class scales alike
        own = sum(c["arrival"]["rate_per_s"] for c in workload["classes"])
        for c in workload["classes"]:
            c["arrival"]["rate_per_s"] = c["arrival"]["rate_per_s"] * target / own
    else:
        workload["arrival"]["rate_per_s"] = target
    return Scenario.model_validate({
        "name": f"{spec.name}: {family.label(counts)}",
        "seed": spec.seed, "model": spec.model, "engine": spec.engine,
        "precision": spec.precision.model_dump(mode="json"), "workload": workload,
        "cluster": {"pools": pools, "router": spec.router.model_dump(mode="json"),
                    "kv_transfer": spec.kv_transfer.model_dump(mode="json")},
        "slo": spec.slo.model_dump(mode="json"),
    })


def _parallelism(shape: Shape) -> dict[str, int]:
    if shape.dp > 1:
        return {"tp": shape.tp, "dp": shape.dp, "ep": shape.dp * shape.tp}
    return {"tp": shape.tp, "pp": shape.pp}


def _scheduler(spec: PlanSpec, shape: Shape) -> dict[str, Any]:
    out = spec.scheduler.model_dump(mode="json")
    if shape.dp > 1:  # the instance's limits: one rank's, times the ranks
        for name in ("max_num_seqs", "max_num_batched_tokens"):
            if out[name] is not None:  # unset: the engine's default, resolved per device
                out[name] *= shape.dp
    return out


def families(spec: PlanSpec) -> list[Family]:
    shapes = [Shape(h.device, tp, pp, dp) for h in spec.hardware for tp in spec.tp
              for pp in spec.pp for dp in spec.dp
              if tp * pp * dp <= h.max_devices and (dp == 1 or pp == 1)]
    out: list[Family] = []
    if "colocated" in spec.layouts:
        out += [Family("colocated", (s,)) for s in shapes]
    if "disaggregated" in spec.layouts:
        out += [Family("disaggregated", (p, d)) for p, d in itertools.product(shapes, shapes)
                if spec.mixed_devices or p.device == d.device]
    return out



def load_plan(path: str | Path) -> PlanSpec:
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", file=str(path))
    return validate(PlanSpec, data, file=str(path))
