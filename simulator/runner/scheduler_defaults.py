"""A pool's scheduler section made concrete: ``policy: engine`` becomes the serving
engine's policy, unset batch limits become the engine's defaults for the device and entry
point (``EngineScheduler.limits``: vLLM's ``EngineArgs`` defaults by device memory class,
TensorRT-LLM's LLM-API defaults, SGLang's server-args defaults by GPU memory; each in its
hardware_profiles/engines/*.yaml), an unset ``chunked_prefill`` becomes the engine's
default, and keys another policy reads are refused. This is
the one place a scenario's limits are resolved; everything downstream sees numbers."""

from __future__ import annotations

from simulator.engine.config import SchedulerSpec
from simulator.errors import ConfigError
from simulator.hardware.engines import ServingEngineProfile
from simulator.hardware.profiles import DeviceProfile

# Keys that only one policy reads (None = that policy's default).
_OWN_KEYS = {"capacity_scheduler_policy": "trtllm", "schedule_policy": "sglang",
             "init_new_token_ratio": "sglang"}


def resolve_scheduler(spec: SchedulerSpec, engine: ServingEngineProfile, file: str | None,
                      key: str, device: DeviceProfile | None = None,
                      ranks: int = 1) -> SchedulerSpec:
    """``spec`` with its policy and limits resolved for ``engine`` on ``device`` (an
    instance of ``ranks`` data-parallel attention ranks). Without a device, unset limits
    take the engine's device-independent defaults."""
    policy = engine.scheduler.policy if spec.policy == "engine" else spec.policy
    for name, owner in _OWN_KEYS.items():
        if getattr(spec, name) is not None and policy != owner:
            raise ConfigError(f"{name} applies to the {owner} policy only; this pool's "
                              f"scheduler policy is {policy} (set policy: {owner}, or drop "
                              f"{name})", file=file, key=f"{key}.scheduler.{name}")
    name, memory = (device.name, device.memory_capacity_gib) if device else ("", 0.0)
    seqs, tokens = engine.scheduler.limits(name, memory, spec.entry_point, spec.max_num_seqs,
                                           spec.max_num_batched_tokens, ranks)
    chunked = engine.scheduler.chunked_prefill if spec.chunked_prefill is None \
        else spec.chunked_prefill
    return spec.model_copy(update={"policy": policy, "max_num_seqs": seqs,
                                   "max_num_batched_tokens": tokens,
                                   "chunked_prefill": chunked})
