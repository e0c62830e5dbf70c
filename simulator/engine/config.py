"""Declarative settings of the engine's parts (workload, scheduler, router).

These are the YAML sections a scenario composes; they live here, beside the code that
reads them, so the engine depends on nothing above it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from simulator.engine.kv_config import ConditionalDisaggregation, KvRouterSpec, KvTierSpec


class Spec(BaseModel):
    # No field means "unbounded" by infinity; NaN compares false with every bound.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# ----- arrival processes -------------------------------------------------------------
class PoissonArrival(Spec):
    kind: Literal["poisson"] = "poisson"
    rate_per_s: float = Field(gt=0, description="Mean requests per second.")


class GammaArrival(Spec):
    kind: Literal["gamma"] = "gamma"
    rate_per_s: float = Field(gt=0, description="Mean requests per second.")
    cv: float = Field(ge=1e-3, le=1e3, description=(
        "Coefficient of variation of inter-arrival times (1 = Poisson, >1 bursty); "
        "0.001..1000 (use `constant` for evenly spaced arrivals)."))


class ConstantArrival(Spec):
    kind: Literal["constant"] = "constant"
    rate_per_s: float = Field(gt=0, description="Requests per second, evenly spaced.")


class OnOffArrival(Spec):
    kind: Literal["on_off"] = "on_off"
    on_rate_per_s: float = Field(gt=0, description="Poisson rate during ON periods.")
    off_rate_per_s: float = Field(0.0, ge=0, description="Poisson rate during OFF periods.")
    on_s: float = Field(gt=0, description="Length of an ON period, seconds.")
    off_s: float = Field(gt=0, description="Length of an OFF period, seconds.")

    @model_validator(mode="after")
    def _some_traffic(self) -> OnOffArrival:
        per_period = self.on_rate_per_s * self.on_s + self.off_rate_per_s * self.off_s
        if per_period < 1e-6:
            raise ValueError(f"on_rate_per_s*on_s + off_rate_per_s*off_s = {per_period:.3g} "
                             "arrivals per period; need at least 1e-6")
        return self


class ClosedLoop(Spec):
    kind: Literal["closed_loop"] = "closed_loop"
    concurrency: int = Field(gt=0, description="Clients, each with one request in flight "
                                               "(`vllm bench serve --max-concurrency`).")
    think_time_s: float = Field(0.0, ge=0, description="Pause between a reply and the next request.")
    turnaround_s: float = Field(0.0, ge=0, description=(
        "Mean client and frontend time between a reply's last token and the client's next "
        "request reaching the engine (HTTP, detokenisation, tokenisation), seconds."))
    turnaround_cv: float = Field(0.0, ge=0, description=(
        "Coefficient of variation of that turnaround (gamma-distributed, one draw per "
        "request). Real clients and API servers never answer in exactly the same time, so "
        "closed-loop clients drift apart instead of staying in lock-step waves."))
    warmup_requests: int = Field(0, ge=0, description=(
        "Requests sent first at the same concurrency and left out of the results, as "
        "`vllm bench serve --num-warmups` and aiperf `--warmup-request-count` do; the "
        "measured requests start when the last warm-up has ended (aiperf waits for every "
        "warm-up response before profiling, ai-dynamo/aiperf:docs/tutorials/warmup.md)."))


class AllAtOnce(Spec):
    kind: Literal["all_at_once"] = "all_at_once"


class TraceArrival(Spec):
    kind: Literal["trace"] = "trace"
    path: str = Field(description="CSV in the Azure LLM trace format (TIMESTAMP, "
                                  "ContextTokens, GeneratedTokens) or Mooncake JSONL; "
                                  "relative paths are resolved against the scenario file.")
    time_scale: float = Field(1.0, gt=0, description="Multiply inter-arrival gaps by this "
                                                     "(0.5 = twice the rate).")
    start_s: float = Field(0.0, ge=0, description="Skip the trace's first seconds.")
    skip_bad_rows: bool = Field(False, description=(
        "Leave out rows with bad values (counted in the summary as `trace_rows_skipped`) "
        "instead of stopping at the first; `run --skip-bad-rows` sets it."))


Arrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | OnOffArrival | ClosedLoop | AllAtOnce
    | TraceArrival,
    Field(discriminator="kind"),
]


# ----- length distributions ----------------------------------------------------------
class FixedLength(Spec):
    kind: Literal["fixed"] = "fixed"
    tokens: int = Field(gt=0, description="Every request has this many tokens.")


class UniformLength(Spec):
    kind: Literal["uniform"] = "uniform"
    min_tokens: int = Field(gt=0, description="Smallest length (inclusive).")
    max_tokens: int = Field(gt=0, description="Largest length (inclusive).")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) > max_tokens ({self.max_tokens})")
        return self


class LognormalLength(Spec):
    kind: Literal["lognormal"] = "lognormal"
    mean_tokens: float = Field(gt=0, description="Mean length.")
    cv: float = Field(gt=0, description="Coefficient of variation (std / mean).")
    min_tokens: int = Field(1, gt=0, description="Lengths are clipped to at least this.")
    max_tokens: int = Field(131072, gt=0, description="Lengths are clipped to at most this.")

    @model_validator(mode="after")
    def _ordered(self) -> LognormalLength:
        if self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens ({self.min_tokens}) > max_tokens ({self.max_tokens})")
        return self


class EmpiricalLength(Spec):
    kind: Literal["empirical"] = "empirical"
    values: list[int] = Field(min_length=1, description="Lengths to sample from.")
    weights: list[float] | None = Field(None, description="Relative weights (default equal).")

    @model_validator(mode="after")
    def _weights(self) -> EmpiricalLength:
        if any(v <= 0 for v in self.values):
            raise ValueError("values must all be > 0")
        if self.weights is not None:
            if len(self.weights) != len(self.values):
                raise ValueError("weights must have one entry per value")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        return self


Length = Annotated[
    FixedLength | UniformLength | LognormalLength | EmpiricalLength, Field(discriminator="kind")
]


class SharedPrefix(Spec):
    """A synthetic shared prefix (system prompt) on a fraction of requests."""

    tokens: int = Field(gt=0, description="Length of the shared prefix.")
    groups: int = Field(1, gt=0, description="Distinct prefixes; requests pick one uniformly.")
    fraction: float = Field(1.0, ge=0, le=1, description="Share of requests that carry one.")


class SessionSpec(Spec):
    """Multi-turn conversations (chat sessions): each arrival starts one.

    Turn k's prompt is every earlier turn's prompt and reply plus a new user message
    (``input_tokens``); its reply is ``output_tokens`` long. The conversation's hash
    blocks are chained from its first token, so a turn can reuse the KV of its own
    history, as vLLM's block hashes (each block's hash covers its parent's) allow.
    """

    turns: Length = Field(description="Turns per session.")
    think_time_s: float = Field(0.0, ge=0, description=(
        "Mean time between a reply's last token and the next turn (exponential); 0 = "
        "the next turn follows at once."))


OpenLoopArrival = Annotated[
    PoissonArrival | GammaArrival | ConstantArrival | OnOffArrival | AllAtOnce,
    Field(discriminator="kind"),
]


class ClassSLO(Spec):
    """Latency targets of one request class (each empty target is not checked)."""

    ttft_s: float | None = Field(None, gt=0, description="Time to first token, seconds.")
    tpot_s: float | None = Field(None, gt=0, description="Time per output token, seconds.")
    e2e_s: float | None = Field(None, gt=0, description="End-to-end latency, seconds.")


class RequestClass(Spec):
    """One tenant / traffic class: its own arrivals, lengths, SLOs, priority and limits."""

    name: str = Field(min_length=1, description="Class name (the `class` column of results).")
    arrival: OpenLoopArrival = Field(description=(
        "How this class's requests arrive (open loop: poisson, gamma, constant, on_off, "
        "all_at_once)."))
    input_tokens: Length = Field(description="Prompt lengths.")
    output_tokens: Length = Field(description="Output lengths.")
    num_requests: int | None = Field(None, gt=0, description=(
        "Stop this class after this many requests (retries not counted)."))
    duration_s: float | None = Field(None, gt=0, description=(
        "Stop issuing this class after this time (default: the workload's duration_s)."))
    shared_prefix: SharedPrefix | None = Field(None, description="Optional shared prefixes.")
    priority: int = Field(0, description=(
        "Scheduling priority, smaller = served first (vLLM `--scheduling-policy priority`: "
        "the waiting queue is ordered by (priority, arrival)); used where "
        "scheduler.scheduling_policy or router.queue_policy is `priority`."))
    slo: ClassSLO | None = Field(None, description=(
        "This class's latency targets (default: the scenario's `slo`)."))
    max_outstanding: int | None = Field(None, gt=0, description=(
        "Admission limit: most requests of this class in the cluster at once; one more is "
        "shed (status `shed`) at arrival. Empty = no limit."))
    timeout_s: float | None = Field(None, gt=0, description=(
        "Client timeout from a request's arrival: a request not finished by then is "
        "cancelled wherever it is (status `cancelled`) and its KV is freed. Empty = none."))
    retries: int = Field(0, ge=0, description=(
        "New attempts a client makes after a timeout or a shed (each a new request linked "
        "to the first by `root_id`)."))
    retry_backoff_s: float = Field(1.0, ge=0, description=(
        "Wait before the n-th retry: retry_backoff_s x 2^(n-1) seconds (exponential "
        "backoff, no jitter)."))


class WorkloadSpec(Spec):
    arrival: Arrival | None = Field(None, description=(
        "How requests arrive (one class; omit when `classes` is given)."))
    input_tokens: Length | None = Field(None, description="Prompt lengths (not for traces).")
    output_tokens: Length | None = Field(None, description="Output lengths (not for traces).")
    num_requests: int | None = Field(None, gt=0, description=(
        "Stop after this many requests (with `classes`: first attempts of all classes "
        "together; a class's own draws do not depend on it, but which of them are issued "
        "does)."))
    duration_s: float | None = Field(None, gt=0, description="Stop issuing after this time.")
    shared_prefix: SharedPrefix | None = Field(None, description="Optional shared prefixes.")
    sessions: SessionSpec | None = Field(None, description=(
        "Multi-turn conversations: the arrival process starts sessions, each issues its "
        "turns one after another; `num_requests` bounds the turns of all sessions, "
        "`duration_s` the session starts."))
    prefix_block_tokens: int = Field(512, gt=0, description=(
        "Tokens per prefix hash block (Mooncake traces: 512); prefix caching reuses whole "
        "blocks."))
    classes: list[RequestClass] | None = Field(None, min_length=1, description=(
        "Request classes (tenants), each with its own arrivals, lengths, SLOs, priority "
        "and limits, and its own random streams (seeded by the run seed and the class "
        "name). Without it the workload is one class named `default`, which is what a "
        "class of that name is."))

    @model_validator(mode="after")
    def _bounded(self) -> WorkloadSpec:
        if self.classes is not None:
            return self._check_classes()
        if self.arrival is None:
            raise ValueError("give `arrival` (one class) or `classes`")
        is_trace = self.arrival.kind == "trace"
        if not is_trace and (self.input_tokens is None or self.output_tokens is None):
            raise ValueError("input_tokens and output_tokens are required unless arrival is a trace")
        if not is_trace and self.num_requests is None and self.duration_s is None:
            raise ValueError("bound the workload with num_requests or duration_s")
        if self.arrival.kind in {"all_at_once", "closed_loop"} and self.num_requests is None:
            raise ValueError(f"a {self.arrival.kind} workload needs num_requests")
        if self.sessions is not None:
            if self.arrival.kind in {"trace", "closed_loop"}:
                raise ValueError(f"sessions start from an open-loop arrival process, not "
                                 f"{self.arrival.kind} (a trace carries its own hash ids)")
            if self.shared_prefix is not None:
                raise ValueError("sessions and shared_prefix cannot be combined: a session's "
                                 "hash chain starts at its first token")
        return self

    def _check_classes(self) -> WorkloadSpec:
        assert self.classes is not None
        single = [k for k in ("arrival", "input_tokens", "output_tokens", "shared_prefix",
                              "sessions") if getattr(self, k) is not None]
        if single:
            raise ValueError(f"with `classes`, give {', '.join(single)} per class, not at "
                             "the workload level (workload.duration_s and num_requests may "
                             "bound them all)")
        names = [c.name for c in self.classes]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"class names must be unique; repeated: {twice}")
        for i, c in enumerate(self.classes):
            if (c.num_requests is None and c.duration_s is None and self.duration_s is None
                    and self.num_requests is None):
                raise ValueError(f"classes[{i}] ({c.name}): bound it with num_requests or "
                                 "duration_s (or set workload.duration_s)")
            if (c.arrival.kind == "all_at_once" and c.num_requests is None
                    and self.num_requests is None):
                raise ValueError(f"classes[{i}] ({c.name}): an all_at_once class needs "
                                 "num_requests")
        return self

    @property
    def is_trace(self) -> bool:
        return self.arrival is not None and self.arrival.kind == "trace"

    @property
    def sources(self) -> list[WorkloadSpec | RequestClass]:
        """What issues requests: the classes, or the workload itself (one class)."""
        return list(self.classes) if self.classes is not None else [self]


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
        "and entry point (vLLM: 1024 on GPUs with >= 70 GiB that are not A100s, else 256)."))
    max_num_batched_tokens: int | None = Field(None, gt=0, description=(
        "Token budget of one step (vLLM max_num_batched_tokens, TensorRT-LLM "
        "max_num_tokens, SGLang chunked_prefill_size). Unset: the serving engine's default "
        "for the device and entry point (vLLM API server: 8192 on GPUs with >= 70 GiB that "
        "are not A100s, else 2048; offline LLM class: 16384 / 8192)."))
    entry_point: Literal["api_server", "offline"] = Field("api_server", description=(
        "How the engine is driven, for its default limits: the OpenAI-compatible API "
        "server (`vllm serve`) or the offline Python entry point (vLLM's LLM class, "
        "`vllm bench latency` / `throughput`)."))
    chunked_prefill: bool = Field(True, description=(
        "Split long prompts over steps. Off: a prompt runs whole (vLLM V1 and TensorRT-LLM "
        "stop admitting at one larger than the tokens left; `continuous` runs prefill-first "
        "and never mixes prefill and decode). SGLang always chunks."))
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
