"""Declarative settings of the engine's parts (scheduler, router, faults, autoscaling;
the workload's are in simulator/engine/workload_spec.py).

These are the YAML sections a scenario composes; they live here, beside the code that
reads them, so the engine depends on nothing above it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from simulator.engine.kv_config import ConditionalDisaggregation, KvRouterSpec, KvTierSpec, Spec


# ----- scheduler ---------------------------------------------------------------------
class SchedulerSpec(Spec):
    """Continuous batching of one instance: the serving engine's policy and its limits.

    Limits left out take the serving engine's defaults for the device (see its profile's
    ``scheduler`` section), or else the defaults below."""

    policy: Literal["engine", "vllm_v1", "trtllm", "sglang", "continuous"] = Field(
        "engine", description=(
            "Batching policy: `engine` = the serving engine profile's; `vllm_v1`, "
            "`trtllm`, `sglang` follow those engines' schedulers; `continuous` is the "
            "decode-first (chunked) / prefill-first batching of earlier releases."))
    max_num_seqs: int | None = Field(None, gt=0, description=(
        "Most requests running at once (vLLM max_num_seqs, TensorRT-LLM max_batch_size, "
        "SGLang max_running_requests). Unset: the serving engine's default for the device "
        "and entry point (vLLM: 1024 on GPUs with >= 70 GiB that are not A100s, else 256; "
        "TensorRT-LLM 2048; SGLang 2048)."))
    max_num_batched_tokens: int | None = Field(None, gt=0, description=(
        "Token budget of one step (vLLM max_num_batched_tokens, TensorRT-LLM "
        "max_num_tokens, SGLang chunked_prefill_size). Unset: the serving engine's default "
        "for the device and entry point (vLLM API server: 8192 on GPUs with >= 70 GiB that "
        "are not A100s, else 2048; offline LLM class: 16384 / 8192; TensorRT-LLM 8192; "
        "SGLang 8192 on GPUs with >= 25,000 MB, else 2048)."))
    entry_point: Literal["api_server", "offline"] = Field("api_server", description=(
        "How the engine is driven, for its default limits: the OpenAI-compatible API "
        "server (`vllm serve`) or the offline Python entry point (vLLM's LLM class, "
        "`vllm bench latency` / `throughput`)."))
    chunked_prefill: bool | None = Field(None, description=(
        "Split long prompts over steps. Off: a prompt runs whole (vLLM V1 and TensorRT-LLM "
        "stop admitting at one larger than the tokens left; `continuous` runs prefill-first "
        "and never mixes prefill and decode). SGLang always chunks. Unset: the serving "
        "engine's default (vLLM V1 on; TensorRT-LLM off, its `enable_chunked_prefill` "
        "default; `continuous` on)."))
    capacity_scheduler_policy: Literal["guaranteed_no_evict", "max_utilization"] | None = Field(
        None, description=(
            "TensorRT-LLM only (default `guaranteed_no_evict`): admit a request only if it "
            "can finish without eviction, or pack requests and pause (recompute) the "
            "latest when KV runs out (`max_utilization`)."))
    schedule_policy: Literal["lpm", "fcfs"] | None = Field(None, description=(
        "SGLang only (default `lpm`): order the queue longest prefix match first, or by "
        "arrival (`fcfs`)."))
    init_new_token_ratio: float | None = Field(None, gt=0, le=1, description=(
        "SGLang only (default 0.7): share of the remaining output tokens of running "
        "requests reserved when admitting; it decays to 0.14 x this over 600 decode steps."))
    block_size: int | None = Field(None, gt=0, description="KV block size in tokens "
                                                           "(default: the serving engine's).")
    memory_utilization: float | None = Field(None, gt=0, le=1, description=(
        "Fraction of device memory the engine may use (default: the serving engine's)."))
    prefix_caching: bool = Field(False, description=(
        "Keep the KV of finished prompts as a block-hash prefix cache (LRU eviction of "
        "unpinned blocks); a request whose prompt starts with cached blocks skips them."))
    preemption: Literal["recompute", "swap"] = Field("recompute", description=(
        "What happens to a decoding sequence evicted for lack of KV: `recompute` drops its "
        "KV and prefills it again; `swap` copies its KV blocks to the host-DRAM tier over "
        "PCIe and back when it is rescheduled (vLLM V0 `preemption_mode=swap`). `swap` "
        "needs a `dram` entry in kv_tiers (the host memory it swaps to)."))
    scheduling_policy: Literal["fcfs", "priority"] = Field("fcfs", description=(
        "vLLM `--scheduling-policy`: `fcfs` serves the waiting queue in arrival order and "
        "preempts the most recently admitted running request; `priority` orders the "
        "waiting queue by (class priority, arrival) and preempts the running request with "
        "the largest (priority, arrival) (vllm/v1/core/sched/scheduler.py, v0.10)."))
    kv_tiers: list[KvTierSpec] = Field(default_factory=list, description=(
        "KV tiers below HBM, fastest first (`dram`, then `ssd`, then `remote`): blocks the "
        "prefix cache evicts are offloaded to them and loaded back on a prefix hit instead "
        "of recomputed (vLLM's KV offloading connector, LMCache). Needs prefix_caching."))

    @property
    def limits(self) -> tuple[int, int]:
        """(max_num_seqs, max_num_batched_tokens) once resolved for the engine and device
        (simulator.runner.scheduler_defaults); an unresolved spec has none."""
        if self.max_num_seqs is None or self.max_num_batched_tokens is None:
            raise ValueError("scheduler limits are resolved by the runner for the engine "
                             "and device before an instance is built")
        return self.max_num_seqs, self.max_num_batched_tokens

    @property
    def chunked(self) -> bool:
        """chunked_prefill once resolved for the engine (simulator.runner.scheduler_defaults)."""
        if self.chunked_prefill is None:
            raise ValueError("chunked_prefill is resolved by the runner for the engine "
                             "before an instance is built")
        return self.chunked_prefill

    @model_validator(mode="after")
    def _tiers(self) -> SchedulerSpec:
        kinds = [t.kind for t in self.kv_tiers]
        if kinds and not self.prefix_caching:
            raise ValueError("kv_tiers needs prefix_caching: true (tiers hold prefix-cache "
                             "blocks the HBM cache evicts)")
        order = ["dram", "ssd", "remote"]
        if kinds != sorted(kinds, key=order.index) or len(set(kinds)) != len(kinds):
            raise ValueError(f"kv_tiers kinds {kinds}: each kind at most once, in the order "
                             "dram, ssd, remote")
        if self.preemption == "swap" and "dram" not in kinds:
            raise ValueError("preemption: swap needs a dram tier in kv_tiers (host memory to "
                             "swap KV blocks to)")
        return self


RoutingPolicy = Literal[
    "round_robin", "least_outstanding", "least_tokens", "power_of_two", "least_kv", "random",
    "prefix_affinity", "kv_aware",
]


class RouterSpec(Spec):
    policy: RoutingPolicy = Field("least_outstanding", description=(
        "How a new request picks a colocated or prefill instance."))
    decode_policy: RoutingPolicy = Field("least_kv", description=(
        "How a prefilled request picks a decode instance (disaggregated clusters)."))
    dispatch: Literal["push", "central_queue"] = Field("push", description=(
        "`push`: each request is sent to an instance on arrival (by `policy`); "
        "`central_queue`: requests wait in one queue at the router (`queue_policy`) and go to an instance "
        "only when it has a free sequence slot (a global scheduler; `policy` picks among "
        "instances with room)."))
    kv_router: KvRouterSpec = Field(default_factory=KvRouterSpec, description=(  # type: ignore[arg-type]
        "Settings of the `kv_aware` policy."))
    conditional: ConditionalDisaggregation | None = Field(None, description=(
        "P/D clusters: decide per request whether to prefill remotely or on the decode "
        "instance (empty: every request is prefilled remotely)."))

    queue_policy: Literal["fcfs", "priority"] = Field("fcfs", description=(
        "Order of the central queue: `fcfs` (arrival) or `priority` (class priority, then "
        "arrival), as a priority-aware gateway queue serves tenants."))

    @model_validator(mode="after")
    def _conditional_push(self) -> RouterSpec:
        if self.conditional is not None and self.dispatch == "central_queue":
            raise ValueError("conditional disaggregation decides at arrival: use dispatch: "
                             "push")
        return self


# ----- faults ------------------------------------------------------------------------
class InstanceFailure(Spec):
    kind: Literal["instance_failure"] = "instance_failure"
    target: str = Field(description="Instance name, `POOL/INDEX` (e.g. `decode/0`).")
    at_s: float = Field(ge=0, description="When it fails, simulated seconds.")
    duration_s: float | None = Field(None, gt=0, description=(
        "Down time before it recovers (empty KV, cold); empty = for good."))


class LinkDegradation(Spec):
    kind: Literal["link_degradation"] = "link_degradation"
    target: str = Field(description=(
        "Instance whose outgoing KV hand-off links degrade (its NICs), `POOL/INDEX`."))
    at_s: float = Field(ge=0, description="When the degradation starts.")
    duration_s: float | None = Field(None, gt=0, description="How long; empty = for good.")
    bandwidth_factor: float = Field(ge=0, le=1, description=(
        "Share of bandwidth left (0 = link down: transfers stall, or fail if for good)."))


class Straggler(Spec):
    kind: Literal["straggler"] = "straggler"
    target: str = Field(description="Instance name, `POOL/INDEX`.")
    at_s: float = Field(ge=0, description="When it slows down.")
    duration_s: float | None = Field(None, gt=0, description="How long; empty = for good.")
    slowdown: float = Field(gt=1, description="Every step takes this many times longer.")


class RandomFailures(Spec):
    kind: Literal["random_failures"] = "random_failures"
    pool: str = Field(description="Pool whose instances fail at random.")
    mtbf_s: float = Field(gt=0, description="Mean time between failures of one instance.")
    mttr_s: float = Field(gt=0, description="Mean time to repair (exponential).")


Fault = Annotated[
    InstanceFailure | LinkDegradation | Straggler | RandomFailures, Field(discriminator="kind")
]


# ----- autoscaling -------------------------------------------------------------------
ScalingSignal = Literal["queue_length", "ttft", "running", "kv_usage", "tpot"]


class AutoscaleSpec(Spec):
    """Scale a pool between bounds on a load signal, with cool-down and cold start."""

    min_instances: int = Field(1, ge=0, description="Fewest instances kept powered.")
    max_instances: int = Field(gt=0, description="Most instances (all are placed up front).")
    signal: ScalingSignal = Field(description=(
        "`queue_length` (waiting requests per instance), `ttft` (p90 of the last interval, "
        "s), `running` (sequences per instance), `kv_usage` (KV fraction), `tpot` (mean "
        "of the last interval, s)."))
    scale_out_above: float = Field(ge=0, description="Add an instance when the signal exceeds this.")
    scale_in_below: float = Field(ge=0, description="Drain an instance when the signal is below this.")
    proportional: bool = Field(False, description=(
        "Scale out by ceil(n x signal / scale_out_above) - n instances at once (as the "
        "Kubernetes HPA does) instead of one at a time."))
    interval_s: float = Field(10.0, gt=0, description="How often the policy looks.")
    cooldown_s: float = Field(60.0, ge=0, description="Quiet time after any scaling action.")
    load_bandwidth_gb_per_s: float = Field(5.0, gt=0, description=(
        "Rate at which a new instance loads its weights (storage/network), GB/s per device; "
        "cold start = weights per device / this + startup_s."))
    startup_s: float = Field(30.0, ge=0, description=(
        "Fixed start-up time of the serving engine (process, CUDA graphs), seconds."))

    @model_validator(mode="after")
    def _bounds(self) -> AutoscaleSpec:
        if self.min_instances > self.max_instances:
            raise ValueError(f"min_instances ({self.min_instances}) > max_instances "
                             f"({self.max_instances})")
        if self.scale_in_below >= self.scale_out_above:
            raise ValueError("scale_in_below must be lower than scale_out_above")
        return self
