"""The scenario file: one YAML document, one pydantic model per section."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from simulator.engine.config import AutoscaleSpec, Fault, RouterSpec, SchedulerSpec
from simulator.engine.workload_spec import WorkloadSpec
from simulator.scenario.moe_spec import MoESpec
from simulator.scenario.speculative_spec import SpeculativeSpec
from simulator.units import Precision

MAX_POOL_DEVICES = 100_000
"""Most devices one pool may place (instances, or autoscale max_instances, x tp x pp)."""


class Spec(BaseModel):
    # No field means "unbounded" by infinity; NaN compares false with every bound.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ParallelismSpec(Spec):
    tp: int = Field(1, ge=1, description="Tensor-parallel degree (devices per stage).")
    pp: int | Literal["auto"] = Field(1, description=(
        "Pipeline-parallel stages, or `auto`: the fewest stages whose devices hold the "
        "weights and the pool's `kv_budget_tokens` (SRAM accelerators size this way)."))
    ep: int = Field(1, ge=1, description=(
        "Expert-parallel degree within a stage (divides tp; equals dp x tp with dp > 1)."))
    dp: int = Field(1, ge=1, description=(
        "Data-parallel attention ranks of `tp` devices each inside one instance: each rank "
        "holds its own requests and KV, the MoE layers run EP over all dp x tp devices "
        "with DeepEP all-to-alls (SGLang `--enable-dp-attention`). 1 = TP attention."))
    layer_split: Literal["whole_layers", "balanced"] = Field("whole_layers", description=(
        "`whole_layers`: each stage runs whole layers (vLLM PP); `balanced`: equal, "
        "possibly fractional shares, as a compiler that splits layers across chips does."))

    @model_validator(mode="after")
    def _ep_divides_tp(self) -> ParallelismSpec:
        if isinstance(self.pp, int) and self.pp < 1:
            raise ValueError(f"pp must be >= 1 or 'auto', got {self.pp}")
        if self.dp > 1:
            if self.ep != self.dp * self.tp:
                raise ValueError(f"with dp > 1, ep must equal dp x tp ({self.dp} x {self.tp} = "
                                 f"{self.dp * self.tp}), got ep={self.ep}")
        elif self.tp % self.ep:
            raise ValueError(f"ep ({self.ep}) must divide tp ({self.tp})")
        return self


class PrecisionSpec(Spec):
    """Unset fields follow the model's released precision (`disagg-sim profiles list`):
    DeepSeek-V3 runs fp8 weights and GEMM activations, most others bf16."""

    weights: Precision | None = Field(None, description=(
        "Weight storage precision (default: the model's released precision)."))
    activations: Precision | None = Field(None, description=(
        "Activation precision of GEMM inputs (default: fp8 with fp8 released weights, "
        "else the 16-bit type)."))
    kv_cache: Precision | None = Field(None, description=(
        "KV-cache precision (default: the model's 16-bit type)."))


class PlacementSpec(Spec):
    nodes_per_instance: int | None = Field(None, ge=1, description=(
        "Spread each instance over this many nodes (e.g. 2 to study a TP/EP group that "
        "crosses the network). Default: pack instances into as few nodes as possible."))


class PoolSpec(Spec):
    name: str = Field(min_length=1, description="Pool name (unique), used in results and sweeps.")
    role: Literal["colocated", "prefill", "decode"] = Field(
        "colocated", description="What the pool's instances do.")
    device: str = Field(description="Hardware profile name (see `disagg-sim profiles list`) "
                                    "or a path to a device YAML (relative to the scenario "
                                    "file).")
    device_usd_per_hour: float | None = Field(None, ge=0, description=(
        "Price of one of this pool's devices per hour, USD (default: the device profile's "
        "dated price); cost figures use it."))
    instances: int = Field(1, ge=1, description="Replicas (data parallel) in this pool.")
    parallelism: ParallelismSpec = Field(default_factory=ParallelismSpec,  # type: ignore[arg-type]
                                         description="TP/PP/EP of each instance.")
    scheduler: SchedulerSpec = Field(default_factory=SchedulerSpec,  # type: ignore[arg-type]
                                     description="Continuous-batching settings.")
    placement: PlacementSpec = Field(default_factory=PlacementSpec,  # type: ignore[arg-type]
                                     description="Where the pool's instances sit.")
    engine: str | None = Field(None, description=(
        "Serving-engine profile for this pool (default: the scenario's `engine`)."))
    precision: PrecisionSpec | None = Field(None, description=(
        "Precisions for this pool (default: the scenario's `precision`)."))
    kv_budget_tokens: int | None = Field(None, gt=0, description=(
        "KV tokens each instance must hold; with `parallelism.pp: auto` the stage count is "
        "sized for it, with a given pp it is checked."))
    moe_imbalance: float = Field(1.0, ge=1.0, description=(
        "Tokens routed to the busiest expert device relative to a uniform split (MoE); "
        "with a `moe.expert_load` other than uniform it is derived from it instead."))
    moe: MoESpec | None = Field(None, description=(
        "DeepEP all-to-all, two-batch overlap and expert load of MoE instances."))
    speculative: SpeculativeSpec | None = Field(None, description=(
        "Speculative decoding / MTP on this pool's decode steps."))
    autoscale: AutoscaleSpec | None = Field(None, description=(
        "Scale this pool on a load signal; `instances` is then the starting count."))

    @property
    def max_instances(self) -> int:
        return self.autoscale.max_instances if self.autoscale else self.instances

    @model_validator(mode="after")
    def _auto_needs_budget(self) -> PoolSpec:
        a = self.autoscale
        if a is not None and not a.min_instances <= self.instances <= a.max_instances:
            raise ValueError(f"instances ({self.instances}) must lie within autoscale "
                             f"min_instances..max_instances ({a.min_instances}..{a.max_instances})")
        if self.parallelism.pp == "auto" and self.kv_budget_tokens is None:
            raise ValueError("parallelism.pp: auto needs kv_budget_tokens (the KV tokens "
                             "each instance must hold)")
        pp = self.parallelism.pp if isinstance(self.parallelism.pp, int) else 1
        if self.moe is not None and self.moe_imbalance != 1.0 and \
                self.moe.expert_load.popularity != "uniform":
            raise ValueError("give either moe_imbalance or a moe.expert_load popularity, "
                             "not both (the imbalance follows from the popularity)")
        if self.moe is not None and self.moe.two_batch_overlap and self.parallelism.dp == 1:
            raise ValueError("moe.two_batch_overlap needs data-parallel attention "
                             "(parallelism.dp > 1): TP attention has no all-to-all to hide")
        devices = self.max_instances * self.parallelism.tp * pp * self.parallelism.dp
        if devices > MAX_POOL_DEVICES:  # every device is placed up front: bound the memory
            raise ValueError(f"{devices:,} devices (instances x tp x pp) in one pool; at most "
                             f"{MAX_POOL_DEVICES:,} are simulated per pool")
        return self


class KVTransferSpec(Spec):
    mode: Literal["bulk", "layerwise"] = Field("bulk", description=(
        "`bulk`: KV moves after prefill; `layerwise`: streams as layers finish."))
    link: str | None = Field(None, description=(
        "Force every hand-off onto this link profile (e.g. `ideal`); default: the path "
        "placement implies (NVLink inside a node, scale-out network across nodes)."))
    conversion_us_per_mb: float = Field(0.0, ge=0, description=(
        "Layout/precision conversion cost per MB of KV, microseconds."))
    conversion_us_per_token: float = Field(0.0, ge=0, description=(
        "Conversion cost per prompt token handed off, microseconds."))
    network: str | None = Field(None, description=(
        "Network link between different device kinds (GPU -> LPU), default `ethernet-100g`; "
        "the route also crosses both devices' host links."))
    spine_oversubscription: float | None = Field(None, ge=1, description=(
        "Oversubscription of the scale-out spine: each node's uplink carries its NICs' "
        "bandwidth divided by this factor (default: a non-blocking fat tree, no spine limit)."))


class ClusterSpec(Spec):
    pools: list[PoolSpec] = Field(min_length=1, description="Instance pools.")
    router: RouterSpec = Field(default_factory=RouterSpec,  # type: ignore[arg-type]
                               description="Routing policies.")
    kv_transfer: KVTransferSpec = Field(default_factory=KVTransferSpec,  # type: ignore[arg-type]
                                        description="KV hand-off between prefill and decode pools.")

    @model_validator(mode="after")
    def _roles(self) -> ClusterSpec:
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"pool names must be unique; repeated: {dupes}")
        roles = {p.role for p in self.pools}
        if "colocated" in roles and roles != {"colocated"}:
            raise ValueError("mixing colocated pools with prefill/decode pools is not supported")
        if "prefill" in roles and "decode" not in roles:
            raise ValueError("prefill pools need a decode pool to hand requests to")
        if "decode" in roles and "prefill" not in roles:
            raise ValueError("decode pools need a prefill pool to receive requests from")
        if self.router.conditional is not None and "decode" not in roles:
            raise ValueError("router.conditional chooses between prefill and decode pools; "
                             "this cluster has no decode pool")
        return self

    @property
    def disaggregated(self) -> bool:
        return any(p.role == "prefill" for p in self.pools)


class SLOSpec(Spec):
    ttft_s: float | None = Field(None, gt=0, description="Time-to-first-token target, seconds.")
    tpot_s: float | None = Field(None, gt=0, description="Time-per-output-token target, seconds.")
    e2e_s: float | None = Field(None, gt=0, description="End-to-end latency target, seconds.")


class SimulationSpec(Spec):
    max_time_s: float | None = Field(None, gt=0, description=(
        "Stop the clock here; requests not finished are reported as in flight."))
    fast_forward: bool = Field(True, description=(
        "Advance decode-only stretches in one computed jump (identical results)."))
    monitor_interval_s: float = Field(10.0, gt=0, description=(
        "Sampling interval of the monitoring time series (`RunResult.monitoring()`)."))
    record_steps: Literal["auto", "all", "stretches", "none"] = Field("auto", description=(
        "How steps are kept: `all` one row per step as it runs; `stretches` one compact "
        "row per fast-forward decode stretch (29 instead of 81 bytes a step), the steps "
        "frame expanded from them when read (identical to `all`); `none` the same compact "
        "records during the run and no steps frame in the result (no monitoring). "
        "`auto`: `stretches` for runs of more than 100,000 requests, else `all`. Every "
        "summary metric is the same under every setting."))


class CostSpec(Spec):
    predictor: Literal["auto", "roofline", "fitted", "tables"] = Field("auto", description=(
        "How step times are priced: `auto` (default: `fitted` on a device whose profile "
        "carries fitted per-operator constants, `roofline` on the others; the run summary's "
        "`cost_predictor` says which), `roofline` (device-wide efficiency factors), `fitted` "
        "(per-operator constants and the engine's measured all-reduce, fitted on measured "
        "kernel tables and stored in the device profiles; no extra dependency) or `tables` "
        "(NVIDIA AIConfigurator's measured kernel tables for the pool's device and engine, "
        "interpolated, with the fitted roofline outside their range; needs "
        "`pip install 'disagg-sim[kernels]'`)."))
    tables_version: str | None = Field(None, description=(
        "Engine version of the kernel tables (e.g. `0.24.0` for vLLM); newest when unset."))


class Scenario(Spec):
    name: str = Field("scenario", description="Scenario name.")
    description: str = Field("", description="What the scenario shows.")
    seed: int = Field(0, ge=0, description="Root seed of every random stream.")
    model: str = Field(description="Catalog model name or path to a Hugging Face config.json.")
    precision: PrecisionSpec = Field(default_factory=PrecisionSpec,  # type: ignore[arg-type]
                                     description="Precisions of weights, activations and KV.")
    engine: str = Field("vllm", description="Serving-engine profile (vllm, trtllm, sglang).")
    workload: WorkloadSpec = Field(description="Arrivals and lengths.")
    cluster: ClusterSpec = Field(description="Pools, routing and KV hand-off.")
    slo: SLOSpec = Field(default_factory=SLOSpec,  # type: ignore[arg-type]
                         description="Latency targets for SLO attainment and goodput.")
    faults: list[Fault] = Field(default_factory=list, description=(
        "Failures, link degradations and stragglers to inject."))
    simulation: SimulationSpec = Field(default_factory=SimulationSpec,  # type: ignore[arg-type]
                                       description="Clock and engine options.")
    cost: CostSpec = Field(default_factory=CostSpec,  # type: ignore[arg-type]
                           description="Which step-time predictor prices the steps.")

    _source: str | None = PrivateAttr(None)
    """The YAML file this scenario was loaded from (relative paths resolve against it)."""

    @property
    def source_file(self) -> str | None:
        return self._source

    def with_(self, **updates: Any) -> Scenario:
        """A copy with dotted-path updates, validated: ``s.with_(**{"seed": 3})``.

        Keys may be dotted paths (``"workload.arrival.rate_per_s"``) and may select a pool
        by name (``"cluster.pools.decode.instances"``).
        """
        from simulator.scenario.paths import apply_updates

        updated = apply_updates(self, updates)
        updated._source = self._source
        return updated
