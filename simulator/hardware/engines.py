"""Serving-engine profiles: what differs between vLLM, TensorRT-LLM and SGLang on the
same hardware (host overhead per step, KV block size, memory fraction), kept apart from
the device profile so that stays physical."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from simulator._paths import data_dir
from simulator.config_io import load_model
from simulator.errors import ConfigError


class ServingEngineProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Profile name used in scenarios, e.g. `vllm`.")
    version: str = Field(description="Engine version the figures describe.")
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
    runtime_reserve_gib: float = Field(ge=0, description=(
        "Memory held by the runtime outside weights, KV and activations (CUDA context, "
        "graphs, NCCL buffers), GiB per device."))
    first_token: Literal["decode_recompute", "forwarded_after_transfer"] = Field(
        "decode_recompute", description=(
            "Disaggregated serving: where the client's first token comes from. "
            "`decode_recompute` (vLLM's P/D connectors): the decode instance recomputes the "
            "last prompt token once the KV has landed and emits token 1, so n output tokens "
            "take n decode steps there; `forwarded_after_transfer`: the prefill instance's "
            "token travels with the KV and reaches the client when the hand-off completes, "
            "and the decode instance produces tokens 2..n."))
    notes: str | None = Field(None, description="Caveats and assumptions.")
    source: list[str] = Field(min_length=1, description="Citations for the figures above.")


def _index() -> dict[str, Path]:
    folder = data_dir("hardware_profiles") / "engines"
    return {p.stem.lower(): p for p in sorted(folder.glob("*.yaml"))}


def engine_names() -> list[str]:
    return [load_engine(n).name for n in _index()]


@cache
def load_engine(name: str) -> ServingEngineProfile:
    path = Path(name)
    if path.suffix in {".yaml", ".yml"} and path.is_file():
        return load_model(ServingEngineProfile, path)
    index = _index()
    if name.lower() not in index:
        raise ConfigError(
            f"unknown serving engine {name!r}; shipped: {', '.join(index) or 'none'}"
        )
    return load_model(ServingEngineProfile, index[name.lower()])
