"""Declarative settings of the workload: arrival processes, length distributions, shared
prefixes, sessions and request classes (the scenario's ``workload`` section)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from simulator.engine.kv_config import Spec


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
    ramp_s: float = Field(0.0, ge=0, description=(
        "Clients start one by one over this many seconds instead of all at once, as aiperf "
        "`--concurrency-ramp-duration` does: one client at t = 0 and one more every "
        "ramp_s / (concurrency - 1) seconds, the last at ramp_s "
        "(ai-dynamo/aiperf:docs/tutorials/ramping.md); each phase (warm-up, measured) ramps "
        "again. 0 = all at once, aiperf's and `vllm bench serve`'s default."))


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
