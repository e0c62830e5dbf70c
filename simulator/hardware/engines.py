"""Serving-engine profiles: what differs between vLLM, TensorRT-LLM and SGLang on the
same hardware (host overhead per step, KV block size, memory fraction), kept apart from
the device profile so that stays physical."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator

from simulator._paths import data_dir
from simulator.config_io import read_yaml, validate
from simulator.errors import ConfigError


class GraphCap(BaseModel):
    """One row of an engine's largest captured batch size by device memory and TP."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_memory_gib: float = Field(0.0, ge=0, description=(
        "Devices with at least this much runtime-visible memory match."))
    min_tp: int = Field(1, ge=1, description="Instances with at least this TP size match.")
    max_size: int = Field(gt=0, description="Largest captured batch size on a match.")


class CudaGraphSpec(BaseModel):
    """Which steps replay captured CUDA graphs, and the batch sizes captured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sizes: list[int] = Field(default_factory=list, description=(
        "Captured batch sizes listed one by one (ascending), e.g. [1, 2, 4]."))
    ranges: list[tuple[int, int, int]] = Field(default_factory=list, description=(
        "More captured sizes as [start, stop, step] ranges, stop inclusive, e.g. "
        "[[8, 248, 8], [256, 512, 16]]."))
    max_size_from_max_num_seqs: float | None = Field(None, gt=0, description=(
        "Cap the captured sizes at this multiple of the scheduler's max_num_seqs, as "
        "vLLM caps them at min(2 x max_num_seqs, 512)."))
    max_size_by_device: list[GraphCap] = Field(default_factory=list, description=(
        "Cap the captured sizes by device memory and TP size, the first matching row "
        "winning (SGLang's cuda_graph_max_bs default by GPU memory); empty = no cap."))
    mixed_steps: bool = Field(False, description=(
        "Steps with prefill tokens replay graphs too (vLLM V1 piecewise graphs over "
        "everything but attention, captured by token count); otherwise only decode-only "
        "steps do."))

    def captured(self, max_num_seqs: int | None = None, memory_gib: float | None = None,
                 tp: int = 1) -> tuple[int, ...]:
        """The captured sizes for an instance (``memory_gib`` None: no device cap)."""
        out = set(self.sizes)
        for start, stop, step in self.ranges:
            out.update(range(start, stop + 1, step))
        if max_num_seqs is not None and self.max_size_from_max_num_seqs is not None:
            cap = self.max_size_from_max_num_seqs * max_num_seqs
            out = {s for s in out if s <= cap}
        row = None if memory_gib is None else next(
            (r for r in self.max_size_by_device
             if memory_gib >= r.min_memory_gib and tp >= r.min_tp), None)
        if row is not None:
            out = {s for s in out if s <= row.max_size}
        return tuple(sorted(out))


class FrontendSpec(BaseModel):
    """Time the API server and the benchmark client add around the engine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    round_trip_us: float = Field(0.0, ge=0, description=(
        "Client-visible time outside the engine per request: HTTP request and response, "
        "tokenisation of the prompt, detokenisation and streaming of the first token, "
        "microseconds. Added to TTFT and E2E; also the closed-loop client's turnaround "
        "between a reply and the next request reaching the engine."))
    per_prompt_token_us: float = Field(0.0, ge=0, description=(
        "Client-visible time outside the engine per prompt token, microseconds: "
        "tokenising the prompt, sending its text, and priming the incremental "
        "detokeniser with it (vLLM's FastIncrementalDetokenizer decodes the whole "
        "prompt before the first token streams, vllm-project/vllm PR 51281). Added to "
        "round_trip_us wherever that is used."))
    jitter_cv: float = Field(0.0, ge=0, description=(
        "Coefficient of variation of that turnaround (gamma-distributed); it keeps "
        "closed-loop clients from staying in lock-step waves."))

    def seconds(self, prompt_tokens: int) -> float:
        """Client-visible time outside the engine of one request of ``prompt_tokens``."""
        return (self.round_trip_us + self.per_prompt_token_us * prompt_tokens) * 1e-6


class AllReduceNormFusion(BaseModel):
    """Where an engine runs the TP all-reduce fused with the residual add and RMSNorm after
    it (and the next GEMM's activation quantisation): one kernel where the model runs three."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    devices: list[str] | None = Field(None, min_length=1, description=(
        "Device profiles this rule covers (the engine fuses only on some architectures "
        "and fabrics); None = every device."))
    min_hidden_size: int = Field(1, ge=1, description=(
        "Smallest model hidden size the engine fuses at; below it the all-reduce and the "
        "norms run as their own kernels."))
    max_message_bytes_by_tp: dict[int, float] = Field(min_length=1, description=(
        "Largest all-reduce, bytes, the fused kernel takes, by tensor-parallel size (its "
        "workspace); a larger one runs as a plain all-reduce with the residual add and "
        "norm after it; 0 = not fused at that TP size. A TP size not listed takes the "
        "largest listed size below it; below every listed size nothing is fused."))

    @field_validator("max_message_bytes_by_tp")
    @classmethod
    def _sizes(cls, value: dict[int, float]) -> dict[int, float]:
        for tp, size in value.items():
            if tp < 2 or not size >= 0:
                raise ValueError(f"max_message_bytes_by_tp: tp {tp} -> {size}; allowed: "
                                 "tp >= 2 -> bytes >= 0 (0: not fused at that size)")
        return value

    def covers(self, device: str) -> bool:
        return self.devices is None or device in self.devices

    def max_message_bytes(self, tp: int, hidden_size: int) -> float:
        """The largest all-reduce fused at ``tp`` for a model of ``hidden_size`` (0: none)."""
        below = [t for t in self.max_message_bytes_by_tp if t <= tp]
        if tp < 2 or hidden_size < self.min_hidden_size or not below:
            return 0.0
        return float(self.max_message_bytes_by_tp[max(below)])


KernelEngine = Literal["vllm", "trtllm", "sglang"]
"""The engines whose measured kernels the device profiles' fits and the kernel tables hold."""

SchedulerPolicy = Literal["vllm_v1", "trtllm", "sglang", "continuous"]
"""Batching policies (simulator/engine/scheduler/): one per serving engine, and
``continuous``, the decode-first / prefill-first batching the simulator ran before."""


EntryPoint = Literal["api_server", "offline"]
"""How the engine is driven: its OpenAI-compatible API server (``vllm serve``, the
closed-loop and Poisson benchmarks) or the offline Python entry point (vLLM's ``LLM``
class: ``vllm bench latency`` / ``throughput``)."""


class BatchDefault(BaseModel):
    """One row of an engine's default batch limits by device class and entry point."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    entry_point: EntryPoint | None = Field(None, description=(
        "The entry point the row applies to; empty = every entry point (TensorRT-LLM and "
        "SGLang size their limits the same for the server and the offline API)."))
    min_memory_gib: float = Field(0.0, ge=0, description=(
        "Devices with at least this much runtime-visible memory (the device profile's "
        "memory_capacity_gib) match."))
    exclude_names: list[str] = Field(default_factory=list, description=(
        "Devices whose profile name contains one of these (case-insensitive) do not match."))
    max_num_seqs: int = Field(gt=0, description="Default max_num_seqs on a matching device.")
    max_num_batched_tokens: int = Field(gt=0, description=(
        "Default max_num_batched_tokens on a matching device."))

    def matches(self, device: str, memory_gib: float, entry_point: EntryPoint) -> bool:
        name = device.lower()
        return (self.entry_point in (None, entry_point) and memory_gib >= self.min_memory_gib
                and not any(x.lower() in name for x in self.exclude_names))


class EngineScheduler(BaseModel):
    """How an engine batches, and the batch limits a scenario gets when it sets none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: SchedulerPolicy = Field("continuous", description=(
        "The batching policy a scenario gets unless its scheduler section picks another."))
    defaults: list[BatchDefault] = Field(default_factory=list, description=(
        "Default limits by device class and entry point; the first matching row wins."))
    max_num_seqs: int = Field(256, gt=0, description="Default where no row matches.")
    max_num_batched_tokens: int = Field(8192, gt=0, description=(
        "Default where no row matches."))
    seqs_within_tokens: bool = Field(False, description=(
        "A default max_num_seqs is capped at max_num_batched_tokens (vLLM: "
        "min(default, max_num_batched_tokens))."))
    chunked_prefill: bool = Field(True, description=(
        "Whether a scenario that leaves scheduler.chunked_prefill unset chunks long "
        "prompts (vLLM V1: on; TensorRT-LLM: off, LLM API `enable_chunked_prefill`)."))
    defaults_per_rank: bool = Field(False, description=(
        "Defaults hold per data-parallel attention rank (vLLM: every DP rank is an engine "
        "core with its own limits), so an instance of dp ranks gets dp x the default."))

    def limits(self, device: str, memory_gib: float, entry_point: EntryPoint,
               max_num_seqs: int | None, max_num_batched_tokens: int | None,
               ranks: int = 1) -> tuple[int, int]:
        """(max_num_seqs, max_num_batched_tokens) of an instance: the given values, or
        the engine's defaults for the device and entry point where they are None."""
        row = next((r for r in self.defaults if r.matches(device, memory_gib, entry_point)),
                   None)
        seqs = row.max_num_seqs if row else self.max_num_seqs
        tokens = row.max_num_batched_tokens if row else self.max_num_batched_tokens
        scale = ranks if self.defaults_per_rank else 1
        tokens = max_num_batched_tokens if max_num_batched_tokens is not None \
            else tokens * scale
        if max_num_seqs is not None:
            return max_num_seqs, tokens
        seqs *= scale
        return (min(seqs, tokens) if self.seqs_within_tokens else seqs), tokens


class ServingEngineProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Profile name used in scenarios, e.g. `vllm`.")
    version: str = Field(description="Engine version the figures describe.")
    kernels: KernelEngine | None = Field(None, description=(
        "The engine whose measured kernels run this profile's operators: the key of the "
        "device profiles' fitted operator curves and of the measured kernel tables "
        "(`vllm`, `trtllm`, `sglang`). Empty = the profile's name; a profile that "
        "`extends` another takes the base's."))
    step_overhead_us: float = Field(ge=0, description=(
        "Host-side time per engine step that does not overlap GPU work: scheduling, input "
        "preparation, sampling, detokenisation, microseconds."))
    per_sequence_overhead_us: float = Field(0.0, ge=0, description=(
        "Extra host time per sequence in a step (bookkeeping, sampling), microseconds."))
    cuda_graphs: bool = Field(True, description=(
        "Decode steps replay captured CUDA graphs (kernel launches cost less)."))
    graph_launch_factor: float = Field(1.0, gt=0, le=1, description=(
        "Fraction of per-kernel launch cost left when a step replays a CUDA graph."))
    block_size: int = Field(gt=0, description="Default KV block size in tokens.")
    memory_utilization: float = Field(gt=0, le=1, description=(
        "Default fraction of device memory the engine may use."))
    memory_utilization_by_tp: dict[int, float] | None = Field(None, description=(
        "Default fraction by tensor-parallel size where the engine derives it from TP "
        "(SGLang mem_fraction_static, keyed by its tp_size, which with data-parallel "
        "attention counts every rank: tp x dp); a size not listed takes the largest listed "
        "size below it. None = memory_utilization at every size."))
    memory_fraction_of: Literal["device", "weights_and_kv", "free_after_weights"] = Field(
        "device", description=(
            "What memory_utilization is a fraction of: the whole device, weights and the "
            "activation peak included (vLLM gpu_memory_utilization); weights and the KV "
            "pool only, activations and CUDA graphs living outside it (SGLang "
            "mem_fraction_static); or the memory left after weights and the activation "
            "peak (TensorRT-LLM free_gpu_memory_fraction)."))
    runtime_reserve_gib: float = Field(ge=0, description=(
        "Memory held by the runtime outside weights, KV and activations (CUDA context, "
        "graphs, NCCL buffers), GiB per device."))
    per_layer_overhead_us: float = Field(0.0, ge=0, description=(
        "Exposed time per layer in every step, graph-replayed or not, that the operator "
        "model does not price (per-layer runtime work of an engine build the GPU waits "
        "for), microseconds."))
    per_layer_eager_us: float = Field(0.0, ge=0, description=(
        "Host launch gap per layer in steps that do not replay a CUDA graph (Python "
        "module dispatch and kernel launches the GPU waits for), microseconds."))
    async_overlap: float = Field(0.0, ge=0, le=1, description=(
        "Share of the host time that runs while the GPU computes the previous step "
        "(async / overlap scheduling); 0 = host and GPU strictly alternate, 1 = the "
        "step takes max(host, GPU)."))
    cuda_graph: CudaGraphSpec = Field(default_factory=CudaGraphSpec, description=(
        "Captured CUDA-graph batch sizes: a batch pads up to the next captured size, "
        "a larger one runs eagerly. Empty = every decode step replays a graph at its "
        "own size (no padding)."))
    allreduce_norm_fusion: list[AllReduceNormFusion] = Field(default_factory=list, description=(
        "Where the engine fuses the TP all-reduce with the residual add and RMSNorm after "
        "it by default: the first rule covering the device applies; none = they run as "
        "separate kernels."))
    cuda_graph_reserve_gib: float = Field(0.0, ge=0, description=(
        "Device memory the captured graphs hold, GiB per device (outside the KV pool)."))
    frontend: FrontendSpec = Field(default_factory=FrontendSpec, description=(
        "API-server and client time around the engine."))
    calibrated_on: str | None = Field(None, description=(
        "The declared calibration set any figure above was fitted on (file in "
        "scenarios/validation/); None = nothing fitted."))
    first_token: Literal["decode_recompute", "forwarded_after_transfer"] = Field(
        "decode_recompute", description=(
            "Disaggregated serving: where the client's first token comes from. "
            "`decode_recompute` (vLLM's P/D connectors): the decode instance recomputes the "
            "last prompt token once the KV has landed and emits token 1, so n output tokens "
            "take n decode steps there; `forwarded_after_transfer`: the prefill instance's "
            "token travels with the KV and reaches the client when the hand-off completes, "
            "and the decode instance produces tokens 2..n."))
    max_num_seqs_per: Literal["engine", "virtual_engine"] = Field("engine", description=(
        "What `max_num_seqs` caps under pipeline parallelism. `engine` (vLLM V1): the "
        "running requests of the whole instance, shared by the micro-batches in flight; "
        "`virtual_engine` (vLLM V0): each of the pp virtual engines has its own scheduler, "
        "so up to max_num_seqs x pp run."))
    scheduler: EngineScheduler = Field(default_factory=EngineScheduler, description=(
        "The engine's batching policy and its default limits by device class."))
    notes: str | None = Field(None, description="Caveats and assumptions.")
    source: list[str] = Field(min_length=1, description="Citations for the figures above.")

    @field_validator("memory_utilization_by_tp")
    @classmethod
    def _fractions(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is not None:
            for tp, share in value.items():
                if tp < 1 or not 0 < share <= 1:
                    raise ValueError(f"memory_utilization_by_tp: tp {tp} -> {share}; "
                                     "allowed: tp >= 1 -> a fraction in (0, 1]")
        return value

    def norm_fusion_bytes(self, device: str, tp: int, hidden_size: int) -> float:
        """The largest TP all-reduce fused with the norm after it on ``device`` at ``tp``
        for a model of ``hidden_size``, bytes (0: never fused)."""
        rule = next((r for r in self.allreduce_norm_fusion if r.covers(device)), None)
        return rule.max_message_bytes(tp, hidden_size) if rule is not None else 0.0

    @property
    def kernel_engine(self) -> str:
        """The engine whose fitted operator curves and kernel tables price this profile."""
        return self.kernels or self.name

    def memory_fraction(self, tp: int) -> float:
        """The default memory fraction at tensor-parallel size ``tp``."""
        by_tp = self.memory_utilization_by_tp
        if not by_tp:
            return self.memory_utilization
        below = [t for t in by_tp if t <= tp]
        return by_tp[max(below)] if below else self.memory_utilization


def _index() -> dict[str, Path]:
    folder = data_dir("hardware_profiles") / "engines"
    return {p.stem.lower(): p for p in sorted(folder.glob("*.yaml"))}


def engine_names() -> list[str]:
    return [load_engine(n).name for n in _index()]


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys on top; mappings present in both are merged the same
    way, anything else (lists included) is replaced."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _profile_data(path: Path, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """A profile file's mapping, with what it ``extends`` resolved: the base's keys under
    its own (:func:`_merge`), the base's ``kernels`` if it sets none, and the base's
    ``source`` list followed by its own."""
    data = read_yaml(path)
    if not isinstance(data, dict) or "extends" not in data:
        return data  # type: ignore[no-any-return]
    base_name = data.pop("extends")
    index = _index()
    if not isinstance(base_name, str) or base_name.lower() not in index:
        raise ConfigError(f"extends: {base_name!r} is not a shipped engine profile; shipped: "
                          f"{', '.join(index)}", file=str(path), key="extends")
    if base_name.lower() in seen:
        raise ConfigError(f"extends: {base_name!r} leads back to itself "
                          f"({' -> '.join((*seen, base_name.lower()))})",
                          file=str(path), key="extends")
    base_path = index[base_name.lower()]
    base = _profile_data(base_path, (*seen, base_name.lower()))
    if base.get("kernels") is None and base.get("name") in get_args(KernelEngine):
        base["kernels"] = base["name"]
    merged = _merge(base, data)
    # The base's sources still back what the child inherits; the child's add to them.
    sources = [*(base.get("source") or []), *(data.get("source") or [])]
    if sources:
        merged["source"] = list(dict.fromkeys(sources))
    return merged


@cache
def load_engine(name: str) -> ServingEngineProfile:
    path = Path(name)
    seen: tuple[str, ...] = ()  # a user's file may extend the profile it is named after
    if not (path.suffix in {".yaml", ".yml"} and path.is_file()):
        index = _index()
        if name.lower() not in index:
            raise ConfigError(
                f"unknown serving engine {name!r}; shipped: {', '.join(index) or 'none'}"
            )
        path, seen = index[name.lower()], (name.lower(),)
    return validate(ServingEngineProfile, _profile_data(path, seen), file=str(path))


def engine_ref(name: str, version: str | None = None) -> str:
    """What to pass to :func:`load_engine` for an engine at a version: the shipped
    ``<name>-<major.minor[.patch]>`` profile when there is one, else ``name`` itself (the
    engine's default profile, whose ``version`` says what it describes)."""
    if version:
        index = _index()
        parts = str(version).strip().lstrip("vV").split(".")
        for n in (3, 2, 1):
            key = f"{name}-{'.'.join(parts[:n])}".lower()
            if len(parts) >= n and key in index:
                return key
    return name


def load_engine_version(name: str, version: str | None = None) -> ServingEngineProfile:
    return load_engine(engine_ref(name, version))
